"""The watcher flow a deployment runs on a schedule or on `trtflow.environment.changed`: each pipeline is checked
against this machine's environment; a pipeline with something stale is run, which re-runs exactly the stale stages
and what depends on them (everything else is reused by key); every engine built emits `trtflow.engine.rebuilt`.

Relative paths resolve against the flow run's working directory: the deployment's (`set_working_directory` in
`prefect.yaml`), named in every error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from pydantic import BaseModel

from trtflow.errors import SpecError, TrtflowError
from trtflow.events import Event
from trtflow.flows.results import StageReport
from trtflow.pipelines.loader import parse_yaml
from trtflow.stages.trt.engines import built_engines

ENGINE_EVENT = "trtflow.engine.rebuilt"
STAGE_EVENT = "trtflow.stage.rebuilt"
SEARCH_DEPTH = 3  # a directory of model repos: <dir>/<repo>/<sub>/pipeline.yaml at most


def find_pipelines(targets: list[str], base: Path) -> list[Path]:
    """Pipeline files among `targets`: files as given; a directory is searched (depth 3) for YAML files that are
    trtflow pipelines (a mapping with `version` and `stages`), skipping hidden directories (stores)."""
    found: list[Path] = []
    for target in targets:
        path = Path(target) if Path(target).is_absolute() else base / target
        if path.is_file():
            found.append(path.resolve())
        elif path.is_dir():
            found += sorted(p.resolve() for p in _yaml_files(path, SEARCH_DEPTH) if _is_pipeline(p))
        else:
            raise SpecError(f"pipeline '{target}' not found (relative paths resolve against the deployment's working "
                            f"directory, {base})", hint="give a path that exists on the worker's machine")
    return list(dict.fromkeys(found))


def _yaml_files(root: Path, depth: int) -> list[Path]:
    out = [p for p in root.iterdir() if p.is_file() and p.suffix in (".yaml", ".yml")]
    if depth > 1:
        for sub in sorted(root.iterdir()):
            if sub.is_dir() and not sub.name.startswith(".") and not sub.is_symlink():
                out += _yaml_files(sub, depth - 1)
    return out


def _is_pipeline(path: Path) -> bool:
    try:
        data, _ = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, SpecError):
        return False
    return isinstance(data, dict) and "stages" in data and "version" in data


class WatchedEvent(BaseModel):
    """An event of the watcher's result: emitted by it (an engine's, a stage's) or by a release stage's task."""
    event: str
    resource: str
    version: int | None = None  # a release's
    engine: str | None = None  # an engine's


class WatchEntry(BaseModel):
    """The watcher's result for one pipeline (as JSON, parts it did not reach left out: `environment_changed`
    once planned, `error` when it failed)."""
    pipeline: str
    ran: list[str] = []
    reused: list[str] = []
    events: list[WatchedEvent] = []
    environment_changed: list[str] = []
    error: str | None = None


def engine_events(pipeline: Path, outcome: StageReport, changed: list[str]) -> list[Event]:
    """One event per engine a stage that ran produced (the cells of its engines outputs that built), else one for
    the stage."""
    base = {"trtflow.pipeline": str(pipeline), "trtflow.stage": outcome.stage}
    payload = {"key": outcome.key, "directory": outcome.directory, "environment_changed": changed}
    if outcome.engines:
        return [Event(ENGINE_EVENT, f"trtflow.engine.{pipeline.parent.name}.{outcome.stage}.{eng.cell.name}", base,
                      {**payload, "engine": str(eng.plan), "runtime": eng.built.runtime, "target": eng.cell.target},
                      engine=str(eng.plan))
                for engines in outcome.engines for eng in built_engines(Path(engines))]
    return [Event(STAGE_EVENT, f"trtflow.stage.{pipeline.parent.name}.{outcome.stage}", base, payload)]


def _rebuild_stale(path: Path, store: str | None, entry: WatchEntry, log: Any) -> None:
    """One pipeline planned and, where a stage is stale, run; `entry` records what ran, was reused and was sent."""
    from trtflow.flows.pipeline_flow import emit, handing_over, pipeline_flow
    from trtflow.flows.runner import make_runner

    runner = make_runner(str(path), [], store)
    plan = runner.plan()
    broken = [i for i in plan if i.action == "error"]
    if broken:  # a stage that cannot even be planned (its code does not import here): not "up to date"
        raise TrtflowError(f"stage '{broken[0].name}': {broken[0].reason}")
    stale = [i for i in plan if i.action == "run"]
    entry.environment_changed = sorted({c for i in plan for c in i.changed})
    if not stale:
        entry.reused = [i.name for i in plan]
        log.info("%s: up to date (%d stages)", path, len(plan))
        return
    log.info("%s: %s stale (%s)", path, ", ".join(i.name for i in stale), stale[0].reason)
    with handing_over(runner, str(path), []):
        outcomes = pipeline_flow(str(path), store=runner.store.location)
    for o in map(StageReport.model_validate, outcomes):
        (entry.ran if o.status == "ran" else entry.reused).append(o.stage)
        if o.status != "ran":
            continue
        for announced in o.announced:  # (emitted by the stage's task, as its kind's row declares)
            entry.events.append(WatchedEvent(event=announced.event, resource=announced.resource,
                                             version=announced.version))
        for event in engine_events(path, o, entry.environment_changed):
            emit(event)
            entry.events.append(WatchedEvent(event=event.event, resource=event.resource_id,
                                             **({"engine": event.engine} if event.engine else {})))
    log.info("%s: ran %s; reused %s", path, ", ".join(entry.ran) or "nothing", ", ".join(entry.reused) or "nothing")


@flow(name="trtflow-watch", persist_result=True, log_prints=True)
def watch_flow(pipelines: list[str], store: str | None = None, machine: str | None = None,
               changed: Any = None) -> list[dict[str, Any]]:
    """Check every pipeline (files, or directories of model repos) against this machine's environment and rebuild
    what is stale. Returns, per pipeline: the stages run and reused, the environment fields that changed, and
    the events emitted; a pipeline that fails does not stop the others, and fails the flow at the end. When every
    pipeline is up to date or rebuilt, this machine's environment record (check-env's) advances to the current
    environment. `machine`: the machine the run is for (a run that lands on another fails); `changed`: what
    check-env's event said changed (logged)."""
    from trtflow.flows import machine as this_machine

    log = get_run_logger()
    here = this_machine.machine_name()
    if machine and machine != here:
        raise TrtflowError(f"this watcher run is for machine '{machine}' but ran on '{here}': start its worker only "
                           f"on {machine} (prefect worker start --work-queue {machine}), or set TRTFLOW_MACHINE "
                           f"there")
    if changed:
        log.info("environment change reported by check-env on %s: %s", here, changed)
    base = Path.cwd()
    found = find_pipelines(pipelines, base)
    if not found:
        raise SpecError(f"no trtflow pipeline in {', '.join(map(repr, pipelines))} under {base} (the deployment's "
                        f"working directory: is TRTFLOW_MODELS set where it was deployed?)",
                        hint="give pipeline files or directories holding them")
    results: list[WatchEntry] = []
    failures = []
    for path in found:
        entry = WatchEntry(pipeline=str(path), ran=[], reused=[], events=[])
        results.append(entry)
        try:
            _rebuild_stale(path, store, entry, log)
        except TrtflowError as exc:
            log.error("%s: %s", path, exc)
            entry.error = str(exc)
            failures.append(f"{path}: {exc}")
    if failures:
        raise TrtflowError(f"{len(failures)} of {len(results)} pipelines failed: " + "; ".join(failures) +
                           "; this machine's environment record was not advanced")
    check = this_machine.check()
    if check.previous != check.fingerprint:
        state = this_machine.record(check)
        log.info("recorded this machine's environment in %s: every pipeline is up to date with it", state)
    return [entry.model_dump(mode="json", exclude_unset=True) for entry in results]
