"""Stage `precision`: an FP16 variant of the prepared model, with automatic FP32 fallback, and a CPU accuracy
pre-flight against the FP32 reference.

TensorRT 11 and TensorRT-RTX take precision from the ONNX itself, so the variant is an FP16 ONNX model: converted
with onnxconverter-common, keeping in FP32 the nodes whose activations (measured on sample data) or weights FP16
cannot carry, the ones the YAML blocks, and, with `fallback.max_rel_error`, those whose FP16 error is too large.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import onnx

from trtflow.artifact import Inputs, StageResult
from trtflow.errors import StageError
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.stage_code import StageCode
from trtflow.stages.compare import gate
from trtflow.stages.onnx import fp16, model_io, offload
from trtflow.stages.onnx.composition import composition
from trtflow.stages.onnx.fp16_emulation import emulate
from trtflow.stages.onnx.graph import (
    graph_inputs,
    name_nodes,
    nodes_in_subgraphs,
    output_floors,
    require_op_types,
)
from trtflow.stages.ort import fp16_fallback, simulation
from trtflow.stages.ort import runner as ort_runner
from trtflow.stages.ort.probe import probe
from trtflow.stages.ort.ranges import Magnitudes, magnitudes
from trtflow.stages.ort.references import References
from trtflow.stages.ort.runner import FP32, session
from trtflow.stages.ort.samples import SampleSource
from trtflow.stages.precision.report import PrecisionReport
from trtflow.stages.trt import partition
from trtflow.stages.trt.env import find_tensorrt
from trtflow.stages.trt.preflight import run_preflight
from trtflow.stages.trt.records import VariantTrial
from trtflow.text import first_line, pattern_hint

VERSION = "6"  # 2: trtflow's own FP16 conversion (precision assignment, FP32 islands); sample ranges.
# 3: emulation rounds values entering FP16 nodes. 4: shape arithmetic stays FP32; the variant is trial-built.
# 5: the trial build with all its fields (typed). 6: the pre-flight simulated and measured by validate's code


def run(params: PrecisionStage, inputs: Inputs, out_dir: Path) -> StageResult:
    if params.to != "fp16":
        raise StageError(f"precision: to: {params.to} is not supported yet; use fp16")
    work = out_dir / "work"
    work.mkdir()
    model = model_io.load(inputs.one("model").path)
    name_nodes(model)
    ref_path = work / "fp32.onnx"
    model_io.save(model, ref_path)
    ref = session(ref_path, role=FP32)
    fp32 = References.of(inputs, inputs.one("model"))
    data = SampleSource(params.data, inputs, ref.get_inputs(), "precision", model)
    calib, hold = data.split(params.holdout)
    hold = hold or calib  # nothing to hold out: check accuracy on the samples used for the analysis
    data.check_reference(fp32.of_session(ref))
    gate.check_metrics("precision", params.metrics, ref)

    blocked = block_list(model, params, magnitudes(model, work, data.feeds(calib)) if params.fallback.auto else None)
    block_ops = set(params.block_ops)
    if params.fallback.max_rel_error is not None:
        sim = emulate(model, fp16.plan(model, blocked, block_ops).half, params.keep_io_types)
        refined = too_inaccurate(model, sim, work, data, calib, params.fallback.max_rel_error, blocked)
        blocked.update({n: f"FP16 error above max_rel_error {params.fallback.max_rel_error:g}" for n in refined})
    fp16_model, assignment, island = _convert(model, blocked, params, work, next(data.feeds(hold)))
    out = out_dir / "model.onnx"
    model_io.save(fp16_model, out)
    trial = _trial_build(params.preflight, out, ref_path, next(data.feeds(hold)), model, work)
    made = composition(fp16_model, {k: list(v.shape) for k, v in next(data.feeds(hold)).items()})
    # the FP16 variant simulated and measured as validate simulates and measures it (simulation.py)
    sim = simulation.simulate(out, model, "fp16")
    acc = simulation.measure(fp32.of_session(ref), sim.session(work, "fp16"), data.feeds(hold), sim, params.metrics,
                             output_floors(model), "precision")
    shutil.rmtree(work)
    warnings = gate.preflight_warnings(acc, "fp16", params.metrics, "the FP16 variant")
    if trial.warning:
        warnings.append(trial.warning)
    if mostly_fp32 := made.mostly_fp32("fp16"):
        warnings.append(mostly_fp32)
    if not assignment.half:
        inside = nodes_in_subgraphs(model)
        why = (f"{len(inside)} of its nodes sit inside control flow ({', '.join(sorted({o for o, _ in inside})[:3])})"
               f", which is not converted" if inside else "every node is blocked or kept FP32 for validity")
        warnings.insert(0, f"the FP16 variant has no FP16 compute: {why}; it is the FP32 model under another name "
                           f"(no faster), and validate's repair has nothing to give back")

    total = len(model.graph.node)
    report = PrecisionReport(to="fp16", nodes=total, fp16_nodes=len(assignment.half), kept_fp32=assignment.fp32,
                             island=island, data=data.label, calibration_samples=len(calib),
                             holdout_samples=len(hold), fallback=params.fallback.model_dump(),
                             accuracy=acc, trial_build=trial, warnings=warnings, composition=made)
    (out_dir / "report.json").write_text(report.model_dump_json(indent=2) + "\n")
    metrics = {"kept_fp32": len(assignment.fp32), "fp16_nodes": len(assignment.half), "nodes": total,
               "worst_max_abs": max((o.max_abs for o in acc.outputs.values()), default=None),
               "nan_inf": acc.nonfinite(), "fp32_mac_share": made.mac_share.fp32}
    return StageResult(outputs={"model": out, "report": out_dir / "report.json"}, summary=report.summary(),
                       metrics=metrics, warnings=report.warnings)


def _convert(model: onnx.ModelProto, blocked: dict[str, str], params: PrecisionStage, work: Path,
             probe_feed: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, fp16.Plan, dict[str, str]]:
    """The FP16 variant, checked to load and run in ONNX Runtime on one sample (in a child process: ONNX Runtime
    can crash on FP16 graphs), with its FP32 island."""
    def runs(candidate: onnx.ModelProto) -> None:
        path = work / "candidate.onnx"
        model_io.save(candidate, path)
        probe(path, probe_feed, work)

    try:
        return fp16.convert_valid(model, blocked, set(params.block_ops), params.keep_io_types, runs)
    except fp16.InvalidFP16 as exc:
        kept = f" (after keeping {', '.join(list(exc.island)[:5])} in FP32)" if exc.island else ""
        raise StageError(f"precision: no valid FP16 variant found{kept}: {first_line(exc.error)}") from None


def _trial_build(mode: str, variant: Path, fp32: Path, feed: dict[str, np.ndarray],
                 model: onnx.ModelProto, work: Path) -> VariantTrial:
    """Build the FP16 variant with TensorRT at a profile from half the sample's dynamic dimensions up to the
    sample's shapes (some FP16 graphs fail only with dynamic dimensions: a Myelin type clash in a YOLO head's
    anchor grid). A variant that does not build where the FP32 model does fails the stage."""
    if mode == "off":
        return VariantTrial(reason="disabled (preflight: off)")
    if find_tensorrt() is None:
        return VariantTrial(reason="no TensorRT flavour is installed")
    if offload.read(model) is not None:
        return _chain_trial(variant, feed, work)
    shapes = {name: list(x.shape) for name, x in feed.items()}
    dynamic = {vi.name: [not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim]
               for vi in graph_inputs(model)}
    low = {name: [max(1, s // 2) if dyn else s for s, dyn in zip(shape, dynamic.get(name, []))]
           for name, shape in shapes.items()}
    report = run_preflight(variant, shapes, min_shapes=low)
    trial = report.trial_build
    if not report.ran or trial is None:
        return VariantTrial(reason=report.reason or "the FP16 variant did not parse")
    result = VariantTrial(ran=True, runtime=report.runtime, **trial.model_dump(exclude={"log"}))
    if trial.ok or trial.needs_gpu:
        return result
    fp32_trial = run_preflight(fp32, shapes, min_shapes=low).trial_build
    where = f"{(report.runtime or '').removesuffix(' parser')}, profile {low} .. {shapes}"
    if fp32_trial is not None and fp32_trial.ok:
        raise StageError(f"precision: the FP16 variant does not build ({where}) while the FP32 model does: "
                         f"{trial.error}; keep the nodes it names in FP32 with block_nodes, or set "
                         f"preflight: off to go on")
    result.warning = (f"neither the FP16 variant nor the FP32 model builds ({where}): {trial.error}; "
                      f"the build stage will fail the same way at such shapes")
    return result


def _chain_trial(variant: Path, feed: dict[str, np.ndarray], work: Path) -> VariantTrial:
    """An offloaded variant's trial: each of its TensorRT pieces built on its own (`partition.trials`); a piece
    that does not build fails the stage, naming its nodes."""
    chain = offload.cut(variant, work / "chain")
    assert chain is not None
    built = partition.trials(chain, feed)
    failed = next((t for t in built if not t.ok), None)
    if failed is not None:
        error = failed.build.error if failed.build else failed.reason or "it did not parse"
        raise StageError(f"precision: a TensorRT piece of the FP16 variant does not build ({len(failed.nodes)} "
                         f"nodes, from {failed.nodes[0]}): {error}; keep its nodes in FP32 with block_nodes, or set "
                         f"preflight: off to go on")
    builds = [t.build for t in built if t.build is not None]
    return VariantTrial(ran=True, ok=True, runtime="TensorRT pieces of the chain (partial offload)",
                        shapes={n: list(x.shape) for n, x in feed.items()},
                        seconds=round(sum(b.seconds or 0 for b in builds), 3),
                        engine_bytes=sum(b.engine_bytes or 0 for b in builds))


def block_list(model: onnx.ModelProto, params: PrecisionStage, seen: Magnitudes | None) -> dict[str, str]:
    """node name -> why it stays FP32 (`seen`: the activations on the sample data, with `fallback.auto`)."""
    names = [n.name for n in model.graph.node]
    for pattern in params.block_nodes:
        if not any(re.fullmatch(pattern, n) for n in names):
            raise StageError(f"precision: block_nodes: no node matches '{pattern}'{pattern_hint(pattern, names)}")
    require_op_types(model, params.block_ops, "precision: block_ops")
    blocked = offload.kept_float(model)
    for node in model.graph.node:
        if node.op_type in params.block_ops:
            blocked[node.name] = f"op type {node.op_type} in block_ops"
        elif any(re.fullmatch(p, node.name) for p in params.block_nodes):
            blocked[node.name] = "named in block_nodes"
    if seen is None:
        return blocked
    return fp16_fallback.out_of_range(model, seen, params.fallback.data_max, params.fallback.init_max, blocked)


def too_inaccurate(model: onnx.ModelProto, sim: onnx.ModelProto, work: Path, data: SampleSource,
                   calib: range, limit: float, blocked: dict[str, str]) -> list[str]:
    """Nodes (not yet blocked) whose output differs from FP32 by more than `limit`, relative to its magnitude,
    in the per-node FP16 emulation."""
    from trtflow.stages.ort.ranges import expose_all

    ref_path, cand_path = work / "ref_all.onnx", work / "fp16_all.onnx"
    ref_names = set(expose_all(model, ref_path))
    cand_names = {n for n in expose_all(sim, cand_path) if "__fp" not in n}
    common = sorted(ref_names & cand_names)
    ref, cand = session(ref_path), session(cand_path)
    worst: dict[str, float] = {}
    for feed in data.feeds(calib[:4]):
        diff, scale = dict.fromkeys(common, 0.0), dict.fromkeys(common, 0.0)
        for part, c in ort_runner.parts(cand, feed, common):  # the batch in parts that fit the memory budget (the
            r = ort_runner.whole(ref, part, common)  # emulation, more tensors than the reference, sizes them)
            for name in common:
                a, b = r[name].astype(np.float64), c[name].astype(np.float64)
                scale[name] = max(scale[name], float(np.abs(a).max(initial=0.0)))
                diff[name] = max(diff[name], float(np.abs(a - b).max(initial=0.0)))
        for name in common:
            worst[name] = max(worst.get(name, 0.0), diff[name] / (scale[name] or 1.0))
    producer = {o: n.name for n in model.graph.node for o in n.output}
    return sorted({producer[t] for t, e in worst.items() if e > limit and producer.get(t) not in blocked})


CODE = StageCode(run, report=PrecisionReport)  # what the flow reaches the kind through (trtflow/stage_code.py)
