"""The Prefect wiring, kept thin: one flow run per pipeline run, one task per stage, a Markdown artifact each."""
from __future__ import annotations

import re
from typing import Any, Callable

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NONE

from trtflow.errors import StageFailed, TransientStageError, TrtflowError
from trtflow.flows.fingerprint import describe
from trtflow.flows.runner import Runner, StageOutcome
from trtflow.pipelines.loader import load_pipeline
from trtflow.stages import progress

# Called with (event, stage name, payload) as stages start and finish; the CLI listens here.
LISTENERS: list[Callable[[str, str, Any], None]] = []


def _notify(event: str, name: str, payload: Any = None) -> None:
    for listener in LISTENERS:
        listener(event, name, payload)


def _retry_unless_user_error(task, task_run, state) -> bool:
    # A TrtflowError (bad input, bad parameters, a failed verdict) fails the same way every time: retrying only
    # wastes time. A crash or a timeout may not happen again.
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, TransientStageError) or not isinstance(exc, TrtflowError)


def artifact_key(pipeline: str, stage: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", f"{pipeline}-{stage}".lower()).strip("-")


def _progress_artifact(key: str, stage: str) -> Callable[[str, int, int], None]:
    """A Prefect progress artifact for a stage's long work, updated every 5%."""
    state: dict[str, Any] = {}

    def on_progress(what: str, done: int, total: int) -> None:
        pct = 100.0 * done / max(total, 1)
        if "id" not in state:
            state["id"] = create_progress_artifact(progress=pct, key=f"{key}-progress",
                                                   description=f"trtflow stage {stage}: {what}")
            state["last"] = pct
        elif pct - state["last"] >= 5 or done == total:
            update_progress_artifact(state["id"], progress=pct)
            state["last"] = pct

    return on_progress


@task(cache_policy=NONE, persist_result=False)
def stage_task(runner: Runner, name: str, produced: dict[str, dict[str, Any]],
               force: list[str] | None) -> StageOutcome:
    key = artifact_key(runner.pipeline.spec.name, name)
    listener = _progress_artifact(key, name)
    progress.LISTENERS.append(listener)
    try:
        outcome = runner.run_stage(name, produced, force)
    except StageFailed as exc:  # the verdict is failure, but its report is worth showing
        create_markdown_artifact(key=key, markdown=f"**failed** · stage `{name}` · {exc}\n\n{exc.result.summary}",
                                 description=f"trtflow stage {name}: failed")
        raise
    finally:
        progress.LISTENERS.remove(listener)
    env = describe(outcome.manifest["key_parts"].get("env"))
    header = (f"**{outcome.status}** · stage `{name}` ({outcome.kind}) · key `{outcome.key[:12]}`"
              f" · {outcome.reason}" + (f" · environment: {env}" if env != "-" else "") + "\n\n")
    create_markdown_artifact(key=key, markdown=header + outcome.summary,
                             description=f"trtflow stage {name}: {outcome.status}")
    return outcome


@flow(name="trtflow", persist_result=False, log_prints=True)
def pipeline_flow(pipeline_file: str, overrides: list[str] | None = None, stages: list[str] | None = None,
                  force: list[str] | None = None, store: str | None = None) -> list[dict[str, Any]]:
    """Run a trtflow pipeline file: every declared stage, reusing those whose key is already published."""
    runner = make_runner(pipeline_file, overrides, store)
    produced: dict[str, dict[str, Any]] = {}
    results = []
    for name in runner.select(stages):
        spec = runner.graph.nodes[name].spec
        _notify("start", name)
        run = stage_task.with_options(name=name, task_run_name=name, retries=spec.retries,
                                      retry_delay_seconds=spec.retry_delay,
                                      retry_condition_fn=_retry_unless_user_error)
        try:
            outcome = run(runner, name, produced, force)
        except BaseException as exc:
            _notify("fail", name, exc)
            raise
        produced[name] = outcome.manifest
        _notify("done", name, outcome)
        results.append({"stage": name, "status": outcome.status, "key": outcome.key,
                        "directory": str(outcome.directory), "seconds": round(outcome.seconds, 3),
                        "work_seconds": round(outcome.work_seconds, 3), "reason": outcome.reason})
    return results


def make_runner(pipeline_file: str, overrides: list[str] | None, store: str | None) -> Runner:
    from pathlib import Path

    from trtflow.flows.store import LocalStore

    loaded = load_pipeline(pipeline_file, overrides)
    root = Path(store).resolve() if store else loaded.store_root
    runner = Runner(loaded, store=LocalStore(root))
    runner.store.ensure_writable()
    return runner
