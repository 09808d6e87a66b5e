"""Stage `release`: per build target, the engine to deploy — never one validation failed — chosen by the declared
rule from the numbers validate and benchmark measured; a Triton model repository for it (config.pbtxt checked with
Triton's own schema and load rules, the engine as `<version>/model.plan`, versions that increase with each engine
released); a model card (Markdown and self-contained HTML) with the alternatives, the environment the engine is
valid for, the preprocessing as declared, the provenance chain and the pictures validate and benchmark drew."""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow import files, names
from trtflow.artifact import Artifact, Claim, Inputs, StageResult
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.release import ReleaseStage
from trtflow.stage_code import StageCode
from trtflow.stages.benchmark.report import BenchmarkReport, Measurement, RunSpread
from trtflow.stages.calibrate.report import CalibrateReport
from trtflow.stages.onnx.composition import composition
from trtflow.stages.onnx.records import Composition, read_chain
from trtflow.stages.parity.report import ParityReport
from trtflow.stages.precision.report import PrecisionReport
from trtflow.stages.prepare.report import OffloadRecord, PrepareReport, RewriteRecord
from trtflow.stages.release import card, estimate, selection
from trtflow.stages.release.report import Option, ParitySummary, ReleaseReport, ShippedPlugin, TargetRelease, ValidFor
from trtflow.stages.release.triton import chain as triton_chain
from trtflow.stages.release.triton import client_example, contract, versions
from trtflow.stages.release.triton import config as triton_config
from trtflow.stages.release.triton import preprocess as triton_preprocess
from trtflow.stages.release.triton.contract import Contract
from trtflow.stages.trt import plugins as trt_plugins
from trtflow.stages.trt.engines import Engine, built_engines
from trtflow.stages.validate.report import CandidateResult, ValidateReport

if TYPE_CHECKING:
    from trtflow.stages.ort.samples import SampleSource

VERSION = "6"  # 2: select.max_accuracy_drop weighs every task metric (a function's by its declared direction); 3: the
# shipped engine's accuracy per profile shape on the card; a target whose previous version's variant was lost is held;
# 4: the card's request example is also a file beside it (request-<target>.py), and waits for the model to be ready;
# 5: only contract-compatible engines compete, a margin across runs, rollbacks refused or said; 6: the warmup is made
# at each profile's opt shape as validate makes its batches, integer inputs never Triton's random data; and
# max_accuracy_drop weighs declared metrics only, no error in an output's units (a regression's, a function's lower)
NOT_TENSORRT = "not a TensorRT number"  # how the benchmark labels numbers of the ONNX Runtime harness


@dataclass
class _Job:
    """What every target's release shares: the settings, the inputs read once, where it writes."""
    params: ReleaseStage
    inputs: Inputs
    out_dir: Path
    model_name: str
    verdict: ValidateReport | None
    bench: BenchmarkReport | None
    kept: dict[str, tuple[int, int | None]]  # variant -> (nodes left in higher precision, nodes)
    steps: list[dict] | None  # the declared preprocessing
    shared: Artifact | None  # the store's shared/ (the versions released so far)
    plugins: list[trt_plugins.PluginLoad] = field(default_factory=list)  # the pipeline's, where declared to it


def run(params: ReleaseStage, inputs: Inputs, out_dir: Path) -> StageResult:
    engines = built_engines(inputs.one("engines").path)
    repaired = inputs.optional("repaired")
    if repaired is not None and repaired.path.is_dir():
        engines += built_engines(repaired.path)
    if not engines:
        raise StageError("release: the build output holds no built engine: nothing to release")
    job = _Job(params, inputs, out_dir, params.triton.model_name or "model",
               ValidateReport.read(inputs.one("validation").path) if "validation" in inputs else None,
               BenchmarkReport.model_validate_json(inputs.one("benchmark").path.read_text())
               if "benchmark" in inputs else None,
               _higher_precision(inputs), _preprocessing(inputs), inputs.optional("releases"),
               trt_plugins.declared())
    targets: dict[str, list[Engine]] = {}
    for eng in engines:
        targets.setdefault(eng.cell.target, []).append(eng)
    released, claims, marks, warnings = [], [], [], []
    for target, found in targets.items():
        release, said, (before, after) = _release_target(job, target, found)
        released.append(release)
        warnings += said
        claims += before
        marks += after
    report = _report(job, released, warnings)
    card.write(report, _plots(inputs, job.verdict, released), out_dir / "card")
    (out_dir / "report.json").write_text(report.model_dump_json(indent=2) + "\n")
    (out_dir / "triton").mkdir(exist_ok=True)
    made = _versions(job, released)
    result = StageResult(outputs={"triton": out_dir / "triton", "card": out_dir / "card",
                                  "report": out_dir / "report.json"},
                         summary=report.summary(), warnings=warnings, metrics=made.metrics(), claims=claims,
                         after_publish=marks, decisions=made.decisions())
    why_not = _failure(job, released)
    if why_not:
        raise StageFailed(why_not, result)
    return result


def _release_target(job: _Job, target: str, found: list[Engine]) \
        -> tuple[TargetRelease, list[str], tuple[list[Claim], list[Claim]]]:
    """One target's release: its engines ranked by the rule, the previous version kept where a rebuild lost its
    variant, else the chosen engine's Triton repository; the warnings it gives and the records of the version it
    claims (before its result is published, after). The previous version is the latest one published: a version
    claimed by a run that died before publishing it was never served."""
    params = job.params
    ledger = versions.read(job.shared.path, job.model_name, target) if job.shared else versions.Ledger()
    published = ledger.last_published()
    options = [_option(e, params, job.verdict, job.bench, job.kept) for e in found]
    if published is not None and published.contract is not None and params.select.contract == "fixed":
        _keep_contract(job, found, options, published)
    options = selection.rank(options, params.select)
    options, precision_order = selection.across_precisions(options, params.select)
    held = _held(published, options, job.verdict, params) if published is not None else None
    if held is not None:
        assert published is not None
        return (TargetRelease(target=target, chosen=None, options=options, held=held, version=published.version,
                              previous=published.candidate),
                [f"{target}: version {published.version} stays the one served: {held}"], ([], []))
    release = _choice(target, options, precision_order, ledger, params)
    if release.chosen is None:
        return release, [], ([], [])
    warnings = _ship(job, release, next(e for e in found if e.cell.name == release.chosen.name), ledger)
    records = versions.records(ledger, job.model_name, target, release.version, release.chosen.engine_sha256,
                               release.chosen.name, release.contract) \
        if job.shared is not None and release.new_version else ([], [])
    return release, warnings, records


def _choice(target: str, options: list[Option], precision_order: str, ledger: versions.Ledger,
            params: ReleaseStage) -> TargetRelease:
    """The target's release before anything is written: the first-ranked engine once the previous choice was weighed
    for stability and a rollback for the rule, or none and why."""
    published = ledger.last_published()
    previous = published.candidate if published else None
    options, stability = selection.keep_previous(options, previous, params.select)
    options, rolled_back, kept = selection.rollback(
        options, ledger.owners(), (published.version, published.owner) if published else None, params.select)
    chosen = options[0] if options and options[0].rank == 1 else None
    release = TargetRelease(target=target, chosen=chosen, options=options, previous=previous,
                            stability="; ".join(x for x in (stability, kept, _compared(options)) if x),
                            precision_order=precision_order,
                            previous_version=published.version if published else None, rolls_back_to=rolled_back)
    if chosen is None:
        release.why_none = "no engine may ship: " + "; ".join(f"{o.name}: {o.refused}" for o in options[:3])
    elif rolled_back is not None and params.select.rollback == "refuse":
        assert published is not None
        release.chosen, release.rolls_back_to = None, None
        release.why_none = (f"its best engine {chosen.name} is the engine of version {rolled_back}, and version "
                            f"{published.version} ({published.candidate}) was released since: shipping it would "
                            f"roll back (set select.rollback: allow to ship it as a new version that says so, or "
                            f"run the configuration that released version {published.version})")
    return release


def _ship(job: _Job, release: TargetRelease, eng: Engine, ledger: versions.Ledger) -> list[str]:
    """The chosen engine's Triton repository, its plugins and the environment it is valid for; the warnings a
    person deploying it must read."""
    assert release.chosen is not None
    params, target, name = job.params, release.target, release.chosen.name
    warnings = _repository(release, eng, params, job.model_name, job.out_dir, job.steps,
                           _warmup_source(params, job.inputs, eng), ledger)
    warnings += ship_plugins(release, job.plugins, job.out_dir)
    release.environment = _environment(eng)
    if eng.cell.backend.flavour == "tensorrt-rtx":
        warnings.append(f"{target}: `{name}` was built by TensorRT-RTX {eng.cell.backend.version}: "
                        f"Triton's TensorRT backend loads engines of full TensorRT (libnvinfer) only; build "
                        f"on a machine with TensorRT (the Triton container's version) to serve it there")
    if release.rolls_back_to is not None:
        warnings.append(f"{target}: version {release.version} rolls back to version {release.rolls_back_to}'s engine "
                        f"{name} (version {release.previous_version} was the latest)")
    if release.contract_changes and params.select.contract == "allow_change":
        warnings.append(f"{target}: the serving contract changed since version {release.previous_version}: "
                        + "; ".join(release.contract_changes))
    return warnings


def _report(job: _Job, released: list[TargetRelease], warnings: list[str]) -> ReleaseReport:
    numbers = sorted({o.measured_by for t in released for o in t.options if o.measured_by})
    return ReleaseReport(
        model_name=job.model_name, rule=job.params.select.model_dump(mode="json"), targets=released,
        lineage=list(job.inputs.lineage), warnings=warnings, preprocessing=job.steps, parity=_parity(job.inputs),
        labelled=job.verdict.labelled if job.verdict is not None else None, rewrites=_rewrites(job.inputs),
        offload=_offload(job.inputs),
        numbers_note=("Latency and throughput were measured by " + "; ".join(numbers) + ", not on the target GPU: "
                      "they order engines of one precision only, and engines of different precisions are ordered "
                      "by an estimate (each target's order across precisions)"
                      if any(NOT_TENSORRT in n for n in numbers) else ""))


def _versions(job: _Job, released: list[TargetRelease]) -> versions.Versions:
    """The versions made or kept per target (what the flow announces and the command line prints), and the targets
    whose previous version stays (an optional variant it shipped was lost)."""
    return versions.Versions(
        released=[versions.Release(model=job.model_name, target=t.target, version=t.version, new=t.new_version,
                                   engine=t.chosen.name, engine_sha256=t.chosen.engine_sha256,
                                   repository=t.repository or "", previous_version=t.previous_version,
                                   contract_changes=t.contract_changes, rolls_back_to=t.rolls_back_to)
                  for t in released if t.chosen is not None and t.version is not None],
        held=[versions.Held(model=job.model_name, target=t.target, version=t.version, engine=t.previous, why=t.held)
              for t in released if t.held is not None and t.version is not None])


def _failure(job: _Job, released: list[TargetRelease]) -> str | None:
    """Why the release fails, or None: a target with nothing to ship; a new version whose serving contract would
    change under select.contract: fixed."""
    empty = next((t for t in released if t.chosen is None and t.held is None), None)
    if empty is not None:
        other = [o for o in empty.options if o.contract_changes]  # (set only where the contract refused it)
        if other and all(o.refused is not None for o in empty.options):
            best = min(other, key=lambda o: selection.preference(o, job.params.select.prefer))
            return (f"release: no engine for target '{empty.target}' keeps the serving contract of "
                    f"'{job.model_name}' version {empty.previous_version}: {best.name} would change its serving "
                    f"contract: {'; '.join(best.contract_changes)}; clients of version {empty.previous_version} "
                    f"would be refused (set select.contract: allow_change to ship it, and tell them)")
        return f"release: nothing to ship for target '{empty.target}': {empty.why_none}"
    changed = next((t for t in released if t.chosen is not None and t.contract_changes
                    and job.params.select.contract == "fixed"), None)
    if changed is not None:
        return (f"release: version {changed.version} of '{job.model_name}' for target '{changed.target}' would "
                f"change its serving contract: {'; '.join(changed.contract_changes)}; clients of the previous "
                f"version would be refused (set select.contract: allow_change to ship it, and tell them)")
    return None


# ---------------------------------------------------------------------------------------------- the options

def _held(latest: versions.Released, options: list[Option], verdict: ValidateReport | None,
          params: ReleaseStage) -> str | None:
    """Why the target's previous version must stay the one served, or None: the engine it shipped is of an optional
    variant validate left out of this run (a rebuild lost it), and `select.lost_variant` keeps it. Switching the
    precision a fleet serves is a decision for a person, not for a scheduled rebuild."""
    if verdict is None or params.select.lost_variant != "keep_previous":
        return None
    prev = next((o for o in options if o.name == latest.candidate), None)
    variant = names.unrepaired(prev.variant) if prev is not None else None
    if variant is None or variant not in verdict.excluded:
        return None
    best = next((o.name for o in options if o.rank == 1), None)
    instead = f"; {best} passed and would replace it" if best else ""
    return (f"its engine {latest.candidate} is of optional variant '{variant}', which this run left out "
            f"({verdict.excluded[variant]}){instead}: set select.lost_variant: replace to ship it")


def _keep_contract(job: _Job, found: list[Engine], options: list[Option], published: versions.Released) -> None:
    """Under select.contract: fixed, an engine whose serving contract differs from the latest published version's
    may not ship: selection happens among the engines its clients can keep calling, so a run where nothing changed
    never fails on a contract (the ranking of engines of other batch profiles moves with the noise)."""
    assert published.contract is not None
    for option, eng in zip(options, found):
        if option.refused is not None:
            continue
        try:
            mine = _contract(job.model_name, eng, job.params)
        except triton_config.ConfigError as exc:
            option.refused = f"no Triton config: {exc}"
            continue
        option.contract_changes = mine.changes(published.contract)
        if option.contract_changes:
            option.refused = (f"its serving contract is not version {published.version}'s: "
                              f"{'; '.join(option.contract_changes)} (select.contract: fixed)")


def _contract(model_name: str, eng: Engine, params: ReleaseStage) -> Contract:
    """What the engine's clients call: its own config's inputs and outputs, or a chain's ensemble's."""
    config = triton_chain.make(read_chain(eng.directory), model_name)[-1] if eng.chain else \
        triton_config.make(model_name, eng, params.triton)
    return Contract.of(config, eng.cell.profiles)


def _compared(options: list[Option]) -> str:
    """Where the engines ranked by throughput were measured at different batches, which: a batch-1 engine's
    number against a batch-32 one's is said, never implied."""
    ranked = [o for o in options if o.rank is not None and o.samples_per_s_batch is not None]
    if len({o.samples_per_s_batch for o in ranked}) < 2:
        return ""
    return ("samples/s compared at the largest batch each engine's profiles take: "
            + ", ".join(f"{o.name} at batch {o.samples_per_s_batch}" for o in ranked[:4]))


def _option(eng: Engine, params: ReleaseStage, verdict: ValidateReport | None, bench: BenchmarkReport | None,
            kept: dict[str, tuple[int, int | None]]) -> Option:
    cell = eng.cell
    option = Option(name=cell.name, variant=cell.variant, precision=cell.precision, target=cell.target,
                    profiles=[p.name for p in cell.profiles], engine_bytes=sum(p.stat().st_size for p in eng.plans),
                    engine_sha256=eng.sha256(),
                    repaired_from=names.unrepaired(cell.name) if names.is_repaired(cell.variant) else None)
    why, checked, result = None, False, None
    if verdict is not None:
        result = verdict.checked_as(cell.name, cell.variant)
        checked = result is not None
        why = verdict.refuses(cell.name, cell.variant)
        option.validated = checked and why is None
        if result is not None:
            _take_accuracy(option, result, params, verdict)
    if bench is not None:
        _take_measurements(option, [m for m in bench.cells if m.candidate == cell.name and m.ok])
    _take_kept(option, kept.get(names.unrepaired(cell.variant)), verdict)
    option.composition = _composition_of(eng, result)
    option.estimate = _estimate(eng, option.composition) if option.composition is not None else None
    option.refused = selection.refusal(option, params.select, why, checked)
    return option


def _take_accuracy(option: Option, result: CandidateResult, params: ReleaseStage, verdict: ValidateReport) -> None:
    """The engine's accuracy as validate measured it, and its drop by the rule's `select.accuracy`."""
    weigh = params.select.max_accuracy_drop is not None
    option.accuracy, option.accuracy_drop, option.drop_metric = selection.worst_drop(
        result.accuracy, result.per_shape, weigh and params.select.accuracy == "fp32")
    option.accuracy_runtime = result.runtime
    option.shapes = result.per_shape
    option.labelled = result.labelled
    if params.select.accuracy == "labels":
        option.accuracy_drop, option.drop_metric = selection.labelled_drop(result.labelled, verdict.labelled)


def _take_measurements(option: Option, mine: list[Measurement]) -> None:
    """The benchmark's numbers from the engine's measured cells: the most samples/s at any batch, the p99 at the
    smallest batch, who measured them and how much they spread."""
    if not mine:
        return
    fastest = max((m for m in mine if m.samples_per_s), key=lambda m: m.samples_per_s or 0.0, default=None)
    if fastest is not None:
        option.samples_per_s, option.samples_per_s_batch = fastest.samples_per_s, fastest.batch
    smallest = min(mine, key=lambda m: m.batch)
    option.p99_ms, option.p99_batch = smallest.result.latency().p99, smallest.batch
    option.spread = _spread(mine)
    option.run_spread = _run_spread(mine)
    option.measured_by = smallest.result.runtime


def _take_kept(option: Option, count: tuple[int, int | None] | None, verdict: ValidateReport | None) -> None:
    """The nodes the engine's variant left in higher precision, of how many; a repaired engine's repair adds its
    own."""
    if count is None:
        return
    option.higher_precision_nodes, option.nodes = count
    if option.repaired_from and verdict is not None and verdict.repair is not None:
        option.higher_precision_nodes += len(verdict.repair.nodes)


def _composition_of(eng: Engine, result: CandidateResult | None) -> Composition | None:
    """The engine's compute by precision: validate's count where it checked the engine (at the same shapes, its
    profile's opt point), else counted here; none for a chain."""
    if result is not None and result.composition is not None:
        return result.composition
    return None if eng.chain else _composition(eng)


def _estimate(eng: Engine, made: Composition) -> estimate.Estimate:
    """The engine's speed on its target's GPU class (a target named sm86, or the GPU a native build ran on)."""
    env = eng.built.environment
    gpu, said = estimate.gpu_class(eng.cell.target, [g.compute_capability for g in (env.gpu or [])] if env else [])
    return estimate.estimate(made, gpu, said)


def _composition(eng: Engine) -> Composition:
    """The engine's variant's compute by precision at its first profile's opt shapes (what TensorRT tunes for)."""
    from trtflow.stages.onnx.model_io import load

    shapes = eng.cell.profiles[0].at("opt") if eng.cell.profiles else {}
    return composition(load(eng.own_variant or Path(eng.cell.model)), shapes)


def _spread(measured: list[Measurement]) -> float | None:
    """The benchmark's own jitter for an engine: the largest (p90 - median) / median of its cells' iteration
    latencies (a ranking that moves by less than this between two runs is noise)."""
    spreads = []
    for m in measured:
        lat = m.result.latency()
        if lat.median is not None and lat.p90 is not None and lat.median > 0:
            spreads.append(max(0.0, (lat.p90 - lat.median) / lat.median))
    return max(spreads) if spreads else None


def _run_spread(measured: list[Measurement]) -> RunSpread | None:
    """The engine's spread across this machine's runs: the largest of its cells' (the fewest runs among them)."""
    spreads = [m.run_spread for m in measured if m.run_spread is not None]
    if not spreads:
        return None
    def most(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None
    first = min(spreads, key=lambda s: s.runs)  # (the medians of the cell measured fewest times: its profile's own)
    return RunSpread(runs=first.runs, throughput=most([s.throughput for s in spreads]),
                     p99=most([s.p99 for s in spreads]),
                     median_samples_per_s=max((s.median_samples_per_s for s in spreads
                                               if s.median_samples_per_s), default=None),
                     median_p99_ms=next((s.median_p99_ms for s in spreads if s.median_p99_ms), None))


def _higher_precision(inputs: Inputs) -> dict[str, tuple[int, int | None]]:
    """Per variant (its stage's name): how many nodes its precision/calibrate stage left in higher precision, of
    how many (None where the report does not count them)."""
    kinds = {p.stage: p.kind for p in inputs.lineage}  # a report's class is its stage's kind's
    out: dict[str, tuple[int, int | None]] = {}
    for art in inputs.many("variant_reports"):
        kind = kinds.get(art.origin)
        if kind == "precision":
            p = PrecisionReport.model_validate_json(art.path.read_text())
            out[art.origin] = (len(p.kept_fp32), p.nodes)
        elif kind == "calibrate":
            c = CalibrateReport.model_validate_json(art.path.read_text())
            out[art.origin] = (len(c.left_in_float), None)
    return out


# ---------------------------------------------------------------------------------------------- Triton

def _warmup_source(params: ReleaseStage, inputs: Inputs, eng: Engine) -> SampleSource | None:
    """The release's samples for the engine's model (validation images or tensors, or seeded random data), which
    Triton's warmup is made from at each profile's opt shape as validate makes its batches (`add_warmup`). None
    without warmup, or for a chain: its pieces' configs have no warmup (a later piece's inputs are an earlier one's
    outputs), so nothing random reaches them."""
    if not params.triton.warmup or eng.chain:
        return None
    from trtflow.stages.onnx.model_io import load
    from trtflow.stages.ort import runner as ort_runner
    from trtflow.stages.ort.samples import SampleSource
    model = load(eng.own_variant or Path(eng.cell.model), with_data=False)
    return SampleSource(params.data, inputs, ort_runner.model_inputs(model), "release", model)


def _repository(release: TargetRelease, eng: Engine, params: ReleaseStage, model_name: str, out_dir: Path,
                steps: list[dict] | None, source: SampleSource | None, ledger: versions.Ledger) -> list[str]:
    """`triton/<target>/<model>/config.pbtxt` and `<version>/model.plan` (and, asked for, the preprocessing and
    ensemble models); the config is written, read back with Triton's schema and checked against the engine: a
    config Triton would refuse fails the stage here. The serving contract is compared with the latest published
    version's; the version is the latest's where it holds this engine under the contract it was claimed with, else
    the next."""
    repo = out_dir / "triton" / release.target  # a checked name (trtflow.names)
    if eng.chain is not None:
        return _chain_repository(release, eng, params, model_name, repo, ledger)
    model_dir = repo / model_name
    model_dir.mkdir(parents=True)
    try:
        config = triton_config.make(model_name, eng, params.triton)
    except triton_config.ConfigError as exc:
        raise StageError(f"release: {exc}") from None
    notes = triton_config.add_warmup(config, eng.cell.profiles, source, model_dir) if params.triton.warmup else []
    text = triton_config.to_text(config)
    try:
        parsed = triton_config.parse(text)
    except ValueError as exc:
        raise StageError(f"release: the config.pbtxt written for {eng.cell.name} is not one Triton reads: {exc}") \
            from None
    wrong = triton_config.problems(parsed, eng)
    if wrong:
        raise StageError(f"release: Triton would refuse the config.pbtxt for {eng.cell.name}: {'; '.join(wrong)}")
    release.contract = Contract.of(parsed, eng.cell.profiles)
    _version(release, ledger)
    (model_dir / str(release.version)).mkdir()
    (model_dir / "config.pbtxt").write_text(text)
    shutil.copyfile(eng.plan, model_dir / str(release.version) / triton_config.PLAN_FILE)
    release.repository = repo.relative_to(out_dir).as_posix()
    release.config = text
    (model_dir / contract.FILE).write_text(release.contract.model_dump_json(indent=2) + "\n")
    release.models = [model_name]
    if params.triton.preprocess:
        try:
            release.configs = triton_preprocess.write(repo, model_name, release.version, parsed, steps or [],
                                                      release.contract)
        except (triton_config.ConfigError, ValueError) as exc:
            raise StageError(f"release: {exc}") from None
        release.models += list(release.configs)
        release.requirements = list(triton_preprocess.REQUIREMENTS)
    release.request_example = client_example.script(model_name, release.contract,
                                                    release.models[-1] if len(release.models) > 1 else None)
    release.max_batch_size = parsed.max_batch_size
    inputs, outputs = triton_config.engine_io(eng)
    release.batch_note = triton_config.batch_limits(inputs, outputs, eng.cell.profiles)[2] or (
        "set by triton.max_batch_size" if params.triton.max_batch_size is not None else "")
    return notes


def _version(release: TargetRelease, ledger: versions.Ledger) -> None:
    """The release's contract changes against the latest published version's, and its version: the latest's where it
    holds this engine under the contract it was claimed with, else the next."""
    assert release.chosen is not None and release.contract is not None
    published, latest = ledger.last_published(), ledger.latest()
    if published is not None and published.contract is not None:
        release.contract_changes = release.contract.changes(published.contract)
    claimed_with = latest.contract if latest is not None else None
    release.version, release.new_version = ledger.version_for(
        release.chosen.engine_sha256, claimed_with is not None and bool(release.contract.changes(claimed_with)))


def _chain_repository(release: TargetRelease, eng: Engine, params: ReleaseStage, model_name: str, repo: Path,
                      ledger: versions.Ledger) -> list[str]:
    """An offloaded candidate's repository: one model per piece of its chain and the ensemble under the model's
    name (`triton/chain.py`), checked before anything is written."""
    chain = read_chain(eng.directory)
    engines = {i: triton_chain.PieceEngine(p.plan, p.cell.profiles) for i, p in eng.pieces.items()}
    try:
        release.contract = _contract(model_name, eng, params)
        _version(release, ledger)
        written = triton_chain.write(chain, engines, repo, model_name, release.version)
    except triton_config.ConfigError as exc:
        raise StageError(f"release: {exc}") from None
    release.repository = repo.relative_to(repo.parent.parent).as_posix()
    release.config = written.configs[written.ensemble]
    release.models = written.models
    release.max_batch_size = 0
    release.request_example = client_example.script(model_name, release.contract)
    release.batch_note = "a chain of TensorRT and ONNX Runtime pieces: no batching across it (max_batch_size 0)"
    (repo / model_name / contract.FILE).write_text(release.contract.model_dump_json(indent=2) + "\n")
    notes = [f"{release.target}: `{eng.cell.name}` is a chain: {len(eng.pieces)} TensorRT piece(s) and "
             f"{len(chain.pieces) - len(eng.pieces)} ONNX Runtime piece(s) under the ensemble '{model_name}'"]
    if params.triton.preprocess:
        notes.append(f"{release.target}: triton.preprocess is not written for a chain: its preprocessing model "
                     f"would need a second ensemble around this one")
    return notes


# beside the target's repository, never in it (Triton polls every folder of a repository as a model, and a model may
# be named "plugins"); a target's name has no dot, so `<target>.plugins` is no other target's repository
PLUGINS_SUFFIX = ".plugins"
TRITON_LOADS = "Triton's TensorRT backend: --backend-config=tensorrt,plugins=<its path> (or LD_PRELOAD)"


def ship_plugins(release: TargetRelease, loads: list[trt_plugins.PluginLoad], out_dir: Path) -> list[str]:
    """The pipeline's plugins the shipped engine was built with (every engine of the pipeline's build is), recorded
    in `release.plugins`: each library copied to `triton/<target>.plugins/<file name>` (checked against its digest
    in the stage's key) with the command that starts Triton with them loaded; a Python plugin's one-line warning
    (Triton's TensorRT backend loads libraries only)."""
    if not loads or release.chosen is None or release.repository is None:
        return []
    folder = out_dir / "triton" / f"{release.target}{PLUGINS_SUFFIX}"
    release.plugins = [_python_plugin(p) if p.python else _library_copy(p, folder, out_dir) for p in loads]
    copies = [p.file for p in release.plugins if p.file]
    if copies:
        release.server = server_command(release.repository, copies)
        release.request_example = client_example.started_by(release.request_example, release.server)
    return [f"{release.target}: `{release.chosen.name}` was built with the Python plugin {p.python} ({p.key}): "
            f"the serving process must import it (registering its creators) before it loads the engine; Triton's "
            f"TensorRT backend loads plugin libraries only, so stock Triton cannot serve it"
            for p in release.plugins if p.python]


def server_command(repository: str, copies: list[str]) -> str:
    """`tritonserver` on the repository with the libraries loaded by its TensorRT backend, run from the stage's
    output directory (Triton resolves the paths from its working directory; `$PWD` makes them absolute)."""
    paths = ";".join(f"$PWD/{c}" for c in copies)
    return f'tritonserver --model-repository=$PWD/{repository} --backend-config=tensorrt,plugins="{paths}"'


def _library_copy(plugin: trt_plugins.PluginLoad, folder: Path, out_dir: Path) -> ShippedPlugin:
    source = Path(plugin.file)
    wrong = names.problem(source.name, names.DOTTED, names.MODEL_MAX_LENGTH)
    if wrong:
        raise StageError(f"release: {plugin.key} ({plugin.label}): its file name cannot be shipped: {wrong}",
                         hint="rename the library")
    copy = folder / source.name
    if copy.exists():
        raise StageError(f"release: {plugin.key} ({plugin.label}): another declared plugin library is also named "
                         f"{source.name}", hint="give the libraries different file names")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, copy)
    digest = files.sha256(copy)
    if digest != plugin.digest:
        raise StageError(f"release: {plugin.key} ({plugin.label}) changed since the engines were keyed "
                         f"(sha256 {digest[:12]}, not {plugin.digest[:12]})", hint="run the pipeline again")
    return ShippedPlugin(key=plugin.key, label=plugin.label, file=copy.relative_to(out_dir).as_posix(),
                         sha256=digest, entry=plugin.entry, namespace=plugin.namespace, loaded_by=TRITON_LOADS)


def _python_plugin(plugin: trt_plugins.PluginLoad) -> ShippedPlugin:
    return ShippedPlugin(key=plugin.key, label=plugin.label, sha256=plugin.digest, python=plugin.python,
                         loaded_by=f"import {plugin.python} in the serving process (not Triton's TensorRT backend)")


def _environment(eng: Engine) -> ValidFor:
    built = eng.built
    env = ValidFor.model_validate(built.environment.model_dump() if built.environment else {})
    env.target = eng.cell.target
    if built.options.hardware_compatibility:
        env.hardware_compatibility = built.options.hardware_compatibility
    if built.options.version_compatible:
        env.version_compatible = built.options.version_compatible
    if built.validity:
        env.validity_here = built.validity.validity
    return env


# ---------------------------------------------------------------------------------------------- the card's sources

def _preprocessing(inputs: Inputs) -> list[dict] | None:
    pre = inputs.optional("preprocess")
    if pre is None:
        return None
    data = files.read_json(pre.path, files.RECORD_BYTES)
    return list(data.get("steps") or []) if isinstance(data, dict) else None


def _parity(inputs: Inputs) -> ParitySummary | None:
    art = inputs.optional("parity")
    if art is None:
        return None
    p = ParityReport.model_validate_json(art.path.read_text())
    return ParitySummary(verdict=p.verdict, images=len(p.images), top1=p.model.top1 if p.model else None,
                         tolerances=p.tolerances)


def _prepared(inputs: Inputs) -> PrepareReport | None:
    art = inputs.optional("preparation")
    return None if art is None else PrepareReport.model_validate_json(art.path.read_text())


def _rewrites(inputs: Inputs) -> list[RewriteRecord]:
    """The rewrites prepare kept in the model (none without a prepare stage)."""
    prepared = _prepared(inputs)
    return [] if prepared is None else [r for r in prepared.rewrites if r.kept]


def _offload(inputs: Inputs) -> OffloadRecord | None:
    """What prepare gave ONNX Runtime, where it did."""
    prepared = _prepared(inputs)
    return None if prepared is None else prepared.offload


def _plots(inputs: Inputs, verdict: ValidateReport | None, released: list[TargetRelease]) -> dict[str, Path]:
    """The pictures the card shows: validate's of each shipped engine, and benchmark's latency distributions."""
    out: dict[str, Path] = {}
    validation = inputs.optional("validation_plots")  # declared outputs of theirs, not files beside their reports
    if verdict is not None and validation is not None:
        chosen = {t.chosen.name for t in released if t.chosen}
        for c in verdict.candidates:
            if c.name in chosen:
                for rel in c.plots:
                    path = validation.path / Path(rel).name
                    if path.is_file():
                        out[f"validate: {c.name} ({Path(rel).stem.split('.')[-1]})"] = path
    bench = inputs.optional("benchmark_plots")
    if bench is not None:
        for path in sorted(bench.path.glob("*.png")):
            out[f"benchmark: {path.stem.replace('_', ' ')}"] = path
    return out


CODE = StageCode(run, report=ReleaseReport,
                 events=versions.announce,  # each new version: what deployments roll out on
                 outdated=versions.outdated)  # a later version was released since this result
