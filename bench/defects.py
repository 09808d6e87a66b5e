"""Defects planted on purpose in real models, for the tests and benches of validate and `trtflow reduce`."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def node(model: onnx.ModelProto, op_type: str, name_part: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == op_type and name_part in n.name)


def scale_weights(model: onnx.ModelProto, node_name: str, factor: float) -> onnx.ModelProto:
    """A copy whose node `node_name` has its weight (second input, an initializer) times `factor`: a large factor
    pushes that node's output past FP16's 65504."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    target = next(n for n in out.graph.node if n.name == node_name)
    w = next(i for i in out.graph.initializer if i.name == target.input[1])
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * np.float32(factor), w.name))
    return out


def insert_op(model: onnx.ModelProto, after: str, op_type: str) -> onnx.ModelProto:
    """A copy with `op_type` applied to node `after`'s output on a side branch that joins back with a zero weight
    (`x + 0 * sum(op(x))`): the values are unchanged, the op is in the graph (an op TensorRT rejects)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(out.graph.node)
    i = next(k for k, n in enumerate(nodes) if n.name == after)
    t = nodes[i].output[0]
    joined = f"{t}__planted"
    for n in nodes[i + 1:]:
        n.input[:] = [joined if x == t else x for x in n.input]
    if any(o.name == t for o in out.graph.output):
        raise ValueError("plant after a node whose output is not a graph output")
    out.graph.initializer.append(numpy_helper.from_array(np.array(0, np.float32), "planted_zero"))
    side = [helper.make_node(op_type, [t], ["planted_a"], name=f"planted_{op_type}"),
            helper.make_node("Cast", ["planted_a"], ["planted_b"], to=TensorProto.FLOAT, name="planted_cast"),
            helper.make_node("ReduceSum", ["planted_b"], ["planted_c"], keepdims=0, name="planted_sum"),
            helper.make_node("Mul", ["planted_c", "planted_zero"], ["planted_d"], name="planted_mul"),
            helper.make_node("Add", [t, "planted_d"], [joined], name="planted_add")]
    del out.graph.node[:]
    out.graph.node.extend(nodes[:i + 1] + side + nodes[i + 1:])
    onnx.checker.check_model(out)
    return out


def ruin_input_range(qdq: onnx.ModelProto, consumer: str, factor: float) -> tuple[onnx.ModelProto, str]:
    """A copy of a Q/DQ model whose activation quantizer in front of node `consumer` has its scale times `factor`
    (a range ruined as an outlier in the calibration data would): returns it and the activation's name."""
    out = onnx.ModelProto()
    out.CopyFrom(qdq)
    producer = {o: n for n in out.graph.node for o in n.output}
    inits = {i.name: i for i in out.graph.initializer}
    target = next(n for n in out.graph.node if n.name == consumer)
    q = producer[producer[target.input[0]].input[0]]
    s = inits[q.input[1]]
    s.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(s) * np.float32(factor), s.name))
    return out, q.input[0]


def quantize(model: Path, out: Path, samples: list[dict[str, np.ndarray]]) -> None:
    """A Q/DQ model of `model` calibrated on `samples` with ONNX Runtime's `quantize_static` (MinMax, symmetric
    INT8, per-channel weights, Conv and Gemm): a variant whose ranges a defect can then ruin."""
    import logging

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # "consider pre-processing": the model is simplified already
    try:
        quantize_static(str(model), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=["Conv", "Gemm"],
                        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False})
    finally:
        root.setLevel(level)
