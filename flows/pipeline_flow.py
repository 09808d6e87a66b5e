"""The Prefect wiring, kept thin: one flow run per pipeline run, one task per stage, a Markdown artifact each."""
from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import contextvars
import hashlib
import os
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_image_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NONE
from prefect.states import Cancelled, Completed
from prefect.utilities.annotations import quote

from trtflow import files, phases, progress
from trtflow import markdown as md
from trtflow.errors import FailedVerdict, Failure, StageStopped, TransientStageError, TrtflowError
from trtflow.events import Event, StageRan
from trtflow.flows import implementation
from trtflow.flows.isolate import kill_all, resume
from trtflow.flows.keys import describe
from trtflow.flows.manifest import Manifest
from trtflow.flows.results import StageReport
from trtflow.flows.run_identity import run_identity
from trtflow.flows.runner import Runner, StageOutcome, make_runner
from trtflow.pipelines.kinds import kind_of

StageListener = Callable[[str, str, Any], None]  # (event, stage name, payload) as stages start and finish
# the CLI's lines listen here, for the flows run in its context only
_watchers: progress.Listeners[StageListener] = progress.Listeners("trtflow_stage_listeners")
watching = _watchers.listening


@dataclass(frozen=True)
class StageFailure:
    """What the "fail" event carries: the stage's kind, its error, and the seconds from its start to its failure."""
    kind: str
    error: BaseException
    seconds: float


def _notify(event: str, name: str, payload: Any = None) -> None:
    _watchers.notify(event, name, payload)


def _retry_unless_user_error(task, task_run, state) -> bool:
    # A TrtflowError (bad input, bad parameters, a failed verdict) fails the same way every time: retrying only
    # wastes time. A crash or a timeout may not happen again.
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, TransientStageError) or not isinstance(exc, TrtflowError)


def artifact_key(runner: Runner, stage: str) -> str:
    """`<pipeline>-<6 hex of the pipeline file's path>-<stage>`: two repos with the same pipeline name differ."""
    where = hashlib.sha256(str(runner.pipeline.file).encode()).hexdigest()[:6]
    return re.sub(r"[^a-z0-9-]+", "-", f"{runner.pipeline.spec.name}-{where}-{stage}".lower()).strip("-")


def _progress_artifact(key: str, stage: str) -> Callable[[str, int, int], None]:
    """A Prefect progress artifact for a stage's long work, updated every 5% with the time left."""
    artifact: Any = None  # its id, once made
    shown = 0.0  # the progress it shows
    eta = progress.Eta()

    def on_progress(what: str, done: int, total: int) -> None:
        nonlocal artifact, shown
        pct = 100.0 * done / max(total, 1)
        said = md.text(f"trtflow stage {stage}: {eta.said(what, done, total)}")
        if artifact is None:
            artifact = create_progress_artifact(progress=pct, key=f"{key}-progress", description=said)
            shown = pct
        elif pct - shown >= 5 or done == total:
            update_progress_artifact(artifact, progress=pct, description=said)
            shown = pct

    return on_progress


# Both live in context variables, not module-level dicts: Prefect runs a flow and each of its tasks in a copy of the
# caller's context, so flows side by side in one process each see their own.
# A runner its caller made already (`trtflow run` checks the spec and the store before Prefect starts, the watcher
# plans first), with the flow's arguments it is for: the flow takes it rather than loading the pipeline again.
_handed: ContextVar[tuple[tuple[str, tuple[str, ...], str], Runner] | None] = ContextVar("trtflow_handed_runner",
                                                                                         default=None)
# The running flow's runner, for its tasks: a task never gets the object as an argument (Prefect walks a task's
# arguments for earlier results, and the runner holds them all: the UI drew false edges).
_running: ContextVar[Runner | None] = ContextVar("trtflow_flow_runner", default=None)
_posting: ContextVar[_Posting | None] = ContextVar("trtflow_flow_posting", default=None)


def _handle(pipeline_file: str, overrides: list[str] | None, store: str | None) -> tuple[str, tuple[str, ...], str]:
    return pipeline_file, tuple(overrides or ()), store or ""


@contextlib.contextmanager
def handing_over(runner: Runner, pipeline_file: str, overrides: list[str] | None) -> Iterator[None]:
    """While inside, `pipeline_flow(pipeline_file, overrides, store=runner.store.location)` runs on `runner`; a 5xx
    its Prefect server answered (its database gone, say) ends it as a lost server does (exit 3, one line)."""
    token = _handed.set((_handle(pipeline_file, overrides, runner.store.location), runner))
    try:
        yield
    except Exception as exc:
        from trtflow.flows.server import answered_error

        lost = answered_error(exc)
        if lost is None:
            raise
        raise lost from None
    finally:
        _handed.reset(token)


@task(cache_policy=NONE, persist_result=False)
def stage_task(name: str, produced: dict[str, Manifest], force: list[str] | None) -> StageOutcome:
    with phases.phase("stage task bodies (the rest of the flow run is Prefect's)"):
        return _stage(name, produced, force)


def _stage(name: str, produced: dict[str, Manifest], force: list[str] | None) -> StageOutcome:
    runner = _running.get()
    assert runner is not None, "stage_task runs inside pipeline_flow"
    key = artifact_key(runner, name)
    try:
        logger = get_run_logger()
        with progress.listening(_progress_artifact(key, name)), runner.slots:
            outcome = runner.run_stage(name, produced, force, log=lambda line: logger.info("%s | %s", name, line))
    except StageStopped as exc:  # the run was cancelled or interrupted: the stage did not fail
        return Cancelled(message=str(exc))
    except TrtflowError as exc:
        _say_failed(runner, key, name, exc.failure)
        raise
    env = describe(outcome.manifest.key_parts.env)
    header = (f"**{outcome.status}** · stage {md.code(name)} ({md.text(outcome.kind)}) · key "
              f"{md.code(outcome.key[:12])} · {md.text(outcome.reason)}"
              + (f" · environment: {md.text(env)}" if env != "-" else "")
              + f" · published in {md.code(outcome.directory)}"
              + (f" (cache of {md.code(f'{runner.store.location}/{name}/{outcome.key}')})"
                 if runner.store.location != str(runner.store.root) else "") + "\n\n")
    posting = _posting.get()
    assert posting is not None, "stage_task runs inside pipeline_flow"
    posting.post(_stage_artifacts, key, name, header + outcome.summary, outcome)
    get_run_logger().info("%s %s (%s) in %.2f s: %s", outcome.status, name, outcome.kind, outcome.seconds,
                          outcome.reason)
    for warning in outcome.manifest.warnings if outcome.status == "ran" else []:
        get_run_logger().warning("%s: %s", name, warning)
    if outcome.status == "ran":
        _announce(runner, outcome)
    if outcome.status == "reused":  # Prefect's own word for a result it did not recompute
        return Completed(name="Cached", message=f"reused: {outcome.reason}", data=outcome)
    return outcome


def _stage_artifacts(key: str, name: str, markdown: str, outcome: StageOutcome) -> None:
    with phases.phase("Prefect: artifacts and plots (posted beside the next stage)"):
        create_markdown_artifact(key=key, markdown=markdown, description=f"trtflow stage {name}: {outcome.status}")
        _plot_artifacts(key, name, outcome, markdown)


class _Posting:
    """A stage's artifacts are posted on a thread of their own (each in the context of its task run, which Prefect
    links them to), so that the stages that read its result need not wait for the API calls (0.2 s a run, issue
    #54); the flow run ends only once every one is posted, and a post that failed fails it, as it did in the
    stage's task."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trtflow-artifacts")
        self._posts: list[concurrent.futures.Future] = []

    def post(self, function: Callable[..., None], *args: Any) -> None:
        self._posts.append(self._pool.submit(contextvars.copy_context().run, function, *args))

    def finish(self, cancel: bool = False) -> BaseException | None:
        """Wait for every post (`cancel`: only for the one being posted, as the run unwinds); the first one's error,
        if one failed."""
        self._pool.shutdown(wait=True, cancel_futures=cancel)
        return next((e for e in (post.exception() for post in self._posts if not post.cancelled()) if e is not None),
                    None)


FAILED_EVENT = "trtflow.stage.failed"


def _say_failed(runner: Runner, key: str, name: str, failure: Failure) -> None:
    """A failed stage's artifact (its line, and a failed verdict's report) and its `trtflow.stage.failed` event
    (for automations: a notification, a page), both saying the failure's one line."""
    report = f"\n\n{failure.cause.summary}" if isinstance(failure.cause, FailedVerdict) else ""
    kind = runner.graph.nodes[name].spec.kind
    create_markdown_artifact(key=key, markdown=f"**failed** · stage {md.code(name)} ({md.text(kind)}) · "
                                               f"{md.text(failure.line())}{report}",
                             description=f"trtflow stage {name}: failed")
    pipeline = Path(runner.pipeline.file)
    emit(Event(FAILED_EVENT, f"trtflow.stage.{pipeline.parent.name}.{name}",
               {"trtflow.pipeline": str(pipeline), "trtflow.stage": name}, failure.payload()))


def _announce(runner: Runner, outcome: StageOutcome) -> None:
    """The events the stage's kind announces after it ran (its row's `events`)."""
    for event in announced(runner, outcome):
        emit(event)
        if event.say:
            get_run_logger().info("%s", event.say)


def emit(event: Event) -> None:
    from prefect.events import emit_event

    emit_event(event=event.event, resource={"prefect.resource.id": event.resource_id, **event.labels},
               payload=event.payload)


def announced(runner: Runner, outcome: StageOutcome) -> list[Event]:
    """What a stage's kind announces for a run of it (its stage module's `CODE.events`)."""
    announce = implementation.resolve(runner.graph.nodes[outcome.name].spec).events
    if announce is None:
        return []
    return announce(StageRan(runner.pipeline.file, outcome.name, outcome.key, Path(outcome.directory),
                             outcome.manifest.metrics))


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    return run_identity(str(flow_run.parameters.get("pipeline_file", "pipeline")))[0]


@flow(name="trtflow", flow_run_name=_flow_run_name, persist_result=True, log_prints=True)
def pipeline_flow(pipeline_file: str, overrides: list[str] | None = None, stages: list[str] | None = None,
                  force: list[str] | None = None, store: str | None = None) -> list[dict[str, Any]]:
    """Run a trtflow pipeline file: every declared stage, reusing those whose key is already published. A stage
    starts as soon as the stages it reads are done, side by side with others (pipeline `concurrency:`); a failed
    stage stops only the stages that depend on it. Returns each stage's `StageReport` (flows/results.py) as
    JSON."""
    handed = _handed.get()
    runner = handed[1] if handed is not None and handed[0] == _handle(pipeline_file, overrides, store) \
        else make_runner(pipeline_file, overrides, store)
    order = runner.select(stages)
    _tag_flow_run(run_identity(pipeline_file)[1])
    _notify("flow", "", _flow_run_page())
    run = _Schedule(runner, order, force)
    token, posting = _running.set(runner), _Posting()
    posted = _posting.set(posting)
    try:
        run.until_done()
    except BaseException:  # Ctrl-C, SIGTERM, a cancelled flow run: stop the stages running in other threads (their
        kill_all()          # tasks end Cancelled), then unwind
        for future in run.running.values():
            future.wait()
        resume()
        posting.finish(cancel=True)
        raise
    finally:
        _running.reset(token)
        _posting.reset(posted)
    unposted = posting.finish()
    if unposted is not None:
        raise unposted
    if run.failed:
        first, exc = next((n, run.failed[n]) for n in order if n in run.failed)
        lost = [n for n in order if run.skipped.get(n) in run.failed]
        others = [n for n in order if n in run.failed and n != first]
        if isinstance(exc, TrtflowError):
            exc.tell(also_failed=tuple(others), not_run=tuple(lost))
        raise exc
    return [StageReport.of_outcome(o, announced(runner, o) if o.status == "ran" else [])
            .model_dump(mode="json") for o in (run.outcomes[n] for n in order)]


def _flow_run_page() -> str | None:
    """This flow run's page in the Prefect UI (None when the server has no UI address: Prefect's ephemeral one)."""
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_UI_URL

    return flow_run.ui_url if PREFECT_UI_URL.value() else None


def _tag_flow_run(wanted: list[str]) -> None:
    """The pipeline's tags on this flow run however it was started (CLI, deployment, a Python call, a watcher's
    subflow): one API call, added to the tags it has."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    have = list(flow_run.tags or [])
    missing = [t for t in wanted if t not in have]
    if missing and flow_run.id:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, tags=have + missing)


def stage_tags(gpu: str | None, limited: set[str]) -> set[str]:
    """A stage task's tags: its GPU's tag (`stage_gpu`) for a stage that uses the GPU where the server holds a
    concurrency limit on that tag (`trtflow init-deploy --limits`: stages of every flow run on the machine take
    turns on the GPU); none otherwise. Prefect asks the server for a concurrency lease for every tagged task run,
    limit or not, and that costs: about 1.3 s per stage when each stage's set of tags was its own (`stage:<name>`,
    `kind:<kind>`), and 1.9 s for a benchmark's lease right after validate's on the same tag (bench/overhead.py,
    issue #54). Within one flow run the schedule keeps a benchmark alone on its GPU without tags (`_gpu_free`).
    The task run's name is the stage's; the flow run carries the pipeline's tags."""
    return {gpu} if gpu is not None and gpu in limited else set()


def limited_tags(tags: set[str]) -> set[str]:
    """The tags among `tags` the Prefect server holds a concurrency limit on."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    found = set()
    with get_client(sync_client=True) as client:
        for tag in sorted(tags):
            try:
                client.read_concurrency_limit_by_tag(tag)
                found.add(tag)
            except ObjectNotFound:
                continue
    return found


def stage_gpu(runner: Runner, name: str) -> str | None:
    """For a stage whose kind says it uses the GPU (`Kind.gpu`: trial builds too): `machine.gpu_tag` of this machine
    and the device its stages use (CUDA_VISIBLE_DEVICES' first entry, else 0; `trtflow init-deploy --limits`
    creates the limit). None for a stage without a GPU."""
    from trtflow.flows.machine import gpu_tag, machine_name

    spec = runner.graph.nodes[name].spec
    if not kind_of(spec).gpu(spec):
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return gpu_tag(machine_name(), visible or "0")


class _Schedule:
    """Submits each stage once what it reads is done, and collects outcomes and failures. Waiting is on the
    futures' own completion (no asking the server for each running task's state)."""

    def __init__(self, runner: Runner, order: list[str], force: list[str] | None):
        self.runner, self.order, self.force = runner, order, force
        self.pending = list(order)
        self.running: dict[str, Any] = {}
        self.outcomes: dict[str, StageOutcome] = {}
        self.failed: dict[str, BaseException] = {}
        self.skipped: dict[str, str] = {}  # stage -> the failed stage it needed
        self.futures: dict[str, Any] = {}  # every stage submitted: the upstream of a later one
        self.started: dict[str, float] = {}  # stage -> when it was submitted (what a failed stage's seconds count)
        self.gpu = {n: stage_gpu(runner, n) for n in order}  # stage -> its GPU's tag (None: no GPU)
        self.limited = limited_tags({t for t in self.gpu.values() if t})

    def until_done(self) -> None:
        while self.pending or self.running:
            self._submit_ready()
            self._collect()
            if self.running:
                concurrent.futures.wait([_local(f) for f in self.running.values()], timeout=1.0,
                                        return_when=concurrent.futures.FIRST_COMPLETED)

    def _submit_ready(self) -> None:
        for name in list(self.pending):
            node = self.runner.graph.nodes[name]
            blocked = sorted(u for u in node.upstream if u in self.failed or u in self.skipped)
            if blocked:
                self.skipped[name] = self.skipped.get(blocked[0], blocked[0])
                self.pending.remove(name)
                _notify("skip", name, self.skipped[name])
            elif all(u in self.outcomes for u in node.upstream) and self._gpu_free(name):
                spec = node.spec
                task_ = stage_task.with_options(name=name, task_run_name=name, retries=spec.retries,
                                                retry_delay_seconds=spec.retry_delay,
                                                retry_condition_fn=_retry_unless_user_error,
                                                tags=stage_tags(self.gpu[name], self.limited))
                _notify("start", name)
                self.started[name] = time.perf_counter()
                # every stage it depends on, directly or not: its inputs' lineage names them all
                produced = {u: self.outcomes[u].manifest for u in self.runner.graph.closure([name]) if u != name}
                # the edges are the stages it reads (wait_for); its arguments are quoted: Prefect otherwise links
                # any argument whose id() matches an earlier result's (ids of freed objects are reused)
                self.running[name] = task_.submit(quote(name), quote(produced),
                                                  quote(self.force), wait_for=[self.futures[u] for u in node.upstream])
                self.futures[name] = self.running[name]
                self.pending.remove(name)

    def _gpu_free(self, name: str) -> bool:
        """A stage that times its GPU (`Kind.gpu_alone`: benchmark) starts only when no other stage uses that GPU,
        and no stage starts on a GPU such a stage is using. (Across pipelines and flow runs, Prefect's
        tag-based concurrency limit on the GPU's tag does the same.)"""
        device = self.gpu.get(name)
        if device is None:
            return True
        busy = [n for n in self.running if self.gpu.get(n) == device]
        if self._alone(name):
            return not busy
        return not any(self._alone(n) for n in busy)

    def _alone(self, name: str) -> bool:
        return kind_of(self.runner.graph.nodes[name].spec).gpu_alone

    def _collect(self) -> None:
        for name, future in list(self.running.items()):
            if not _local(future).done():
                continue
            del self.running[name]
            try:
                self.outcomes[name] = future.result()
            except BaseException as exc:  # noqa: BLE001 - reported after every independent stage ran
                self.failed[name] = exc
                _notify("fail", name, StageFailure(self.runner.graph.nodes[name].spec.kind, exc,
                                                   time.perf_counter() - self.started[name]))
                continue
            _notify("done", name, self.outcomes[name])


PLOT_BYTES = 2 << 20  # a plot larger than this stays a file in the store only
PLOTS = 8  # at most this many per stage


def _plot_artifacts(key: str, name: str, outcome: StageOutcome, summary: str) -> None:
    """The stage's plots (PNG files among its outputs) as Prefect image artifacts beside its summary, but for those
    the summary already shows inline (parity's picture: it is all a failed stage posts). The image travels inside
    the artifact (a data: URL): the UI shows it without reaching the store."""
    plots = sorted(rel for rel in (outcome.manifest.files or {}) if rel.endswith(".png"))[:PLOTS]
    for i, rel in enumerate(plots):
        try:
            data = files.read_bounded(outcome.directory / rel, PLOT_BYTES, follow=False)
        except OSError:  # too large, or not a regular file: the store keeps it
            continue
        url = "data:image/png;base64," + base64.b64encode(data).decode()
        if url not in summary:
            create_image_artifact(image_url=url, key=f"{key}-plot-{i}", description=f"trtflow stage {name}: {rel}")


def _local(future: Any) -> concurrent.futures.Future:
    """The in-process future behind a Prefect task future (the default task runner's threads)."""
    return future.wrapped_future
