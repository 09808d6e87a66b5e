"""DeformConv (2-D) as one GridSample over every kernel tap and a grouped 1x1 Conv.

Each output position (oh, ow) and kernel tap (i, j) samples the input bilinearly at
(oh*stride - pad + i*dilation + offset_y, ow*stride - pad + j*dilation + offset_x), zero outside the image, times the
mask; the convolution is then a weighted sum over channels and taps. So: the input is split into its offset groups
(a Reshape to [N*offset_group, C/offset_group, H, W]), one GridSample (bilinear, zeros padding, align_corners=0) reads
every tap of every output position at once (a grid of [N*offset_group, kH*kW*oH, oW, 2] built from the offsets plus
a constant base), the mask multiplies the samples, and a 1x1 Conv with `group` groups over the C*kH*kW sampled
channels applies the weights and the bias.

Preconditions: X of rank 4 with a static shape, offset and W with static shapes, float16/float32, opset >= 16 (for
GridSample; DeformConv itself is opset 19+).
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, constant_value, static_shape, take_over_outputs

FLOATS = (np.float32, np.float16)


def _input(node: gs.Node, i: int) -> gs.Tensor | None:
    """The node's i-th input, None where it is absent or left empty."""
    return node.inputs[i] if len(node.inputs) > i and node.inputs[i].name else None


class _Conv:
    """The node's attributes, with the ONNX defaults, and its static shapes."""

    def __init__(self, node: gs.Node):
        self.n, self.c, self.h, self.w = static_shape(node.inputs[0])
        self.oc, self.c_per_group, kh, kw = static_shape(node.inputs[1])
        self.oh, self.ow = static_shape(node.inputs[2])[2:]
        self.kh, self.kw = attr(node, "kernel_shape", [kh, kw])
        self.sh, self.sw = attr(node, "strides", [1, 1])
        self.dh, self.dw = attr(node, "dilations", [1, 1])
        self.pt, self.pl = attr(node, "pads", [0, 0, 0, 0])[:2]
        self.group, self.offset_group = attr(node, "group", 1), attr(node, "offset_group", 1)
        self.taps = self.kh * self.kw


def _base_grid(cv: _Conv) -> np.ndarray:
    """The grid without offsets, [taps, oH, oW, 2] as GridSample's normalized (x, y) (align_corners=0)."""
    ys = (np.arange(cv.oh) * cv.sh - cv.pt)[None, :] + (np.arange(cv.kh) * cv.dh)[:, None]  # [kH, oH]
    xs = (np.arange(cv.ow) * cv.sw - cv.pl)[None, :] + (np.arange(cv.kw) * cv.dw)[:, None]  # [kW, oW]
    gy = (2 * ys + 1) / cv.h - 1
    gx = (2 * xs + 1) / cv.w - 1
    grid = np.empty((cv.kh, cv.kw, cv.oh, cv.ow, 2))
    grid[..., 0] = gx[None, :, None, :]
    grid[..., 1] = gy[:, None, :, None]
    return grid.reshape(cv.taps, cv.oh, cv.ow, 2)


def _grid(b: Builder, cv: _Conv, offset: gs.Tensor, dtype) -> gs.Variable:
    """offset [N, og*taps*2, oH, oW] (y, x pairs in pixels) -> GridSample's grid [N*og, taps*oH, oW, 2]."""
    pairs = b.op("Reshape", [offset, b.const([cv.n * cv.offset_group, cv.taps, 2, cv.oh, cv.ow], np.int64)])
    last = b.op("Transpose", [pairs], {"perm": [0, 1, 3, 4, 2]})
    xy = b.op("Gather", [last, b.const([1, 0], np.int64)], {"axis": 4})
    scaled = b.op("Mul", [xy, b.const([2 / cv.w, 2 / cv.h], dtype)])
    grid = b.op("Add", [scaled, b.const(_base_grid(cv), dtype)])
    return b.op("Reshape", [grid, b.const([cv.n * cv.offset_group, cv.taps * cv.oh, cv.ow, 2], np.int64)])


def _weights(b: Builder, cv: _Conv, w: gs.Tensor) -> gs.Tensor:
    """W [oC, C/group, kH, kW] as the 1x1 Conv's [oC, C/group*taps, 1, 1] (folded where W is a constant)."""
    shape = [cv.oc, cv.c_per_group * cv.taps, 1, 1]
    value = constant_value(w)
    if value is not None:
        return b.const(value.reshape(shape), what="weights")
    return b.op("Reshape", [w, b.const(shape, np.int64)])


class DeformConvGridSample(Rewrite):
    name = "deformconv-gridsample"
    op = OpKey("DeformConv")
    summary = "GridSample over the kernel taps (offsets and mask applied) + a grouped 1x1 Conv"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        x, w, offset = node.inputs[:3]
        if graph.opset < 16:
            return f"needs opset >= 16 for GridSample (the model's is {graph.opset})"
        if static_shape(x) is None or static_shape(offset) is None or static_shape(w) is None:
            return "needs static shapes for X, W and offset"
        if len(static_shape(x)) != 4:
            return f"covers 2-D DeformConv only (X of rank 4), not rank {len(static_shape(x))}"
        if x.dtype not in FLOATS:
            return f"needs a float16/float32 X, not {x.dtype}"
        if attr(node, "offset_group", 1) < 1 or static_shape(x)[1] % attr(node, "offset_group", 1):
            return "X's channels are not divisible by offset_group"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b, cv = Builder(graph, node), _Conv(node)
        x, w, offset = node.inputs[:3]
        bias, mask = _input(node, 3), _input(node, 4)
        dtype = x.dtype
        per_offset_group = b.op("Reshape", [x, b.const([cv.n * cv.offset_group, cv.c // cv.offset_group, cv.h,
                                                        cv.w], np.int64)])
        mode = "linear" if graph.opset >= 20 else "bilinear"  # GridSample-20 renamed the modes
        sampled = b.op("GridSample", [per_offset_group, _grid(b, cv, offset, dtype)],
                       {"mode": mode, "padding_mode": "zeros", "align_corners": 0})
        if mask is not None:
            m = b.op("Reshape", [mask, b.const([cv.n * cv.offset_group, 1, cv.taps * cv.oh, cv.ow], np.int64)])
            sampled = b.op("Mul", [sampled, m])
        # [N*og, C/og, taps*oH, oW] is [N, C, taps, oH, oW] in memory: channel c's taps are consecutive, as W's are
        columns = b.op("Reshape", [sampled, b.const([cv.n, cv.c * cv.taps, cv.oh, cv.ow], np.int64)])
        inputs = [columns, _weights(b, cv, w)] + ([bias] if bias is not None else [])
        y = b.op("Conv", inputs, {"group": cv.group, "kernel_shape": [1, 1]}, dtype=dtype)
        take_over_outputs(node, [y], b)
