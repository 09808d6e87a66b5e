"""Run one stage the DVC way: resolve its inputs, compute its key, reuse a published result or run and publish.

No Prefect here: the Prefect flow (flows/pipeline_flow.py) and `trtflow plan` both drive this class.
"""
from __future__ import annotations

import hashlib
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from trtflow import depends, phases
from trtflow.artifact import Artifact, Inputs, Provenance, StageResult
from trtflow.decisions import Decision
from trtflow.disk import DiskError, disk_error
from trtflow.errors import SpecError, StageError, StageFailed, StoreError, TransientStageError, TrtflowError
from trtflow.flows import implementation, keys, precheck
from trtflow.flows.digest import DigestCache
from trtflow.flows.isolate import STAGE_LOG, call_stage
from trtflow.flows.keys import describe, fingerprint
from trtflow.flows.manifest import InputRecord, Manifest, OutputRecord, PipelineRef, RunEnvironment, Timings
from trtflow.flows.store import SHARED, ArtifactStore, claim_all, file_records
from trtflow.flows.stores import open_store
from trtflow.pipelines.graph import SOURCE, StageGraph, build_graph, outputs_of
from trtflow.pipelines.kinds import kind_of
from trtflow.pipelines.loader import LoadedPipeline
from trtflow.stages.trt import plugins
from trtflow.text import first_line, suggestion
from trtflow.usercode import source_digest

SHARED_CACHE = "shared-cache"  # an input outside the key: a cache a stage may read and update (timing caches)
CLAIM_ATTEMPTS = 5  # runs of a stage whose claimed record (a release's version) another run took meanwhile


@dataclass
class StageOutcome:
    name: str
    kind: str
    key: str
    status: str  # "ran" | "reused"
    directory: Path
    manifest: Manifest
    reason: str = ""
    seconds: float = 0.0  # wall time of this stage in the runner
    work_seconds: float = 0.0  # of which inside the stage's own function

    @property
    def summary(self) -> str:
        try:
            return (self.directory / "summary.md").read_text()
        except OSError:
            return ""


@dataclass
class PlanItem:
    name: str
    kind: str
    action: str  # "reuse" | "run" | "error"
    reason: str
    key: str | None = None
    environment: str = "-"
    changed: list[str] = field(default_factory=list)  # environment fields that differ from the last run's
    decisions: list[Decision] = field(default_factory=list)  # what a reused result decided for deployment


@dataclass
class Resolution:
    """One stage resolved: its inputs and key (and the key's parts), the published result it reuses (None: it
    runs) and why."""
    name: str
    kind: str
    impl: implementation.StageImpl
    inputs: Inputs
    key: str
    parts: keys.KeyParts
    manifest: Manifest | None
    reason: str
    outdated: bool = False  # a published result of the key is no longer current (its row's check): replace it

    def outcome(self, directory: Path, seconds: float) -> StageOutcome:
        """The outcome of reusing the published result."""
        assert self.manifest is not None
        return StageOutcome(self.name, self.kind, self.key, "reused", directory, self.manifest, self.reason, seconds)


@dataclass
class _Attempt:
    """A stage's run so far: where it writes, the shared caches as they were before it (None: it reads none), and
    once it ran, its result, its verdict's failure, when it began and how long it worked."""
    staging: Path
    shared: dict[str, tuple[int, int]] | None
    result: Any = None
    failed: StageFailed | None = None
    began: datetime | None = None
    work: float = 0.0


@dataclass
class Runner:
    pipeline: LoadedPipeline
    graph: StageGraph = None  # type: ignore[assignment]
    store: ArtifactStore = None  # type: ignore[assignment]
    _noted: set[str] = field(default_factory=set, init=False, repr=False)  # store notes already logged
    _shared_pulled: bool = field(default=False, init=False, repr=False)
    # the results reuse_all found, for the no-op record (flows/noop.py; what the keys read is in trtflow.depends)
    reused: list[tuple[Path, Manifest]] = field(default_factory=list, init=False, repr=False)  # reuse_all's finds
    # reuse_all's stages from the first that runs on (those that may run): their imports are worth preloading
    pending: list[str] = field(default_factory=list, init=False, repr=False)
    _plugins: list[plugins.PluginLoad] | None = field(default=None, init=False, repr=False)  # found once a run

    def __post_init__(self) -> None:
        # stages that do not depend on each other run side by side, at most this many at once
        self.slots = threading.BoundedSemaphore(self.pipeline.spec.concurrency or os.cpu_count() or 1)
        if self.graph is None:
            self.graph = build_graph(self.pipeline)
            precheck.check(self.pipeline, self.graph)
        if self.store is None:
            self.store = open_store(self.pipeline.store_location)

    @property
    def digests(self) -> DigestCache:
        return self.store.digests

    # --- selection ------------------------------------------------------------------------------------------

    def select(self, stages: list[str] | None) -> list[str]:
        """The stages to run: the named ones and what they depend on; all when none are named."""
        if not stages:
            return list(self.graph.order)
        for name in stages:
            self.check_stage_name(name, "--stage")
        return self.graph.closure(stages)

    def check_stage_name(self, name: str, option: str) -> None:
        if name not in self.graph.nodes:
            hint = suggestion(name, list(self.graph.nodes)) or f"stages: {', '.join(self.graph.order)}"
            raise SpecError(f"{option} {name}: no such stage in {self.pipeline.file.name}", hint=hint)

    def forced(self, name: str, force: list[str] | None) -> bool:
        return bool(force) and ("*" in force or name in force)

    # --- keys -------------------------------------------------------------------------------------------------

    def inputs_for(self, name: str, produced: dict[str, Manifest]) -> Inputs:
        node = self.graph.nodes[name]
        resolved = Inputs()
        for slot, edges in node.inputs.items():
            arts = []
            for e in edges:
                if e.stage == SOURCE:
                    path = self.pipeline.model_path
                    arts.append(Artifact(path, "onnx", self.digests.artifact(path, "onnx"), SOURCE))
                else:
                    m = produced[e.stage]
                    out = m.outputs[e.output]
                    arts.append(Artifact(self.store.path(e.stage, m.key) / out.path, out.type, out.digest, e.stage))
            resolved[slot] = arts if node.many.get(slot) else arts[0]
        for slot, (pattern, keypath) in node.spec.data_globs().items():
            resolved[slot] = self._data_files(name, pattern, keypath)
        for slot in kind_of(node.spec).shared_caches(node.spec):
            # shared across runs and pipelines on this store; it saves time and is not part of the key (made
            # only when the stage runs: a read-only store serves cached results)
            resolved[slot] = Artifact(self.store.root / SHARED, SHARED_CACHE, "")
        resolved.lineage = self._lineage(name, produced)
        return resolved

    def _lineage(self, name: str, produced: dict[str, Manifest]) -> tuple[Provenance, ...]:
        """The results the stage's inputs come from, directly or not, in run order, after the source model."""
        upstream = self.graph.closure([name])
        entries = []
        for stage in upstream:
            if stage == name or stage not in produced:
                continue
            node, m = self.graph.nodes[stage], produced[stage]
            entries.append(Provenance(stage, node.spec.kind, m.key, {o: r.digest for o, r in m.outputs.items()},
                                      {slot: [f"{e.stage}.{e.output}" for e in edges]
                                       for slot, edges in node.inputs.items()}))
        if any(e.stage == SOURCE for n in upstream for edges in self.graph.nodes[n].inputs.values() for e in edges):
            path = self.pipeline.model_path
            entries.insert(0, Provenance(SOURCE, "model", "", {"model": self.digests.artifact(path, "onnx")}))
        return tuple(entries)

    def _data_files(self, stage: str, pattern: str, keypath: tuple) -> list[Artifact]:
        """Files a parameter names by glob (sample images, saved tensors): inputs like any other."""
        base = self.pipeline.base_dir
        matches = sorted(p for p in base.glob(pattern) if p.is_file()) if not Path(pattern).is_absolute() \
            else sorted(p for p in Path("/").glob(pattern.lstrip("/")) if p.is_file())
        depends.READ.tree(glob_root(base, pattern))
        if not matches:
            raise self.pipeline.error(f"no file matches '{pattern}'", ("stages", stage) + keypath,
                                      hint=f"the glob is relative to {base}")
        arts = []
        for p in matches:
            rel = p.relative_to(base).as_posix() if p.is_relative_to(base) else str(p)
            digest = hashlib.sha256(f"{rel}\0{self.digests.sha256(p)}".encode()).hexdigest()
            arts.append(Artifact(p.resolve(), "file", digest))
        return arts

    def key_for(self, name: str, inputs: Inputs,
                impl: implementation.StageImpl) -> tuple[str, keys.KeyParts]:
        spec = self.graph.nodes[name].spec
        code = {ref: source_digest(ref) for ref in spec.code_refs()}
        # the pipeline's TensorRT plugins, like a user's code: an edited plugin re-keys every stage that loads it
        code.update({f"plugin {p.label}": p.digest for p in self.plugins_for(spec, impl)})
        parts = keys.key_parts(
            spec.kind, impl.version, spec.key_params(),
            {slot: ([a.digest for a in v] if isinstance(v, list) else v.digest) for slot, v in inputs.items()
             if not (isinstance(v, Artifact) and v.type == SHARED_CACHE)},
            fingerprint(impl.env_facets), code, impl.code)
        return keys.stage_key(parts), keys.KeyParts.model_validate(parts)

    def plugins_for(self, spec: Any, impl: implementation.StageImpl) -> list[plugins.PluginLoad]:
        """The pipeline's `plugins:` as found on disk, for a stage whose kind parses or builds with TensorRT (the
        `tensorrt` facet of its key) or ships them (its row's `ships_plugins`); none for the others."""
        takes = "tensorrt" in impl.env_facets or kind_of(spec).ships_plugins
        if not takes or not self.pipeline.spec.plugins:
            return []
        if self._plugins is None:
            self._plugins = plugins.found(self.pipeline, self.digests.sha256)
        return self._plugins

    def _stage_function(self, spec: Any, impl: implementation.StageImpl) -> Callable[..., Any]:
        """The stage's function, with the plugins it loads declared to the children it starts that parse or build."""
        loads = self.plugins_for(spec, impl)
        return plugins.Declaring(tuple(loads), impl.run) if loads else impl.run

    # --- resolve: one stage's inputs, key, and whether it is reused or runs, and why ------------------------------

    def resolve(self, name: str, produced: dict[str, Manifest], force: list[str] | None = None,
                fetch: bool = True) -> Resolution:
        """What stage `name` is to do given the manifests of the stages it reads (`produced`): its inputs, key and
        the published result to reuse, or why it runs. `fetch=False` (`plan`) asks a remote store without
        downloading the result's files."""
        spec = self.graph.nodes[name].spec
        impl = implementation.resolve(spec)
        inputs = self.inputs_for(name, produced)
        key, parts = self.key_for(name, inputs, impl)
        if self.forced(name, force):
            return Resolution(name, spec.kind, impl, inputs, key, parts, None, "forced")
        found = self.store.lookup(name, key) if fetch else self.store.peek(name, key)
        if found.manifest is not None:
            stale = self._outdated(impl, found.manifest)
            if stale is None:
                return Resolution(name, spec.kind, impl, inputs, key, parts, found.manifest,
                                  f"nothing changed; {found.note}" if found.note else "nothing changed")
            return Resolution(name, spec.kind, impl, inputs, key, parts, None, stale, outdated=True)
        reason = found.rejected or keys.why_stale(self.store.last(name), key, parts, describe)
        return Resolution(name, spec.kind, impl, inputs, key, parts, None, reason)

    def _outdated(self, impl: implementation.StageImpl, manifest: Manifest) -> str | None:
        """Why a published result of a kind that checks it (its stage module's `CODE.outdated`) no longer holds, read
        against the store's shared records (fetched once per run from a remote store); None: reuse it."""
        if impl.outdated is None:
            return None
        if not self._shared_pulled:
            self.store.pull_shared()
            self._shared_pulled = True
        return impl.outdated(manifest.metrics, self.store.root / SHARED)

    # --- plan -------------------------------------------------------------------------------------------------

    def plan(self, stages: list[str] | None = None, force: list[str] | None = None) -> list[PlanItem]:
        items: list[PlanItem] = []
        produced: dict[str, Manifest] = {}
        will_run: set[str] = set()
        for name in self.select(stages):
            spec = self.graph.nodes[name].spec
            try:
                impl = implementation.resolve(spec)
            except StageError as exc:
                items.append(PlanItem(name, spec.kind, "error", str(exc)))
                will_run.add(name)
                continue
            blocked = sorted(self.graph.nodes[name].upstream & will_run)
            if blocked:
                items.append(PlanItem(name, spec.kind, "run", f"upstream {', '.join(blocked)} will run",
                                      environment=describe(fingerprint(impl.env_facets))))
                will_run.add(name)
                continue
            r = self.resolve(name, produced, force, fetch=False)
            env = describe(r.parts.env)
            if r.manifest is not None:
                produced[name] = r.manifest
                items.append(PlanItem(name, spec.kind, "reuse", r.reason, r.key, env,
                                      decisions=r.manifest.decisions))
                continue
            changed = [] if self.forced(name, force) else self.env_changes(name, r.parts)
            items.append(PlanItem(name, spec.kind, "run", r.reason, r.key, env, changed))
            will_run.add(name)
        return items

    def env_changes(self, name: str, parts: keys.KeyParts) -> list[str]:
        """'field old -> new' for each environment fact that differs from the stage's last run."""
        last = self.store.last(name)
        return keys.diff(last.parts.env, parts.env) if last and last.parts.env != parts.env else []

    def _mark_last(self, name: str, key: str, parts: keys.KeyParts, **outcome: str) -> None:
        """`last.json` (keys.LastRun); `outcome` is a failed run's `status` and `error`."""
        self.store.mark_last(name, keys.LastRun(key=key, parts=parts, **outcome))

    # --- run --------------------------------------------------------------------------------------------------

    def reuse_all(self, stages: list[str] | None, force: list[str] | None) -> list[StageOutcome] | None:
        """Every selected stage's published result when all of them are in place (then the run needs no flow run
        at all); None as soon as one would run, or a stage needs its error reported by the flow."""
        selected = self.select(stages)
        self.pending = selected
        if force:
            return None
        produced: dict[str, Manifest] = {}
        found = []
        for i, name in enumerate(selected):
            self.pending = selected[i:]
            started = time.perf_counter()
            try:
                r = self.resolve(name, produced)
            except (StoreError, DiskError):  # the store's own failure: said now, as before any flow run
                raise
            except TrtflowError:
                return None
            if r.manifest is None:
                return None
            produced[name] = r.manifest
            found.append((r.outcome(self.store.path(name, r.key), time.perf_counter() - started), r.parts))
        for outcome, parts in found:
            self._mark_last(outcome.name, outcome.key, parts)
        self.digests.save()
        self.reused = [(Path(o.directory), produced[o.name]) for o, _ in found]
        self.pending = []
        return [outcome for outcome, _ in found]

    def imports(self, names: list[str]) -> list[str]:
        """What the stage processes of `names` will import: their built-in kinds' stage modules and the libraries
        the rows name (a user's kind: nothing, its module is the user's own)."""
        kinds = [kind_of(self.graph.nodes[name].spec) for name in names]
        return list(dict.fromkeys(m for kind in kinds if kind.module for m in (kind.module, *kind.preload)))

    def run_stage(self, name: str, produced: dict[str, Manifest], force: list[str] | None = None,
                  log: Callable[[str], None] | None = None) -> StageOutcome:
        """Reuse the stage's published result, or run it (in a child process; `log` gets its output line by
        line) and publish it."""
        started = time.perf_counter()
        with phases.phase("pipeline load, keys, store look-ups"):
            r = self.resolve(name, produced, force)
        spec, key, parts = self.graph.nodes[name].spec, r.key, r.parts
        if r.manifest is not None:
            self._mark_last(name, key, parts)
            self.digests.save()
            return r.outcome(self.store.path(name, key), time.perf_counter() - started)
        inputs = r.inputs.without(kind_of(spec).result_caches) if self.forced(name, force) else r.inputs
        ran = _Attempt(self.store.staging(name, key), self._make_shared_caches(inputs, log))
        try:
            self._run_claiming(name, r, inputs, ran, log)
            with phases.phase("hashing, publishing"):
                manifest = self._manifest(name, key, parts, inputs, ran.result, ran.staging, ran.began, ran.work,
                                          status="failed" if ran.failed else "ok")
                directory, manifest = self.store.publish(name, key, ran.staging, manifest,
                                                         replace=self.forced(name, force) or r.outdated)
            if ran.failed is None and manifest.ok:  # (a mark another run of this key made first is the same mark)
                claim_all(self.store, ran.result.after_publish)
        except TrtflowError as exc:
            self.store.discard(ran.staging)
            if isinstance(exc, DiskError):
                exc.remeasure()
            _name_stage(exc, name, spec.kind)
            _retarget(exc, ran.staging, f"(the output directory of stage '{name}', removed)")
            self._mark_last(name, key, parts, status="failed", error=_first_line(exc))
            raise
        except BaseException as exc:
            self.store.discard(ran.staging)
            full = disk_error(exc, ran.staging, f"stage '{name}'", shown=f"its output in {ran.staging.parent}")
            if full is not None:
                self._mark_last(name, key, parts, status="failed", error=_first_line(full))
                raise full from None
            raise
        return self._ended(name, r, ran, directory, manifest, time.perf_counter() - started)

    def _run_claiming(self, name: str, r: Resolution, inputs: Inputs, ran: _Attempt,
                      log: Callable[[str], None] | None) -> None:
        """The stage run in a child into `ran.staging`, and the store records its result needs claimed (a
        release's version); where another run took one first, run again from it (a fresh staging)."""
        spec = self.graph.nodes[name].spec
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            ran.began = datetime.now(timezone.utc)
            t0 = time.perf_counter()
            try:
                ran.result = call_stage(self._stage_function(spec, r.impl), (spec, inputs, ran.staging), spec.timeout,
                                        name, output=log, keep=ran.staging / STAGE_LOG)
            except StageFailed as exc:
                ran.failed, ran.result = exc, exc.result
            ran.work = time.perf_counter() - t0
            lost = None if ran.failed else claim_all(self.store, getattr(ran.result, "claims", None) or [])
            if lost is None:
                return
            self.store.discard(ran.staging)
            if attempt == CLAIM_ATTEMPTS:
                raise TransientStageError(f"{CLAIM_ATTEMPTS} runs in a row lost a record of the store's shared/ "
                                          f"to other runs ({lost})", hint="run again")
            if log is not None:
                log(f"{lost}: running '{name}' again")
            ran.shared = self._make_shared_caches(inputs, log)
            ran.staging = self.store.staging(name, r.key)

    def _ended(self, name: str, r: Resolution, ran: _Attempt, directory: Path, manifest: Manifest,
               seconds: float) -> StageOutcome:
        """The outcome of a published run: ran; reused, where another run of this key published an OK result
        first; or its verdict's failure raised, naming the published result."""
        spec, key, parts = self.graph.nodes[name].spec, r.key, r.parts
        failed = ran.failed
        if failed is not None and manifest.ok:
            # another run of this key published an OK result first (the store kept it: the next run reuses it), and
            # this run's verdict failed (a benchmark measured under other load, a flaky check): its result is the
            # key's, as an OK result losing the race adopts the winner's
            self._mark_last(name, key, parts)
            self.digests.save()
            return StageOutcome(name, spec.kind, key, "reused", directory, manifest,
                                f"another run published it first (this run's own verdict: {_first_line(failed)})",
                                seconds, ran.work)
        if failed is not None:
            _name_stage(failed, name, spec.kind)
            _retarget(failed, ran.staging, str(directory))
            failed.tell(directory=str(directory))
            self._mark_last(name, key, parts, status="failed", error=_first_line(failed))
            raise failed
        if ran.shared is not None:
            self.store.push_shared(ran.shared)
        self._mark_last(name, key, parts)
        self.digests.save()
        return StageOutcome(name, spec.kind, key, "ran", directory, manifest, r.reason, seconds, ran.work)

    def _make_shared_caches(self, inputs: Inputs,
                            log: Callable[[str], None] | None = None) -> dict[str, tuple[int, int]] | None:
        """The shared caches the stage reads, made (and, from a remote store, fetched); None when it reads none,
        else what `push_shared` compares with after the stage. What the store refused to fetch is logged once."""
        caches = [art for art in inputs.values() if isinstance(art, Artifact) and art.type == SHARED_CACHE]
        for art in caches:
            art.path.mkdir(parents=True, exist_ok=True)
        if not caches:
            return None
        before = self.store.pull_shared()
        for note in self.store.notes:
            if note not in self._noted and log is not None:
                self._noted.add(note)
                log(f"warning: {note}")
        return before

    def _manifest(self, name: str, key: str, parts: keys.KeyParts, inputs: Inputs, result: Any,
                  staging: Path, began: datetime, work: float, status: str = "ok") -> Manifest:
        spec = self.graph.nodes[name].spec
        if not isinstance(result, StageResult):
            raise StageError(f"stage '{name}' returned {type(result).__name__}, not a StageResult")
        declared = outputs_of(spec)
        missing = [o for o in declared if o not in result.outputs]
        if missing:
            raise StageError(f"stage '{name}' did not produce its declared output(s): {', '.join(missing)}")
        outputs = {}
        hasher = DigestCache(None)
        for out_name, path in result.outputs.items():
            path = Path(path).resolve()
            if not path.exists() or not path.is_relative_to(staging.resolve()):
                raise StageError(f"stage '{name}' output '{out_name}' is not a file under its output directory")
            typ = declared.get(out_name, "dir" if path.is_dir() else "file")
            outputs[out_name] = OutputRecord(path=path.relative_to(staging.resolve()).as_posix(), type=typ,
                                             digest=hasher.artifact(path, typ),
                                             size=path.stat().st_size if path.is_file() else None)
        (staging / "summary.md").write_text(result.summary or "")

        def describe_input(a: Artifact) -> InputRecord:
            return InputRecord(path=str(a.path), type=a.type, digest=a.digest)

        return Manifest(
            status=status, stage=name, kind=spec.kind, key=key, key_parts=parts,
            pipeline=PipelineRef(name=self.pipeline.spec.name, file=str(self.pipeline.file)),
            inputs={s: ([describe_input(a) for a in v] if isinstance(v, list) else describe_input(v))
                    for s, v in inputs.items()},
            outputs=outputs, metrics=result.metrics, decisions=result.decisions, warnings=result.warnings,
            timings=Timings(started=began.isoformat(), work_seconds=round(work, 4)),
            environment=RunEnvironment(python=platform.python_version(), platform=platform.platform(),
                                       fingerprint=parts.env),
            files=file_records(staging, hasher.sha256),  # the outputs' hashes are reused, not taken again
        )


def _first_line(exc: BaseException) -> str:
    return first_line(exc)[:300]


def _name_stage(exc: TrtflowError, name: str, kind: str) -> None:
    """Every stage error's one line names the stage (a SpecError names its key path already); its kind, for the
    artifact and the event."""
    exc.tell(kind=kind, **({} if isinstance(exc, SpecError) else {"stage": name}))


def _retarget(exc: TrtflowError, staging: Path, instead: str) -> None:
    """An error's message names the staging directory, which is renamed or removed: name what exists."""
    exc.tell(moved=exc.failure.moved + ((str(staging.resolve()), instead), (str(staging), instead)))


__all__ = ["PlanItem", "Resolution", "Runner", "StageOutcome"]


def glob_root(base: Path, pattern: str) -> Path:
    """The folder a glob searches under: its parts before the first one with a wildcard."""
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts) - 1)
    return (Path("/") if Path(pattern).is_absolute() else base).joinpath(*parts[:fixed])


def make_runner(pipeline_file: str, overrides: list[str] | None, store: str | None) -> Runner:
    """The runner of a pipeline file, on `store` (a directory or URL; default: the pipeline's), opened for
    writing (read-only when it cannot be written)."""
    from trtflow.pipelines.loader import is_url, load_pipeline

    loaded = load_pipeline(pipeline_file, overrides)
    location = (store if is_url(store) else str(Path(store).resolve())) if store else loaded.store_location
    runner = Runner(loaded, store=open_store(location))
    runner.store.ensure_writable()
    return runner
