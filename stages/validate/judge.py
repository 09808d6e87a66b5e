"""Validate's judging step: a candidate's measured comparison through the accuracy gate (a verdict per shape set,
the total carrying every violation), which candidates may be deployed, and how the stage words its failure and
its warnings. Functions over typed records: no model runs here."""
from __future__ import annotations

from dataclasses import dataclass

from trtflow import names
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.precisions import Precision
from trtflow.stages.compare import gate
from trtflow.stages.compare.records import Accuracy
from trtflow.stages.trt.engines import Candidate
from trtflow.stages.validate import measure
from trtflow.stages.validate.report import CandidateResult, Repair, ShapeResult, shapes_text


@dataclass
class Verdict:
    shipped: list[str]  # candidates that pass: the only ones later stages measure or release
    not_shipped: dict[str, str]  # candidate -> why it must not be deployed
    unexcused: list[str]  # failing candidates no passing repaired candidate replaces: they fail the stage
    optional: list[str]  # failing candidates of optional variants: left out, no failure of the stage


def verdict(checked: list[CandidateResult], fixes: list[Candidate], optional: set[str] = frozenset()) -> Verdict:
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
    return Verdict([r.name for r in checked if r.passed], not_shipped,
                    [n for n in not_shipped if n not in replaced and n not in left_out], left_out)


def viable(rep: Repair, params: ValidateStage) -> bool:
    """A repair that gives back at most `repair_max_giveback` of the variant's low-precision nodes."""
    return not rep.of or len(rep.nodes) <= params.repair_max_giveback * rep.of


def failure_line(failed: list[CandidateResult], checked: list[CandidateResult], rep: Repair | None,
                  params: ValidateStage) -> str:
    first = failed[0]
    line = (f"validate: {len(failed)} of {len(checked)} candidate(s) fail and must not be deployed; {first.name} "
            f"({first.runtime}): {first.violations[0] if first.violations else 'fails'}")
    if rep is None or not rep.variant or first.variant != rep.variant:
        return line + ("; set repair: true to search for the nodes to keep in higher precision"
                       if rep is None and first.precision in ("fp16", "int8") else "")
    lower = "FP16 or FP32" if rep.precision == "int8" else "FP32 (or BF16)"
    if rep.passed and not viable(rep, params):
        return (f"validate: {rep.precision.upper()} is not viable for this model at these tolerances: {first.name} "
                f"fails ({first.violations[0] if first.violations else 'fails'}), and passing needs {len(rep.nodes)} "
                f"of its {rep.of} {rep.precision.upper()} nodes given back ({len(rep.nodes) / rep.of:.0%} > "
                f"repair_max_giveback {params.repair_max_giveback:.0%}); deploy the {lower} variant, or loosen the "
                f"tolerance if the task allows it")
    if not rep.passed and not viable(rep, params):
        return (f"validate: {rep.precision.upper()} is not viable for this model at these tolerances: {first.name} "
                f"fails ({first.violations[0] if first.violations else 'fails'}), and giving back {len(rep.nodes)} "
                f"of its {rep.of} {rep.precision.upper()} nodes ({len(rep.nodes) / rep.of:.0%}, past "
                f"repair_max_giveback {params.repair_max_giveback:.0%}) still fails; deploy the {lower} variant, or "
                f"loosen the tolerance if the task allows it")
    if not rep.passed:
        return line + (f"; repair found no passing set within {params.repair_rounds} rounds (raise repair_rounds, "
                       f"or deploy the {lower} variant)")
    return line + "; its repaired engine(s) did not build or pass (see the report)"


def warnings(checked: list[CandidateResult], repaired: Repair | None, params: ValidateStage) -> list[str]:
    """What the report and the run say beside the verdict: each candidate's warnings, data that cannot tell, the
    engines simulated here and why, and the repair's."""
    warnings = [w for r in checked for w in r.warnings]
    mostly_fp32 = {r.variant: r.composition.mostly_fp32(r.precision) for r in checked if r.composition}
    warnings += [f"variant '{variant}': {w}" for variant, w in mostly_fp32.items() if w]
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
    if repaired and repaired.passed and repaired.nodes and viable(repaired, params):
        warnings.append(f"variant '{repaired.variant}' fails as built; giving back {len(repaired.nodes)} of its "
                        f"{repaired.of} {repaired.precision.upper()} node(s) repairs it (output 'repaired', engines "
                        f"in output 'engines'); make it permanent in the pipeline file:\n{repaired.yaml}")
    return warnings


def excluded(checked: list[CandidateResult], verdict: Verdict, repaired: Repair | None,
              params: ValidateStage) -> dict[str, str]:
    """Optional variants that failed -> why: left out of benchmark and release."""
    left_out: dict[str, list[CandidateResult]] = {}
    for r in checked:
        if r.name in verdict.optional:
            left_out.setdefault(names.unrepaired(r.variant), []).append(r)
    return {variant: failure_line(mine, checked, repaired, params).removeprefix("validate: ")
            for variant, mine in sorted(left_out.items())}


def judged(measured: measure.Measured, sets: list[measure.ShapeSet], runtime: str, precision: Precision,
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
