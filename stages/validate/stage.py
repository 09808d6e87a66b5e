"""Stage `validate`: every candidate (each engine of a build, or each model variant when there is no build)
against the FP32 reference on ONNX Runtime, at every shape of its profiles (a verdict per shape); per output
metrics gated by tolerances; NaN/Inf; for a failing candidate, the first node that goes wrong and, with
`repair: true`, the nodes to keep in higher precision.

A candidate runs on TensorRT where this machine can execute its engine; otherwise its exact ONNX variant is
simulated on ONNX Runtime (FP16 through the per-node FP16 emulation, Q/DQ as fake quantization) and every
number says so.

`run` composes the steps: `measure` (each candidate against the reference), `judge` (the gate, the verdict, the
words), `repair` (the nodes to give back, rebuilt and measured again), `labelling` (accuracy against labels).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from trtflow import names, progress
from trtflow.artifact import Inputs, StageResult
from trtflow.decisions import Decision
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stage_code import StageCode
from trtflow.stages.compare import gate
from trtflow.stages.compare.plots import error_histograms, layer_drift
from trtflow.stages.compare.records import Labelled, Layerwise
from trtflow.stages.onnx import model_io, offload
from trtflow.stages.onnx.composition import composition
from trtflow.stages.onnx.records import Composition
from trtflow.stages.onnx.split import ChainSession
from trtflow.stages.ort import layerwise, memory, qdq, simulation
from trtflow.stages.ort import runner as ort_runner
from trtflow.stages.ort.runner import CANDIDATE, RUNTIME, session
from trtflow.stages.ort.samples import Feeds, SampleSource
from trtflow.stages.trt import building
from trtflow.stages.trt.engines import PLAN, VARIANT, Candidate, engine_candidates
from trtflow.stages.trt.records import Cell
from trtflow.stages.validate import judge, labelling, measure, repair
from trtflow.stages.validate.report import CandidateResult, Reference, Repair, ValidateReport
from trtflow.text import did_you_mean

VERSION = "10"  # 2: layerwise statistics from the squared difference (exact 1 - cosine near 1); 3: localized
# on the samples whose outputs are off the most. 4: repair grows by doubling, then bisects; INT8 rebuilt from the
# variant's recipe; RMS error per node. 5: task metrics; a failing candidate fails the stage unless its repaired
# engine (built here) passes; a repair past repair_max_giveback is none; negligible errors on an output's scale.
# 6: each candidate's accuracy records its task metrics' directions (what release's max_accuracy_drop weighs).
# 7: file data made into every dynamic profile's min/opt/max, a verdict per shape; repair checked at the failing ones
# 8: the graph measured named; a reference that does not vary with its input warned of; first node past its bound
# and largest drift apart; masks and sentinels apart from FP16 overflow. 9: the candidate's total accuracy (what the
# report keeps) carries its metrics' directions too (issue #51, item 1: a release weighing a function's metric failed)
# 10: regression and decision metrics; a declared top-k that cannot fail refused; an output records that it has no
# declared task metric (task: false: release weighs its cosine, not the top-1 every (batch, classes) output gets)


@dataclass
class _Job:
    """What every candidate's check shares."""
    params: ValidateStage
    inputs: Inputs
    reference: measure.ReferenceModel
    work: Path
    out_dir: Path
    sims: dict[str, simulation.Simulation] = field(default_factory=dict)  # variant -> its simulation
    labels: labelling.LabelSet | None = None  # the data's ground truth (`labels:`)
    reference_labelled: Labelled | None = None  # FP32's accuracy against them
    compositions: dict[Path, Composition] = field(default_factory=dict)  # a variant's ONNX -> its compute by precision


def run(params: ValidateStage, inputs: Inputs, out_dir: Path) -> StageResult:
    work = out_dir / "work"
    work.mkdir()
    job = _Job(params, inputs, measure.ReferenceModel.load(inputs, work), work, out_dir)
    gate.check_names("validate", "tolerances", params.tolerances,
                     [o.name for o in job.reference.session.get_outputs()])
    gate.check_metrics("validate", params.metrics, job.reference.session)
    if params.labels is not None:
        job.labels = labelling.LabelSet(params, inputs, job.reference.model,
                                        [o.name for o in job.reference.session.get_outputs()])
    candidates = engine_candidates(inputs.optional("engines"), inputs.many("models"), "validate",
                                   exclude=inputs.one("reference").digest)
    target = _repair_target(params, candidates) if params.repair else None
    (out_dir / "plots").mkdir()
    results = []
    for n, cand in enumerate(candidates, 1):
        progress.report("validating candidates", n - 1, len(candidates))
        results.append(_validate(job, cand))
    progress.report("validating candidates", len(candidates), len(candidates))
    outputs = _Outputs(out_dir / "report.json", out_dir / "plots")
    checked = [r for r, _ in results]
    repaired, fixes, warnings = None, [], []
    if params.repair:
        repaired, fixes, rechecked, warnings = _repair_and_recheck(job, target, candidates, results, outputs)
        checked += rechecked
    shutil.rmtree(work)

    verdict = judge.verdict(checked, fixes, set(params.optional))
    warnings += judge.warnings(checked, repaired, params)
    failed = [r for r in checked if r.name in verdict.unexcused]
    if not verdict.shipped and not failed:  # every variant optional, and every one failed: nothing may ship
        failed = [r for r in checked if not r.passed]
    excluded = judge.excluded(checked, verdict, repaired, params)
    warnings += [f"optional variant '{variant}' excluded from benchmark and release: {why}"
                 for variant, why in excluded.items()]
    report = ValidateReport(reference=Reference(model=inputs.one("reference").origin, runtime=RUNTIME),
                            data=checked[0].data, candidates=checked, repair=repaired, passed=not failed,
                            shipped=verdict.shipped, not_shipped=verdict.not_shipped, excluded=excluded,
                            warnings=warnings, labelled=job.reference_labelled)
    outputs.report.write_text(report.model_dump_json(indent=2) + "\n")
    decided = [Decision(action="shipped", subject=n) for n in verdict.shipped]
    decided += [Decision(action="replaced", subject=n, why=verdict.not_shipped[n])
                for n in sorted(verdict.not_shipped) if n not in verdict.optional]
    decided += [Decision(action="excluded", subject=variant, why=why) for variant, why in excluded.items()]
    result = StageResult(outputs=outputs.paths(), summary=report.summary(), warnings=warnings, decisions=decided,
                         metrics={"candidates": len(checked), "failed": len(failed), "shipped": verdict.shipped,
                                  "not_shipped": sorted(verdict.not_shipped), "excluded": excluded,
                                  "left_out": sorted(verdict.optional),
                                  "worst_cosine": min((o.cosine for r in checked
                                                       for o in r.accuracy.outputs.values()), default=None),
                                  # the FP32 reference's outputs: samples computed, and read from the store
                                  "fp32_computed": job.reference.kept.computed,
                                  "fp32_reused": job.reference.kept.reused})
    if failed:
        raise StageFailed(judge.failure_line(failed, checked, repaired, params), result)
    return result


def _repair_and_recheck(job: _Job, target: Candidate | None, candidates: list[Candidate], results: list,
                        outputs: _Outputs) -> tuple[Repair, list[Candidate], list[CandidateResult], list[str]]:
    """`repair: true`: the repair searched for (output 'repaired': the repaired model, or the variant as it was),
    and where it is viable, the repaired variant's engines built (output 'engines') and validated. The repair, the
    repaired candidates, their results and the warnings of building them."""
    outputs.repaired, outputs.engines = job.out_dir / "repaired.onnx", job.out_dir / "engines"
    outputs.engines.mkdir()
    if target is None:
        shutil.copy(job.reference.path, outputs.repaired)
        return Repair(variant="", precision="", passed=True,
                      note="no candidate runs in FP16 or INT8 (the variants kept everything in FP32): nothing to "
                           "repair"), [], [], []
    repaired = _repair(job, target, candidates, results)
    if repaired.model is not None:
        model_io.save(repaired.model, outputs.repaired)
    else:
        shutil.copy(target.model, outputs.repaired)
    if not (judge.viable(repaired, job.params) and repaired.passed and repaired.nodes):
        return repaired, [], [], []
    fixes, warnings = _repaired_candidates(target, candidates, [r for r, _ in results], outputs.repaired,
                                           outputs.engines)
    rechecked = []
    for n, cand in enumerate(fixes, 1):
        progress.report("validating repaired candidates", n - 1, len(fixes))
        rechecked.append(_validate(job, cand)[0])
    return repaired, fixes, rechecked, warnings


@dataclass
class _Outputs:
    """The stage's outputs: its report and its plots; with `repair: true`, the repaired model and its engines."""
    report: Path
    plots: Path
    repaired: Path | None = None
    engines: Path | None = None

    def paths(self) -> dict[str, Path]:
        return {name: path for name, path in vars(self).items() if path is not None}


def _repaired_candidates(target: Candidate, candidates: list[Candidate], checked: list[CandidateResult],
                         model: Path, engines: Path) -> tuple[list[Candidate], list[str]]:
    """The repaired variant as candidates in place of the target variant's failing ones: without engines, the
    model itself; with engines, an engine built from it per failing engine, at that engine's profiles and
    target, by the build stage's worker (each cell carries the repaired model, so later stages find it)."""
    failing = [c for c, r in zip(candidates, checked) if c.variant == target.variant and not r.passed]
    variant = names.repaired(target.variant)
    if not any(c.engine for c in failing):
        return [Candidate(variant, variant, target.precision, model, replaces=c.name) for c in failing[:1]], []
    cells = []
    for c in failing:
        cell = Cell.read(c.engine.parent)
        cells.append((c, cell.model_copy(update={"name": names.repaired(cell.name), "variant": variant,
                                                 "model": str(model)})))
    progress.report("building repaired engines", 0, len(cells))
    built = building.build_cells([cell for _, cell in cells], engines, 1)
    fixes, warnings = [], []
    for (c, cell), result in zip(cells, built):
        cell_dir = engines / cell.name
        if not result.ok:
            warnings.append(f"the repaired engine {cell.name} did not build: {result.error}")
            continue
        shutil.copy(model, cell_dir / VARIANT)
        fixes.append(Candidate(cell.name, variant, cell.precision, cell_dir / VARIANT, cell_dir / PLAN,
                               cell.backend.module, cell.profiles, replaces=c.name))
    return fixes, warnings


# --------------------------------------------------------------------------------------------- candidates

# --------------------------------------------------------------------------------------------- one candidate

@dataclass
class _Checked:
    """What the repair needs of a candidate's check: its shape sets (in the order of its per-shape rows), its
    simulated ONNX model, and the samples off the most (source, index) at the shapes it fails."""
    sets: list[measure.ShapeSet]
    sim: onnx.ModelProto
    worst: list[tuple[SampleSource, int]]


def _composition(job: _Job, cand: Candidate, sets: list[measure.ShapeSet],
                 seen: list[list[dict[str, list[int]]]]) -> Composition:
    """The candidate's variant's compute by precision, at the shapes of its profile's opt point (TensorRT tunes the
    engine for them), else the first it was checked at."""
    if cand.model not in job.compositions:
        at_opt = [shapes for s, shapes in zip(sets, seen) if s.name.endswith(".opt")]
        shapes = next((sh for group in at_opt + seen for sh in group), {})
        job.compositions[cand.model] = composition(model_io.load(cand.model), shapes)
    return job.compositions[cand.model]


def _validate(job: _Job, cand: Candidate) -> tuple[CandidateResult, _Checked]:
    params, out_dir = job.params, job.out_dir
    runtime, runner, why, sim_model = _runtime(job, cand)
    sets = measure.sample_sets(job.params, job.inputs, job.reference, cand)
    ranked: list = []
    scoring = None
    if job.labels is not None:
        scoring = measure.Scoring(job.labels.tally(), job.labels.tally() if job.reference_labelled is None else None)
    measured = measure.measure(runner, sets, job.reference, params.metrics, ranked, scoring,
                               what=f"validating {cand.name}")
    if scoring is not None and scoring.reference is not None:
        job.reference_labelled = scoring.reference.result()
    acc, rows = judge.judged(measured, sets, runtime, cand.precision, params)
    acc.graph = cand.engine.name if runtime.endswith("(unverified path)") else job.sims[cand.variant].graph
    warnings = [f"{cand.name}: the FP32 reference itself produces {o.reference_nan} NaN and "
                f"{o.reference_inf} Inf values on output '{name}': it is the model (or the data), not TensorRT"
                for name, o in acc.outputs.items() if o.reference_nan or o.reference_inf]
    result = CandidateResult(
        name=cand.name, variant=cand.variant, precision=cand.precision, runtime=runtime,
        engine=cand.engine.name if cand.engine else None, data=sets[0].source.label,
        shapes=[s for seen in measured.shapes for s in seen],
        bounds={o: {m: b for m, (b, _) in gate.bounds_for(cand.precision, o, params.tolerances, params.metrics,
                                                           metrics.task).items()}
                for o, metrics in acc.outputs.items()},
        accuracy=acc, passed=bool(acc), violations=acc.violations, not_on_tensorrt=why,
        warnings=warnings, per_shape=rows, labelled=scoring.candidate.result() if scoring is not None else None,
        composition=_composition(job, cand, sets, measured.shapes))
    # where it goes wrong is looked for in the samples of the shapes that fail (all of them when none does)
    failing = [s.source for s, row in zip(sets, rows) if not row.passed]
    checked = _Checked(sets, sim_model, measure.worst_samples([r for r in ranked if any(r[1] is f for f in failing)]
                                                       or ranked, params.locate_samples))
    slug = cand.name.replace("/", "_")
    hist = error_histograms(measured.errors, out_dir / "plots" / f"{slug}.errors.png", f"{cand.name} · {runtime}")
    result.plots = [str(hist.relative_to(out_dir))]
    if not acc and params.locate_first_bad_layer:
        bound = gate.layer_bound(cand.precision, params.tolerances)
        feeds = (source.sample(i) for source, i in checked.worst)
        qranges = qdq.representable_ranges(sim_model) if cand.precision == "int8" else None
        found = layerwise.compare(job.reference.model, sim_model, feeds, job.work, bound, qranges)
        found.on = (f"{simulation.SIMULATION.get(cand.precision, RUNTIME)}: TensorRT fuses layers, so the layerwise "
                    f"search runs on the simulated variant" if runtime.startswith("tensorrt") else runtime)
        result.layerwise = found
        pic = layer_drift(found.rows, found.first_bad, out_dir / "plots" / f"{slug}.layers.png", cand.name)
        result.plots.append(str(pic.relative_to(out_dir)))
    return result, checked


def _runtime(job: _Job, cand: Candidate) -> tuple[str, Callable[[Feeds, int], dict[str, np.ndarray]], str,
                                                 onnx.ModelProto]:
    """(runtime label, feed runner, why TensorRT was not used, the simulated ONNX model); `sims` holds each
    variant's simulation, made once however many engines the variant has."""
    requested, sims = job.params.runtime, job.sims
    if cand.variant not in sims:  # the simulation the pre-flights measure too
        sims[cand.variant] = simulation.simulate(cand.model, job.reference.model, cand.precision)
    sim = sims[cand.variant]
    label, sim_model = sim.label, sim.model
    why = ""
    if requested != "onnxruntime" and cand.engine is not None:
        from trtflow.stages.trt.runtime import EngineRunner, can_run

        ok, reason = can_run(cand.module or "tensorrt", cand.engine)
        if ok:
            eng = EngineRunner(cand.module, cand.engine)
            return f"{cand.module} engine (unverified path)", lambda f, p: eng.run(f, p), "", sim_model
        if requested == "tensorrt":
            raise StageError(f"validate: runtime: tensorrt, but engine '{cand.name}' cannot run here: {reason}; "
                             f"use runtime: auto to simulate it on ONNX Runtime")
        why = reason
    if cand.chain is not None:  # offloaded: its pieces run one after another, what crosses each cut handed on
        chain = offload.cut(sim.file(job.work, cand.variant), job.work / f"{cand.variant}.chain")
        assert chain is not None
        pieces, whole = ChainSession(chain), memory.Graph.of(sim.model)  # the chain's batch sized as the whole's
        return (f"{label}, as its chain of {len(chain.pieces)} pieces",
                lambda f, p: memory.chunked(pieces.run, f, whole),
                why or "an offloaded chain's TensorRT pieces are not run by validate yet: it runs the chain on "
                       "ONNX Runtime", sim_model)
    outputs = job.reference.kept.of_file(sim.file(job.work, cand.variant), CANDIDATE)
    return label, lambda f, p: outputs(f), why, sim_model


# ---------------------------------------------------------------------------------------------- repair

def _repair_target(params: ValidateStage, candidates: list[Candidate]) -> Candidate | None:
    """The variant to repair; None where no candidate runs in FP16/INT8 (a precision variant that kept every node
    in FP32: its precision stage warned, and there is nothing to give back)."""
    low = {c.variant: c for c in candidates if c.precision in ("fp16", "int8")}
    if params.repair_variant is not None:
        if params.repair_variant not in low:
            raise StageError(f"validate: repair_variant: '{params.repair_variant}' is not an FP16/INT8 variant "
                             f"among the candidates{did_you_mean(params.repair_variant, list(low))}"
                             + (f"; FP16/INT8 variants: {', '.join(low)}" if low else ""))
        return low[params.repair_variant]
    if len(low) > 1:
        raise StageError(f"validate: repair: true with several FP16/INT8 variants ({', '.join(low)}): name the one "
                         f"to repair and publish with repair_variant")
    return next(iter(low.values()), None)


def _repair(job: _Job, target: Candidate, candidates: list[Candidate],
            results: list[tuple[CandidateResult, _Checked]]) -> Repair:
    """Repair the target variant if any of its candidates fails; its simulation must then pass every shape those
    candidates fail at (the samples off the most, from those shapes, locate where it goes wrong); the repaired
    candidates are then validated at every shape."""
    mine = [(r, checked) for (r, checked), c in zip(results, candidates) if c.variant == target.variant]
    failing = [(r, checked) for r, checked in mine if not r.passed]
    params, work, reference = job.params, job.work, job.reference.model
    if not failing:
        return Repair(variant=target.variant, precision=target.precision, passed=True, note="nothing to repair")
    sets: list[measure.ShapeSet] = []
    for r, checked in failing:
        for shape_set, row in zip(checked.sets, r.per_shape):
            if not row.passed and shape_set.name not in {s.name for s in sets}:
                sets.append(shape_set)
    first_r, first_checked = failing[0]
    variant = model_io.load(target.model)
    locate_feeds = [source.sample(i) for source, i in first_checked.worst]
    bound = gate.layer_bound(target.precision, params.tolerances)

    def check(sim: onnx.ModelProto) -> list[str]:
        path = work / "repair_sim.onnx"
        model_io.save(sim, path)
        sess = session(path)
        measured = measure.measure(lambda f, p: ort_runner.run(sess, f), sets, job.reference, params.metrics)
        return judge.judged(measured, sets, RUNTIME, target.precision, params)[0].violations

    def locate(sim: onnx.ModelProto) -> Layerwise:
        qranges = qdq.representable_ranges(sim) if target.precision == "int8" else None
        return layerwise.compare(reference, sim, iter(locate_feeds), work, bound, qranges)

    first = first_r.layerwise or locate(first_checked.sim)
    if target.precision == "fp16":
        how = repair.fp16_variant(reference, variant, work, locate_feeds[0])
    else:
        how = repair.int8_variant(job.reference.path, reference, variant, work)
    found = repair.search(how, first, check, locate, params.repair_rounds, target.variant, target.precision,
                          int(params.repair_max_giveback * how.size))
    for h in found.rounds:
        h.violations = h.violations[:3]
    found.shapes = [s.name for s in sets]
    return found


# ------------------------------------------------------------------------------------------------ data


CODE = StageCode(run, report=ValidateReport)  # what the flow reaches the kind through (trtflow/stage_code.py)
