"""LpPool the parser refuses: p other than 1 and 2, dilations other than 1, or one spatial dimension (its pooling
layer is 2-D and 3-D only).

LpPool is (the sum over each window of |x|^p)^(1/p), padded positions counting as zeros: Pow(|x|, p), a depthwise
Conv of a kernel of ones (group = channels) with the node's strides, dilations, pads and auto_pad (which mean the same
for Conv), then Pow(., 1/p) (neither Pow for p = 1). ceil_mode=1 becomes extra padding at the end of each spatial axis,
up to the output size shape inference gives. Needs the channel count (the kernel's size) and a floating-point type;
ceil_mode=1 also needs static spatial sizes in and out and explicit pads.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr, float_dtype, is_static
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, static_shape, take_over_outputs

PASSED_ON = ("strides", "dilations", "pads", "auto_pad")  # attributes Conv has, with LpPool's meaning


def _ceil_pads(node: gs.Node) -> list[int] | None:
    """The node's pads with what ceil_mode adds at the end of each axis; None where a size is not static."""
    x_shape, y_shape = static_shape(node.inputs[0]), static_shape(node.outputs[0])
    auto_pad = attr(node, "auto_pad", "NOTSET")
    if x_shape is None or y_shape is None or auto_pad not in ("NOTSET", "VALID"):
        return None
    kernel = list(attr(node, "kernel_shape"))
    n = len(kernel)
    strides, dilations = list(attr(node, "strides", [1] * n)), list(attr(node, "dilations", [1] * n))
    pads = list(attr(node, "pads", [0] * 2 * n)) if auto_pad == "NOTSET" else [0] * 2 * n
    for i in range(n):
        reach = (y_shape[2 + i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1
        pads[n + i] += max(0, reach - (x_shape[2 + i] + pads[i] + pads[n + i]))
    return pads


class LpPoolAsConv(Rewrite):
    name = "lppool-conv"
    op = OpKey("LpPool")
    summary = "Pow(|x|, p), a depthwise Conv of ones, Pow(., 1/p)"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        shape = getattr(node.inputs[0], "shape", None)
        kernel = list(attr(node, "kernel_shape", []))
        p = int(attr(node, "p", 2))
        if p in (1, 2) and len(kernel) in (2, 3) and all(d == 1 for d in attr(node, "dilations", [1])):
            return f"p={p} without dilations in {len(kernel)}-D: the parser takes it"
        if shape is None or len(shape) != len(kernel) + 2 or not is_static(shape[1]):
            return "needs the input's rank and its channel count static (the depthwise kernel's size)"
        if float_dtype(node.inputs[0]) is None:
            return "needs a floating-point input of known type"
        if int(attr(node, "ceil_mode", 0)) and _ceil_pads(node) is None:
            return "ceil_mode=1 needs static spatial sizes in and out, and explicit pads (not SAME auto_pad)"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x = node.inputs[0]
        dtype = float_dtype(x)
        kernel = [int(k) for k in attr(node, "kernel_shape")]
        channels, p = int(x.shape[1]), int(attr(node, "p", 2))
        conv = {k: node.attrs[k] for k in PASSED_ON if k in node.attrs}
        if int(attr(node, "ceil_mode", 0)):
            conv.update(pads=_ceil_pads(node), auto_pad="NOTSET")
        conv.update(kernel_shape=kernel, group=channels)
        powered = b.op("Abs", [x])
        if p != 1:
            powered = b.op("Pow", [powered, b.const(p, dtype=dtype, what="p")])
        ones = b.const(np.ones([channels, 1, *kernel]), dtype=dtype, what="ones")
        summed = b.op("Conv", [powered, ones], conv)
        out = summed if p == 1 else b.op("Pow", [summed, b.const(1.0 / p, dtype=dtype, what="inv_p")])
        take_over_outputs(node, [out], b)
