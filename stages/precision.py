"""Stage `precision`: an FP16 variant of the prepared model, with automatic FP32 fallback, and a CPU accuracy
pre-flight against the FP32 reference.

TensorRT 11 and TensorRT-RTX take precision from the ONNX itself, so the variant is an FP16 ONNX model: converted
with onnxconverter-common, keeping in FP32 the nodes whose activations (measured on sample data) or weights FP16
cannot carry, the ones the YAML blocks, and, with `fallback.max_rel_error`, those whose FP16 error is too large.
"""
from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from trtflow.artifact import Artifact, StageResult
from trtflow.errors import StageError
from trtflow.stages.compare import accuracy
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.graph import require_op_types
from trtflow.stages.ort import runner as ort_runner
from trtflow.stages.ort.ranges import magnitudes
from trtflow.stages.ort.runner import RUNTIME, session
from trtflow.stages.ort.samples import SampleSource
from trtflow.text import did_you_mean, first_line

VERSION = "2"  # 2: ranges and table bounds for random inputs
FP16_MAX = 65504.0
SIMULATED = f"{RUNTIME} (simulated precision: FP16 storage emulated per node)"


def run(params: Any, inputs: dict[str, Artifact], out_dir: Path) -> StageResult:
    if params.to != "fp16":
        raise StageError(f"precision: to: {params.to} is not supported yet; use fp16")
    work = out_dir / "work"
    work.mkdir()
    model = model_io.load(inputs["model"].path)
    name_nodes(model)
    ref_path = work / "fp32.onnx"
    model_io.save(model, ref_path)
    ref = session(ref_path)
    data = SampleSource(params.data, inputs, ref.get_inputs(), "precision", model)
    calib, hold = data.split(params.holdout)
    hold = hold or calib  # nothing to hold out: check accuracy on the samples used for the analysis
    data.check_reference(ref)

    blocked = block_list(model, params, magnitudes(model, work, data.feeds(calib)) if params.fallback.auto else {})
    if params.fallback.max_rel_error is not None:
        refined = too_inaccurate(model, emulated(model, params, blocked), work, data, calib,
                                 params.fallback.max_rel_error, blocked)
        blocked.update({n: f"FP16 error above max_rel_error {params.fallback.max_rel_error:g}" for n in refined})
    fp16 = convert(model, params, blocked)
    out = out_dir / "model.onnx"
    model_io.save(fp16, out)
    try:
        real = session(out)
        ort_runner.run(real, feed16(real, next(data.feeds(hold))))
    except Exception as exc:  # noqa: BLE001 - a converter bug shows up as an invalid graph here
        raise StageError(f"precision: the FP16 model does not run in ONNX Runtime: {first_line(exc)}; "
                         f"block the op type it names with block_ops") from None

    sim_path = work / "emulated.onnx"
    model_io.save(emulated(model, params, blocked), sim_path)
    sim = session(sim_path)
    cmp = accuracy.Comparison()
    for feed in data.feeds(hold):
        cmp.add(ort_runner.run(ref, feed), ort_runner.run(sim, feed))
    acc = cmp.result(SIMULATED)
    shutil.rmtree(work)

    total = len(model.graph.node)
    report = {"to": "fp16", "nodes": total, "kept_fp32": blocked, "data": data.label,
              "calibration_samples": len(calib), "holdout_samples": len(hold),
              "fallback": params.fallback.model_dump(), "accuracy": acc}
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    metrics = {"kept_fp32": len(blocked), "nodes": total,
               "worst_max_abs": max((o["max_abs"] for o in acc["outputs"].values()), default=None),
               "nan_inf": sum(o["nan"] + o["inf"] for o in acc["outputs"].values())}
    warnings = []
    if metrics["nan_inf"]:
        warnings.append(f"the FP16 variant produces {metrics['nan_inf']} NaN/Inf values on held-out samples")
    return StageResult(outputs={"model": out, "report": out_dir / "report.json"}, summary=summary(report),
                       metrics=metrics, warnings=warnings)


def feed16(sess: Any, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same inputs, cast to FP16 where the variant's inputs are FP16 (keep_io_types: false)."""
    return {i.name: feed[i.name].astype(np.float16) if i.type == "tensor(float16)" else feed[i.name]
            for i in sess.get_inputs()}


def name_nodes(model: onnx.ModelProto) -> None:
    """Nodes need names to be kept in FP32 by name."""
    taken = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def block_list(model: onnx.ModelProto, params: Any, peak: dict[str, float]) -> dict[str, str]:
    """node name -> why it stays FP32."""
    names = [n.name for n in model.graph.node]
    for pattern in params.block_nodes:
        if not any(re.fullmatch(pattern, n) for n in names):
            raise StageError(f"precision: block_nodes: no node matches '{pattern}'{did_you_mean(pattern, names)}")
    require_op_types(model, params.block_ops, "precision: block_ops")
    inits = {i.name: i for i in model.graph.initializer}
    fb = params.fallback
    blocked: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type in params.block_ops:
            blocked[node.name] = f"op type {node.op_type} in block_ops"
        elif any(re.fullmatch(p, node.name) for p in params.block_nodes):
            blocked[node.name] = "named in block_nodes"
        elif fb.auto:
            big = max(((peak.get(t, 0.0), t) for t in list(node.input) + list(node.output) if t in peak),
                      default=(0.0, ""))
            if big[0] > fb.data_max:
                blocked[node.name] = f"|{big[1]}| reaches {big[0]:.4g} > data_max {fb.data_max:g}"
                continue
            for t in node.input:
                if t in inits and inits[t].data_type == onnx.TensorProto.FLOAT:
                    w = float(np.abs(numpy_helper.to_array(inits[t])).max(initial=0.0))
                    if w > fb.init_max:
                        blocked[node.name] = f"weight {t} reaches {w:.4g} > init_max {fb.init_max:g}"
                        break
    return blocked


def convert(model: onnx.ModelProto, params: Any, blocked: dict[str, str]) -> onnx.ModelProto:
    from onnxconverter_common import float16

    src = onnx.ModelProto()
    src.CopyFrom(model)
    try:
        with warnings.catch_warnings():  # it warns once per tiny weight flushed to 1e-7: thousands of lines
            warnings.simplefilter("ignore", UserWarning)
            return float16.convert_float_to_float16(
                src, keep_io_types=params.keep_io_types, max_finite_val=FP16_MAX,  # default 1e4 clamps silently
                op_block_list=list(float16.DEFAULT_OP_BLOCK_LIST) + list(params.block_ops),  # replaces the list
                node_block_list=list(blocked), check_fp16_ready=False)
    except Exception as exc:  # noqa: BLE001
        raise StageError(f"precision: FP16 conversion failed: {first_line(exc)}") from None


def emulated(model: onnx.ModelProto, params: Any, blocked: dict[str, str]) -> onnx.ModelProto:
    from onnxconverter_common import float16

    from trtflow.stages.onnx.fp16_emulation import emulate
    return emulate(model, set(blocked), set(float16.DEFAULT_OP_BLOCK_LIST) | set(params.block_ops),
                   params.keep_io_types)


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
        r = dict(zip(common, ref.run(common, feed)))
        c = dict(zip(common, cand.run(common, feed)))
        for name in common:
            a, b = r[name].astype(np.float64), c[name].astype(np.float64)
            scale = float(np.abs(a).max(initial=0.0)) or 1.0
            worst[name] = max(worst.get(name, 0.0), float(np.abs(a - b).max(initial=0.0)) / scale)
    producer = {o: n.name for n in model.graph.node for o in n.output}
    return sorted({producer[t] for t, e in worst.items() if e > limit and producer.get(t) not in blocked})


def summary(r: dict[str, Any]) -> str:
    kept = r["kept_fp32"]
    lines = [f"### precision · FP16 · {len(kept)} of {r['nodes']} nodes kept in FP32", "",
             f"sample data: {r['data']} · {r['calibration_samples']} for the fallback analysis, "
             f"{r['holdout_samples']} held out for the accuracy check", "",
             f"**CPU accuracy pre-flight** ({r['accuracy']['runtime']}, not a TensorRT number), "
             f"FP16 variant vs FP32 reference:", ""] + accuracy.table(r["accuracy"])
    if kept:
        lines += ["", "| node kept in FP32 | why |", "|---|---|"]
        lines += [f"| `{n}` | {why} |" for n, why in list(kept.items())[:40]]
        if len(kept) > 40:
            lines.append(f"| ... | and {len(kept) - 40} more (report.json) |")
    return "\n".join(lines) + "\n"
