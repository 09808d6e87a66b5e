"""Element-wise ops the parser refuses for some attribute values.

Mod with fmod=0 on floating-point inputs (the parser takes fmod=0 only on integers; float fmod=0 is valid ONNX from
opset 28 on: Mod-13 requires fmod=1 for floats, and ONNX Runtime refuses it there): a - b * Floor(a / b), the
remainder with the divisor's sign. Exact up to the rounding of a / b, as the parser's own fmod=1 is (it computes
a - b * trunc(a / b) the same way): where the quotient is beyond float precision (1e8 mod 3 in float32) the result is
off by a multiple of b, and an infinite divisor gives NaN, not ONNX's special cases. Needs the input type and
opset >= 28.

Dropout in training mode (the parser takes training_mode only as an initializer and only false): random, so no
rewrite computes the same thing, except with a constant ratio of 0, where it is the identity whatever the mode (the
mask, if read, all true). Refuses a nonzero or non-constant ratio: the model should be exported in eval mode.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr, dtype_of, is_read, present
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, constant_value, take_over_outputs


class ModFloorOnFloats(Rewrite):
    name = "mod-floor-float"
    op = OpKey("Mod")
    summary = "a - b * Floor(a / b)"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        if int(attr(node, "fmod", 0)) != 0:
            return "fmod=1: the parser takes it"
        dtype = dtype_of(node.inputs[0])
        if dtype is None:
            return "needs the input's element type (run shape inference, or declare it)"
        if not np.issubdtype(dtype, np.floating):
            return f"Mod with fmod=0 on {dtype}: the parser takes it on integers"
        if graph.opset < 28:
            return (f"Mod with fmod=0 on floats is valid ONNX from opset 28 on (Mod-13 requires fmod=1 for floats); "
                    f"this model is opset {graph.opset}")
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        a, d = node.inputs[0], node.inputs[1]
        quotient = b.op("Floor", [b.op("Div", [a, d])])
        take_over_outputs(node, [b.op("Sub", [a, b.op("Mul", [d, quotient])])], b)


class DropoutWithoutRatio(Rewrite):
    name = "dropout-ratio0"
    op = OpKey("Dropout")
    summary = "Identity (a Dropout of ratio 0 in any mode), the mask all true"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        if graph.opset < 12:
            return f"opset {graph.opset}: Dropout has no training mode before opset 12, the parser takes it"
        mode_input = present(node, 2)
        mode = np.array(False) if mode_input is None else constant_value(mode_input)
        if mode is not None and not bool(mode):
            return "training_mode is false: the parser takes it"
        ratio_input = present(node, 1)
        ratio = np.array(0.5) if ratio_input is None else constant_value(ratio_input)
        if ratio is None:
            return "training mode (or a mode that is not a constant) with a ratio that is not a constant: " \
                   "export the model in eval mode"
        if float(ratio) != 0.0:
            return (f"ratio {float(ratio)} with training_mode true (or not a constant) is random: export the model in "
                    f"eval mode")
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x = node.inputs[0]
        produced = [b.op("Identity", [x])]
        if len(node.outputs) > 1 and is_read(node.outputs[1], graph):
            ones = gs.Constant(b.name("true"), np.array([True]))
            produced.append(b.op("ConstantOfShape", [b.op("Shape", [x])], {"value": ones}))
        take_over_outputs(node, produced, b)
