"""Q/DQ models with ONNX Runtime's quantization tools, configured as ModelOpt configures them for TensorRT, and
what a Q/DQ model says about itself (its activation ranges, the op types and nodes it quantized).

Every model written here carries its recipe (op types, excluded nodes, per-channel, the range of every calibrated
tensor) in its metadata: quantizing again with some nodes left out (validate's repair, `trtflow reduce`) then
starts from exactly what the calibrate stage did. The graph alone does not say it all: ONNX Runtime also
quantizes MatMuls between two activations, and needs ranges for tensors it leaves no Q/DQ on.
"""
from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
from onnx import numpy_helper

from trtflow.stages.onnx import model_io

RECIPE = "trtflow.qdq_recipe"  # the metadata key


@dataclass
class Recipe:
    quantize_ops: list[str]
    excluded: set[str]
    per_channel: bool
    tensors: Any  # ONNX Runtime's TensorsData: each calibrated tensor's range

    def quantized(self, model: onnx.ModelProto) -> set[str]:
        """The nodes of `model` (the FP32 model it was made from) this recipe quantizes."""
        return {n.name for n in model.graph.node if n.op_type in self.quantize_ops and n.name not in self.excluded}


def write(pre: Path, out: Path, ranges: Path, tensors: Any, per_channel: bool, quantize_ops: list[str],
          excluded: set[str]) -> None:
    """Quantize `pre` at `tensors`' ranges (ONNX Runtime's `TensorsData`, also saved to `ranges`)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import save_tensors_data

    save_tensors_data(tensors, ranges)  # the cache quantize_static reads: it then calibrates nothing itself
    # quantize_static logs "consider pre-processing" through the root logger for models it was not run on
    # (the pre-processing is done, or the model is a subgraph cut from a pre-processed one)
    with contextlib.redirect_stdout(io.StringIO()), _quiet_root_logger():
        quantize_static(
            str(pre), str(out), None, quant_format=QuantFormat.QDQ, per_channel=per_channel,
            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            calibrate_method=tensors.calibration_method,
            op_types_to_quantize=list(quantize_ops), nodes_to_exclude=sorted(excluded),
            calibration_cache_path=str(ranges),  # exists: quantize_static takes these ranges as they are
            # weights stored as INT8 with a DequantizeLinear (not FP32 + a Q/DQ pair): the same outputs, a file
            # about 3.6x smaller; TensorRT folds either form into INT8 weights
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False,
                           "AddQDQPairToWeight": False, "DedicatedQDQPair": False})
    model = model_io.load(out)
    entry = model.metadata_props.add()
    entry.key, entry.value = RECIPE, json.dumps({
        "quantize_ops": list(quantize_ops), "excluded_nodes": sorted(excluded), "per_channel": per_channel,
        "method": tensors.calibration_method.name,
        "ranges": {t: [float(np.ravel(d.range_value[0])[0]), float(np.ravel(d.range_value[1])[0])]
                   for t, d in tensors.data.items()}}, sort_keys=True)  # the same model, byte for byte
    model_io.save(model, out)


def recipe(model: onnx.ModelProto) -> Recipe:
    """How the Q/DQ `model` was quantized: from its metadata when trtflow wrote it, else read off its graph (a
    model quantized elsewhere: the op types of the nodes reading quantized weights, other nodes of those types
    excluded, the ranges of its QuantizeLinear nodes)."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorData, TensorsData

    meta = next((p.value for p in model.metadata_props if p.key == RECIPE), None)
    if meta is not None:
        r = json.loads(meta)
        data = {t: TensorData(lowest=np.float32(lo), highest=np.float32(hi)) for t, (lo, hi) in r["ranges"].items()}
        return Recipe(r["quantize_ops"], set(r["excluded_nodes"]), r["per_channel"],
                      TensorsData(CalibrationMethod[r["method"]], data))
    quantized = quantized_nodes(model)
    ops = sorted(set(quantized.values()))
    skipped = {n.name for n in model.graph.node if n.op_type in ops and n.name not in quantized}
    return Recipe(ops, skipped, is_per_channel(model), activation_ranges(model))


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def quantized_nodes(model: onnx.ModelProto) -> dict[str, str]:
    """Node name -> op type, for every node whose weights are quantized (it reads a DequantizeLinear of an
    initializer): the nodes of the calibrate stage's `quantize_ops`, which TensorRT runs in INT8."""
    inits = {i.name for i in model.graph.initializer}
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits for o in n.output}
    return {n.name: n.op_type for n in model.graph.node
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and any(t in dq for t in n.input)}


def is_per_channel(model: onnx.ModelProto) -> bool:
    inits = {i.name: i for i in model.graph.initializer}
    return any(n.op_type == "DequantizeLinear" and n.input[0] in inits and n.input[1] in inits
               and numpy_helper.to_array(inits[n.input[1]]).size > 1 for n in model.graph.node)


INT_RANGES = {onnx.TensorProto.INT8: (-128, 127), onnx.TensorProto.UINT8: (0, 255)}


def _activation_quantizers(model: onnx.ModelProto) -> Iterator[tuple[str, float, onnx.TensorProto | None]]:
    """(activation tensor, scale, zero-point initializer or None) of each per-tensor QuantizeLinear. A graph
    output keeps its name for the model's users: ONNX Runtime renames the tensor it quantizes
    (`<name>_QuantizeLinear_Input`) and the DequantizeLinear after it writes `<name>`, the tensor it stands for."""
    inits = {i.name: i for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    dequantized = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits and n.input[1] in inits:
            scale = numpy_helper.to_array(inits[n.input[1]])
            if scale.size == 1:
                after = dequantized.get(n.output[0])
                tensor = after if after in outputs else n.input[0]
                yield tensor, float(scale.ravel()[0]), inits.get(n.input[2]) if len(n.input) > 2 else None


def representable_ranges(model: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """Activation tensor -> the float range its QuantizeLinear can represent: ((qmin - zp) s, (qmax - zp) s)."""
    out = {}
    for tensor, s, zp in _activation_quantizers(model):
        lo, hi = INT_RANGES.get(zp.data_type if zp is not None else onnx.TensorProto.UINT8, (0, 255))
        z = float(numpy_helper.to_array(zp).ravel()[0]) if zp is not None else 0.0
        out[tensor] = ((lo - z) * s, (hi - z) * s)
    return out


def activation_ranges(model: onnx.ModelProto) -> Any:
    """The symmetric range [-127 s, 127 s] of each activation's per-tensor QuantizeLinear, as `TensorsData`
    `write` takes: quantizing again at these ranges gives the same scales."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorData, TensorsData

    data = {}
    for tensor, s, _ in _activation_quantizers(model):
        t = np.array(127.0 * s, dtype=np.float32)
        data[tensor] = TensorData(lowest=-t, highest=t)
    return TensorsData(CalibrationMethod.MinMax, data)
