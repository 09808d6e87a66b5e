"""Which nodes FP16 cannot carry, from the magnitudes of their tensors measured on sample data (as ModelOpt's
AutoCast decides): an activation beyond `data_max`, a weight beyond `init_max`, a constant FP16 turns to 0, and an
activation a singularity reads (Log's input, Div's divisor, ...) that FP16 would round to 0. The precision stage's
FP16 variant and the calibrate stage's FP16 remainder keep the same nodes in FP32 for the same reasons."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from trtflow.stages.onnx import fp16
from trtflow.stages.onnx.graph import constant_tensors
from trtflow.stages.ort.ranges import Magnitudes


def out_of_range(model: onnx.ModelProto, seen: Magnitudes, data_max: float, init_max: float,
                 blocked: dict[str, str]) -> dict[str, str]:
    """`blocked` (node -> why it stays FP32) with every node FP16 cannot carry added (those already in it keep
    their reason)."""
    inits = {i.name: i for i in model.graph.initializer}
    inits.update(constant_tensors(model.graph))  # weights exported as Constant nodes
    for node in model.graph.node:
        if node.name not in blocked:
            why = _out_of_range(node, inits, seen, data_max, init_max)
            if why is not None:
                blocked[node.name] = why
    _singular_at_zero(model, inits, seen, blocked)
    return blocked


def _out_of_range(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto], seen: Magnitudes, data_max: float,
                  init_max: float) -> str | None:
    """Why `node` leaves FP16's range, if it does: an activation above data_max, a weight above init_max, or a
    constant whose values FP16 turns to 0."""
    peak = seen.peak
    big = max(((peak.get(t, 0.0), t) for t in list(node.input) + list(node.output) if t in peak), default=(0.0, ""))
    if big[0] > data_max:
        return f"|{big[1]}| reaches {big[0]:.4g} > data_max {data_max:g}"
    for t in node.input:
        if t in inits and inits[t].data_type == onnx.TensorProto.FLOAT:
            w = numpy_helper.to_array(inits[t])
            top = float(np.abs(w).max(initial=0.0))
            if top > init_max:
                return f"weight {t} reaches {top:.4g} > init_max {init_max:g}"
            lost = fp16.lost_to_zero(w)
            if lost is not None:
                return f"constant {t} {lost}"
    return None


def _singular_at_zero(model: onnx.ModelProto, inits: dict[str, onnx.TensorProto], seen: Magnitudes,
                      blocked: dict[str, str]) -> None:
    """An activation a singularity reads (Log's input, Div's divisor, ...) that FP16 would round to 0: the node
    and the one making it stay FP32."""
    producer = {o: n.name for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        for i in fp16.SINGULAR_AT_ZERO.get(node.op_type, ()):
            t = node.input[i] if i < len(node.input) else ""
            low = seen.floor.get(t)
            if t in inits or low is None or low >= fp16.FP16_ZERO_BELOW:
                continue
            why = f"{t} goes down to {low:.3g} on the sample data, which FP16 rounds to 0 ({node.op_type} of 0)"
            blocked.setdefault(node.name, f"its input {why}")
            if t in producer:
                blocked.setdefault(producer[t], f"its output {why}")
