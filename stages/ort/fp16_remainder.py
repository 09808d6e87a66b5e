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
from onnx import version_converter

from trtflow.stages.onnx import fp16, model_io
from trtflow.stages.onnx.graph import default_opset
from trtflow.stages.ort import qdq
from trtflow.stages.ort.probe import probe
from trtflow.text import first_line

FP16_SCALES_OPSET = 19  # QuantizeLinear/DequantizeLinear take FP16 scales (and inputs) from opset 19 on


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
