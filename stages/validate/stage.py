"""Stage `validate`: every candidate (each engine of a build, or each model variant when there is no build)
against the FP32 reference on ONNX Runtime, at every shape of its profiles (a verdict per shape); per output
metrics gated by tolerances; NaN/Inf; for a failing candidate, the first node that goes wrong and, with
`repair: true`, the nodes to keep in higher precision.

A candidate runs on TensorRT where this machine can execute its engine; otherwise its exact ONNX variant is
simulated on ONNX Runtime (FP16 through the per-node FP16 emulation, Q/DQ as fake quantization) and every
number says so.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx

from trtflow import names, progress
from trtflow.artifact import Inputs, StageResult
from trtflow.decisions import Decision
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.precisions import Precision
from trtflow.stages.compare import gate
from trtflow.stages.compare import labels as labels_mod
from trtflow.stages.compare.accuracy import Accuracy, Comparison
from trtflow.stages.compare.plots import error_histograms, layer_drift
from trtflow.stages.compare.tensor_stats import TensorStats
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.graph import name_nodes, output_floors
from trtflow.stages.ort import layerwise, qdq, simulation
from trtflow.stages.ort import runner as ort_runner
from trtflow.stages.ort.runner import RUNTIME, session
from trtflow.stages.ort.samples import Feeds, SampleSource
from trtflow.stages.trt import building
from trtflow.stages.trt.engines import PLAN, VARIANT, Candidate, Cell, engine_candidates
from trtflow.stages.validate import labelling, repair
from trtflow.stages.validate.repair import Repair
from trtflow.stages.validate.report import CandidateResult, Reference, ShapeResult, ValidateReport, shapes_text
from trtflow.text import did_you_mean

VERSION = "9"  # 2: layerwise statistics from the squared difference (exact 1 - cosine near 1); 3: localized
# on the samples whose outputs are off the most. 4: repair grows by doubling, then bisects; INT8 rebuilt from the
# variant's recipe; RMS error per node. 5: task metrics; a failing candidate fails the stage unless its repaired
# engine (built here) passes; a repair past repair_max_giveback is none; negligible errors on an output's scale.
# 6: each candidate's accuracy records its task metrics' directions (what release's max_accuracy_drop weighs).
# 7: file data made into every dynamic profile's min/opt/max, a verdict per shape; repair checked at the failing ones
# 8: the graph measured named; a reference that does not vary with its input warned of; first node past its bound
# and largest drift apart; masks and sentinels apart from FP16 overflow. 9: the candidate's total accuracy (what the
# report keeps) carries its metrics' directions too (issue #51, item 1: a release weighing a function's metric failed)
ERROR_SAMPLE = 200_000  # absolute errors kept per output for the histogram


@dataclass
class _Reference:
    """The FP32 reference: its model (nodes named as the precision stage names them, so node names agree), its
    file and session, and its outputs per sample, computed once however many candidates are checked."""
    model: onnx.ModelProto
    path: Path
    session: Any
    floors: dict[str, float]  # output -> its least scale (onnx.graph.output_floors)
    outputs: dict[tuple[str, str, int], dict[str, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def load(cls, source: Path, work: Path) -> "_Reference":
        model = model_io.load(source)
        name_nodes(model)
        path = work / "reference.onnx"
        model_io.save(model, path)
        return cls(model, path, session(path), output_floors(model))


@dataclass
class _Job:
    """What every candidate's check shares."""
    params: ValidateStage
    inputs: Inputs
    reference: _Reference
    work: Path
    out_dir: Path
    sims: dict[str, simulation.Simulation] = field(default_factory=dict)  # variant -> its simulation
    labels: labelling.LabelSet | None = None  # the data's ground truth (`labels:`)
    reference_labelled: labels_mod.Labelled | None = None  # FP32's accuracy against them


def run(params: ValidateStage, inputs: Inputs, out_dir: Path) -> StageResult:
    work = out_dir / "work"
    work.mkdir()
    job = _Job(params, inputs, _Reference.load(inputs.one("reference").path, work), work, out_dir)
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
    outputs = _Outputs(out_dir / "report.json")
    checked = [r for r, _ in results]
    repaired, fixes, warnings = None, [], []
    if params.repair:
        repaired, fixes, rechecked, warnings = _repair_and_recheck(job, target, candidates, results, outputs)
        checked += rechecked
    shutil.rmtree(work)

    verdict = _verdict(checked, fixes, set(params.optional))
    warnings += _warnings(checked, repaired, params)
    failed = [r for r in checked if r.name in verdict.unexcused]
    if not verdict.shipped and not failed:  # every variant optional, and every one failed: nothing may ship
        failed = [r for r in checked if not r.passed]
    excluded = _excluded(checked, verdict, repaired, params)
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
                                                       for o in r.accuracy.outputs.values()), default=None)})
    if failed:
        raise StageFailed(_failure_line(failed, checked, repaired, params), result)
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
    if not (_viable(repaired, job.params) and repaired.passed and repaired.nodes):
        return repaired, [], [], []
    fixes, warnings = _repaired_candidates(target, candidates, [r for r, _ in results], outputs.repaired,
                                           outputs.engines)
    rechecked = []
    for n, cand in enumerate(fixes, 1):
        progress.report("validating repaired candidates", n - 1, len(fixes))
        rechecked.append(_validate(job, cand)[0])
    return repaired, fixes, rechecked, warnings


def _warnings(checked: list[CandidateResult], repaired: Repair | None, params: ValidateStage) -> list[str]:
    """What the report and the run say beside the verdict: each candidate's warnings, data that cannot tell, the
    engines simulated here and why, and the repair's."""
    warnings = [w for r in checked for w in r.warnings]
    blind = next((r.accuracy.blind for r in checked if r.accuracy.blind), None)
    if blind:  # the reference and the samples are every candidate's: said once
        warnings.append(f"on validate's samples {blind}; a candidate passing here says nothing about its accuracy")
    simulated: dict[str, list[str]] = {}
    for r in checked:
        if r.not_on_tensorrt:
            simulated.setdefault(r.not_on_tensorrt, []).append(r.name)
    warnings += [f"TensorRT cannot run {len(names)} engine(s) here ({why}): their ONNX variants are simulated on "
                 f"ONNX Runtime ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
                 for why, names in simulated.items()]
    if repaired:
        warnings += repaired.warnings
    if repaired and repaired.passed and repaired.nodes and _viable(repaired, params):
        warnings.append(f"variant '{repaired.variant}' fails as built; giving back {len(repaired.nodes)} of its "
                        f"{repaired.of} {repaired.precision.upper()} node(s) repairs it (output 'repaired', engines "
                        f"in output 'engines'); make it permanent in the pipeline file:\n{repaired.yaml}")
    return warnings


def _excluded(checked: list[CandidateResult], verdict: _Verdict, repaired: Repair | None,
              params: ValidateStage) -> dict[str, str]:
    """Optional variants that failed -> why: left out of benchmark and release."""
    left_out: dict[str, list[CandidateResult]] = {}
    for r in checked:
        if r.name in verdict.optional:
            left_out.setdefault(names.unrepaired(r.variant), []).append(r)
    return {variant: _failure_line(mine, checked, repaired, params).removeprefix("validate: ")
            for variant, mine in sorted(left_out.items())}


@dataclass
class _Outputs:
    """The stage's outputs: its report; with `repair: true`, the repaired model and its engines."""
    report: Path
    repaired: Path | None = None
    engines: Path | None = None

    def paths(self) -> dict[str, Path]:
        return {name: path for name, path in vars(self).items() if path is not None}


@dataclass
class _Verdict:
    shipped: list[str]  # candidates that pass: the only ones later stages measure or release
    not_shipped: dict[str, str]  # candidate -> why it must not be deployed
    unexcused: list[str]  # failing candidates no passing repaired candidate replaces: they fail the stage
    optional: list[str]  # failing candidates of optional variants: left out, no failure of the stage


def _verdict(checked: list[CandidateResult], fixes: list[Candidate], optional: set[str] = frozenset()) -> _Verdict:
    """Which candidates may be deployed. A failing candidate is excused (still not shipped, but no failure of the
    stage) where a repaired candidate made from it passes in its place, or where its variant is optional."""
    passed = {r.name for r in checked if r.passed}
    replaced = {fix.replaces: fix.name for fix in fixes if fix.name in passed}
    not_shipped = {}
    for r in checked:
        if not r.passed:
            why = r.violations[0] if r.violations else "fails"
            not_shipped[r.name] = why + (f" (the repaired {replaced[r.name]} passes in its place)"
                                         if r.name in replaced else "")
    variant = {r.name: names.unrepaired(r.variant) for r in checked}
    left_out = [n for n in not_shipped if n not in replaced and variant[n] in optional]
    for n in left_out:
        not_shipped[n] += " (optional variant: excluded)"
    return _Verdict([r.name for r in checked if r.passed], not_shipped,
                    [n for n in not_shipped if n not in replaced and n not in left_out], left_out)


def _viable(rep: Repair, params: ValidateStage) -> bool:
    """A repair that gives back at most `repair_max_giveback` of the variant's low-precision nodes."""
    return not rep.of or len(rep.nodes) <= params.repair_max_giveback * rep.of


def _failure_line(failed: list[CandidateResult], checked: list[CandidateResult], rep: Repair | None,
                  params: ValidateStage) -> str:
    first = failed[0]
    line = (f"validate: {len(failed)} of {len(checked)} candidate(s) fail and must not be deployed; {first.name} "
            f"({first.runtime}): {first.violations[0] if first.violations else 'fails'}")
    if rep is None or not rep.variant or first.variant != rep.variant:
        return line + ("; set repair: true to search for the nodes to keep in higher precision"
                       if rep is None and first.precision in ("fp16", "int8") else "")
    lower = "FP16 or FP32" if rep.precision == "int8" else "FP32 (or BF16)"
    if rep.passed and not _viable(rep, params):
        return (f"validate: {rep.precision.upper()} is not viable for this model at these tolerances: {first.name} "
                f"fails ({first.violations[0] if first.violations else 'fails'}), and passing needs {len(rep.nodes)} "
                f"of its {rep.of} {rep.precision.upper()} nodes given back ({len(rep.nodes) / rep.of:.0%} > "
                f"repair_max_giveback {params.repair_max_giveback:.0%}); deploy the {lower} variant, or loosen the "
                f"tolerance if the task allows it")
    if not rep.passed and not _viable(rep, params):
        return (f"validate: {rep.precision.upper()} is not viable for this model at these tolerances: {first.name} "
                f"fails ({first.violations[0] if first.violations else 'fails'}), and giving back {len(rep.nodes)} "
                f"of its {rep.of} {rep.precision.upper()} nodes ({len(rep.nodes) / rep.of:.0%}, past "
                f"repair_max_giveback {params.repair_max_giveback:.0%}) still fails; deploy the {lower} variant, or "
                f"loosen the tolerance if the task allows it")
    if not rep.passed:
        return line + (f"; repair found no passing set within {params.repair_rounds} rounds (raise repair_rounds, "
                       f"or deploy the {lower} variant)")
    return line + "; its repaired engine(s) did not build or pass (see the report)"


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
    sets: list[_ShapeSet]
    sim: onnx.ModelProto
    worst: list[tuple[SampleSource, int]]


@dataclass
class _Scoring:
    """Counting against the labels during one candidate's pass: the candidate's tally, and the FP32 reference's
    (only in the first candidate's pass: the reference's outputs are every candidate's)."""
    candidate: labelling.Tally
    reference: labelling.Tally | None


def _validate(job: _Job, cand: Candidate) -> tuple[CandidateResult, _Checked]:
    params, out_dir = job.params, job.out_dir
    runtime, runner, why, sim_model = _runtime(job, cand)
    sets = _sample_sets(job, cand)
    ranked: list = []
    scoring = None
    if job.labels is not None:
        scoring = _Scoring(job.labels.tally(), job.labels.tally() if job.reference_labelled is None else None)
    measured = _measure(runner, sets, job.reference, params.metrics, ranked, scoring)
    if scoring is not None and scoring.reference is not None:
        job.reference_labelled = scoring.reference.result()
    acc, rows = _judged(measured, sets, runtime, cand.precision, params)
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
        warnings=warnings, per_shape=rows, labelled=scoring.candidate.result() if scoring is not None else None)
    # where it goes wrong is looked for in the samples of the shapes that fail (all of them when none does)
    failing = [s.source for s, row in zip(sets, rows) if not row.passed]
    checked = _Checked(sets, sim_model, _worst_samples([r for r in ranked if any(r[1] is f for f in failing)]
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


@dataclass
class _Measured:
    """A candidate against the reference: over every sample, per shape set, the input shapes seen per shape set,
    and a bounded sample of the absolute errors per output (for the histogram)."""
    total: Comparison
    per_set: list[Comparison] = field(default_factory=list)
    shapes: list[list[dict[str, list[int]]]] = field(default_factory=list)
    errors: dict[str, list[np.ndarray]] = field(default_factory=dict)


def _measure(runner: Callable[[Feeds, int], dict[str, np.ndarray]], sets: list[_ShapeSet], reference: _Reference,
             metrics: dict[str, Any], ranked: list | None = None,
             scoring: _Scoring | None = None) -> _Measured:
    """The candidate against the reference over every sample of every shape set (one comparison serves both where
    there is one set). `ranked`, when given, receives (how far the sample's outputs are off, its source, its index)
    per sample; `scoring` counts each sample file's class or text against its label, each file once, at one shape
    set."""
    measured = _Measured(Comparison(metrics, reference.floors))
    # the labels are scored at one shape: the profile's opt point where there is one (a dynamic profile's min may
    # squeeze a text line to 48 pixels), else the first
    scored = next((s for s in sets if s.name.endswith(".opt")), sets[0])
    for shape_set in sets:
        cmp = measured.total if len(sets) == 1 else Comparison(metrics, reference.floors)
        seen, source = [], shape_set.source
        for i in range(len(source)):
            feed = source.sample(i)
            shapes = {k: list(v.shape) for k, v in feed.items()}
            if shapes not in seen:
                seen.append(shapes)
            key = (shape_set.name, json.dumps(shapes), i)
            ref_cache = reference.outputs
            if key not in ref_cache:
                try:
                    ref_cache[key] = ort_runner.run(reference.session, feed)
                except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own exception types
                    raise source.failure(exc) from None
            got = runner(feed, shape_set.profile(feed))
            if scoring is not None and shape_set is scored:
                files, size = source.files_of(i), labelling.image_size(feed, source.pre)
                scoring.candidate.add(labels_mod.Scored(got, feed, files, source.pre, size))
                if scoring.reference is not None:
                    scoring.reference.add(labels_mod.Scored(ref_cache[key], feed, files, source.pre, size))
            cmp.add(ref_cache[key], got, feed)
            if cmp is not measured.total:
                measured.total.add(ref_cache[key], got, feed)
            if ranked is not None:
                ranked.append((_how_far_off(ref_cache[key], got), source, i))
            for name, r in ref_cache[key].items():
                kept = measured.errors.setdefault(name, [])
                if sum(map(len, kept)) < ERROR_SAMPLE:
                    kept.append(np.abs(r.astype(np.float64) - got[name].astype(np.float64)).ravel())
        measured.per_set.append(cmp)
        measured.shapes.append(seen)
    return measured


def _judged(measured: _Measured, sets: list[_ShapeSet], runtime: str, precision: Precision,
            params: ValidateStage) -> tuple[Accuracy, list[ShapeResult]]:
    """Each shape set through the gate (a row each), and the metrics over all samples carrying every shape's
    violations: a candidate passes only where it passes at every shape, and a violation names its shape when
    there are several."""
    rows = []
    for shape_set, cmp, seen in zip(sets, measured.per_set, measured.shapes):
        acc = gate.judge(cmp.result(runtime), precision, params.tolerances, params.check_nan_inf, params.metrics)
        rows.append(ShapeResult(name=shape_set.name, shapes=seen, data=shape_set.source.made(), samples=acc.samples,
                                outputs=acc.outputs, passed=bool(acc), violations=acc.violations))
    # the total is what the report keeps and the release weighs: it needs the directions the rows were judged with
    total = gate.with_directions(measured.total.result(runtime), params.tolerances, params.metrics)
    total.violations = [v if len(rows) == 1 else f"at {row.name} ({shapes_text(row.shapes)}): {v}"
                        for row in rows for v in row.violations]
    return total, rows


def _how_far_off(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    """One sample's worst output: 1 - cosine, as the layerwise search measures it (2 where the candidate turned
    finite values non-finite, so such a sample ranks first)."""
    worst = 0.0
    for name, r in ref.items():
        stats = TensorStats()
        stats.add(r, got[name], None)
        if stats.bad:
            return 2.0
        worst = max(worst, stats.drift)
    return worst


def _worst_samples(ranked: list, n: int) -> list[tuple[Any, int]]:
    """The n samples whose outputs are off the most: where the layerwise search looks."""
    return [(source, i) for _, source, i in sorted(ranked, key=lambda x: -x[0])[:n]]


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
    sess = sim.session(job.work, cand.variant)
    return label, lambda f, p: ort_runner.run(sess, f), why, sim_model


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
    sets: list[_ShapeSet] = []
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
        measured = _measure(lambda f, p: ort_runner.run(sess, f), sets, job.reference, params.metrics)
        return _judged(measured, sets, RUNTIME, target.precision, params)[0].violations

    def locate(sim: onnx.ModelProto) -> layerwise.Layerwise:
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

@dataclass
class _ShapeSet:
    """Samples at one shape (a profile's min, opt or max; or the data as given, where no profile is dynamic): a
    row of the report."""
    name: str  # "<profile>.<point>", or "data"
    source: SampleSource
    profile: Callable[[Feeds], int]  # a feed -> the index of the engine's profile it runs on


def _sample_sets(job: _Job, cand: Candidate) -> list[_ShapeSet]:
    """A shape set per profile and `profile_shapes` point (the same shapes once): random data drawn at it, files
    made into it (`SampleSource.at`) where a profile is dynamic. Files for static profiles (or no profile) are
    taken as they are, each fitted to a profile (or refused)."""
    params, ref = job.params, job.reference
    data = params.data
    src = SampleSource(data, job.inputs, ref.session.get_inputs(), "validate", ref.model)
    if not len(src):
        raise StageError(f"validate: data: no samples found ({src.label}); check the glob in data.images / "
                         f"data.tensors, or use data: {{random: true}}")
    if cand.profiles and (data.random or any(p.dynamic for p in cand.profiles)):
        sets: list[_ShapeSet] = []
        seen: list[dict[str, list[int]]] = []
        for index, prof in enumerate(cand.profiles):
            for point in params.profile_shapes:
                shapes = prof.at(point)
                if shapes in seen:
                    continue
                seen.append(shapes)
                sets.append(_ShapeSet(f"{prof.name}.{point}", src.at(shapes), lambda feed, i=index: i))
        return sets
    return [_ShapeSet("data", src, lambda feed: _profile_for(feed, cand))]


def _profile_for(feed: Feeds, cand: Candidate) -> int:
    if not cand.profiles:
        return 0
    for index, prof in enumerate(cand.profiles):
        if prof.fits({name: x.shape for name, x in feed.items()}):
            return index
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feed.items())
    have = "; ".join(p.describe() for p in cand.profiles)
    raise StageError(f"validate: a sample ({shapes}) fits no optimization profile of engine '{cand.name}' "
                     f"({have}): give data of shapes the engine was built for, or add a profile to the build stage")
