"""An INT8 (Q/DQ) model's unquantized remainder in FP16, as ModelOpt's ONNX PTQ writes it by default.

TensorRT 10/11 and TensorRT-RTX build Q/DQ ONNX strongly typed: what is not quantized runs in the type the graph
gives it, so a remainder left in FP32 (every activation, resize, concat and head between the INT8 layers, and the
layers left in float) runs in FP32 on the GPU, with a reformat at every INT8/FP32 boundary. Here the remainder is
converted with trtflow's FP16 conversion (fp16.py) at opset 19, the first whose QuantizeLinear/DequantizeLinear
take FP16 scales; a DequantizeLinear follows the op reading it, a QuantizeLinear the tensor it reads. The nodes FP16
cannot carry on the calibration data stay FP32 (fp16_fallback.py, the precision stage's rules), and so does each
node ONNX Runtime refuses in FP16 (the island `convert_valid` finds).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, version_converter

from trtflow.stages.onnx import fp16, model_io
from trtflow.stages.onnx.graph import default_opset
from trtflow.stages.ort import qdq
from trtflow.stages.ort.probe import probe
from trtflow.text import first_line

FP16_SCALES_OPSET = 19  # QuantizeLinear/DequantizeLinear take FP16 scales (and inputs) from opset 19 on


FP16_TINIEST = 2.0 ** -24  # the smallest positive FP16 (subnormal): a smaller scale would round to 0


class RemainderError(Exception):
    """The remainder could not be made FP16 (the opset could not be raised, or no valid FP16 graph was found)."""


def at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`model` at `opset` at least, through ONNX's version converter (node names and metadata kept)."""
    current = default_opset(model) or 0
    if current >= opset:
        return model
    try:
        converted = version_converter.convert_version(model, opset)
    except Exception as exc:  # noqa: BLE001 - the converter raises anything on ops it has no adapter for
        raise RemainderError(f"ONNX's version converter could not take the model from opset {current} to {opset} "
                             f"({first_line(exc)[:160]})") from None
    if [n.name for n in converted.graph.node] != [n.name for n in model.graph.node]:
        raise RemainderError(f"ONNX's version converter rewrote nodes going from opset {current} to {opset}")
    del converted.metadata_props[:]
    converted.metadata_props.extend(model.metadata_props)
    return converted


def convert(model: onnx.ModelProto, keep_fp32: dict[str, str], probe_feed: dict[str, np.ndarray] | None,
            work: Path) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The Q/DQ `model` with its remainder in FP16 but for `keep_fp32` (node -> why), checked to load and run in
    ONNX Runtime on `probe_feed` (each node it refuses kept FP32 too; no check without a feed), its recipe
    recording what stayed FP32. Returns the model and the nodes kept FP32 (`keep_fp32` and the island). The
    model's inputs and outputs stay FP32. Raises RemainderError."""
    upgraded = at_opset(model, FP16_SCALES_OPSET)
    if upgraded is model:
        upgraded = onnx.ModelProto()
        upgraded.CopyFrom(model)
    _fit_scales(upgraded)

    def runs(candidate: onnx.ModelProto) -> None:
        if probe_feed is not None:
            path = work / "remainder_candidate.onnx"
            model_io.save(candidate, path)
            probe(path, probe_feed, work)

    try:
        converted, _, island = fp16.convert_valid(upgraded, keep_fp32, set(), True, runs, qdq=True)
    except fp16.InvalidFP16 as exc:
        raise RemainderError(f"no valid FP16 remainder found ({first_line(exc.error)[:160]})") from None
    kept = {**keep_fp32, **{n: f"kept in FP32 so the FP16 graph is valid ({why[:120]})" for n, why in island.items()}}
    if any(p.key == qdq.RECIPE for p in converted.metadata_props):
        qdq.set_fp16_remainder(converted, kept)
    return converted, kept


def _fit_scales(model: onnx.ModelProto) -> None:
    """Every Q/DQ scale made a value FP16 holds (TensorRT refuses a scale of 0: trained models have dead weight
    channels whose per-channel scale is 1e-38): rounded to FP16 and kept within [2**-24, 65504], and each INT8 weight
    requantized at its channel's new scale (unchanged where the scale was a normal FP16 number; a dead channel's
    weights become 0, as small as FP16 can tell)."""
    inits = {i.name: i for i in model.graph.initializer}
    fitted: set[str] = set()
    for node in model.graph.node:
        if node.op_type not in fp16.QDQ or len(node.input) < 2 or node.input[1] not in inits:
            continue
        scale_init = inits[node.input[1]]
        if scale_init.name in fitted or scale_init.data_type != onnx.TensorProto.FLOAT:
            continue
        fitted.add(scale_init.name)
        scale = numpy_helper.to_array(scale_init).astype(np.float64)
        held = np.clip(scale.astype(np.float16).astype(np.float64), FP16_TINIEST, fp16.FP16_MAX)
        weight = inits.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        zero = inits.get(node.input[2]) if len(node.input) > 2 else None
        symmetric = zero is None or not numpy_helper.to_array(zero).any()
        if weight is not None and weight.data_type == onnx.TensorProto.INT8 and symmetric \
                and not np.array_equal(held, scale):
            q = numpy_helper.to_array(weight).astype(np.float64)
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % max(q.ndim, 1)
            shape = [-1 if d == axis else 1 for d in range(q.ndim)] if scale.size > 1 else []
            ratio = (scale / held).reshape(shape) if shape else scale / held
            requantized = np.clip(np.round(q * ratio), -127, 127).astype(np.int8)
            weight.CopyFrom(numpy_helper.from_array(requantized, weight.name))
        scale_init.CopyFrom(numpy_helper.from_array(held.astype(np.float32), scale_init.name))
