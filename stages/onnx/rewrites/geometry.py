"""Geometry ops the parser has no importer for, where their sizes are known when the model is rewritten.

CenterCropPad: a Slice of the centred window on every axis the target is smaller, then a Pad with zeros on every axis
it is larger (the extra element of an odd difference at the end, as the spec's reference does). Needs a constant
`shape` and, on the axes it names, static input sizes.

AffineGrid: the grid is theta applied to the homogeneous coordinates of every output position, a constant base grid
B of shape [prod(spatial), dims + 1]: MatMul(B, Transpose(theta)) reshaped to [N, *spatial, dims]. With a constant
theta the whole grid is a constant. Needs a constant `size`.

Col2Im: the sum of every column back into the image is the transposed convolution of the blocks with a one-hot
kernel: reshape [N, C * prod(block), L] to [N, C * prod(block), *blocks per axis], then a ConvTranspose (group = C,
input channel c * prod(block) + k a one at tap k) with the node's strides and pads, and output_padding for the
positions past the last full block; dilations are holes in that kernel (the builder has no strided and dilated
ConvTranspose). Needs constant image_shape and block_shape and the input's channel count.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr, is_static, rank
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, constant_value, take_over_outputs

# --- CenterCropPad ------------------------------------------------------------------------------------------------

def _crop_pad_axes(node: gs.Node) -> list[tuple[int, int, int]] | None:
    """(axis, input size, target size) for every axis the node names; None where one of those sizes is unknown."""
    target, n = constant_value(node.inputs[1]), rank(node.inputs[0])
    if target is None or n is None:
        return None
    axes = [int(a) % n for a in attr(node, "axes", range(n))]
    shape = node.inputs[0].shape
    if len(axes) != target.size or not all(is_static(shape[a]) for a in axes):
        return None
    return [(a, int(shape[a]), int(t)) for a, t in zip(axes, target.reshape(-1))]


class CenterCropPadAsSlicePad(Rewrite):
    name = "centercroppad-slice-pad"
    op = OpKey("CenterCropPad")
    summary = "Slice of the centred window + Pad with zeros"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        if constant_value(node.inputs[1]) is None:
            return "needs a constant target shape"
        if _crop_pad_axes(node) is None:
            return "needs the input's rank and static sizes on the axes it crops or pads"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        axes, n = _crop_pad_axes(node), rank(node.inputs[0])
        crops = [(a, (size - want) // 2, (size - want) // 2 + want) for a, size, want in axes if want < size]
        pads = np.zeros(2 * n, dtype=np.int64)
        for a, size, want in axes:
            if want > size:
                pads[a], pads[n + a] = (want - size) // 2, want - size - (want - size) // 2
        out = node.inputs[0]
        if crops:
            starts, ends, sliced = ([c[i] for c in crops] for i in (1, 2, 0))
            out = b.op("Slice", [out, b.const(starts, np.int64), b.const(ends, np.int64), b.const(sliced, np.int64)])
        if pads.any():
            out = b.op("Pad", [out, b.const(pads, what="pads")], {"mode": "constant"})
        take_over_outputs(node, [b.op("Identity", [out])], b)


# --- AffineGrid ---------------------------------------------------------------------------------------------------

def _coordinates(n: int, align_corners: bool) -> np.ndarray:
    """The normalised coordinates of n positions along one axis, in [-1, 1]."""
    if align_corners:
        return np.linspace(-1.0, 1.0, n)
    return (2.0 * np.arange(n) + 1.0) / n - 1.0


def base_grid(spatial: list[int], align_corners: bool) -> np.ndarray:
    """[prod(spatial), dims + 1]: per output position (row-major over `spatial`) its (x, y[, z], 1), x along the
    last axis."""
    axes = np.meshgrid(*[_coordinates(n, align_corners) for n in spatial], indexing="ij")
    coords = [a.reshape(-1) for a in reversed(axes)]
    return np.stack([*coords, np.ones(math.prod(spatial))], axis=1)


class AffineGridAsMatMul(Rewrite):
    name = "affinegrid-matmul"
    op = OpKey("AffineGrid")
    summary = "MatMul of the constant base grid with theta^T (a constant where theta is)"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        size = constant_value(node.inputs[1])
        if size is None:
            return "needs a constant size"
        if size.size not in (4, 5):
            return f"size has {size.size} values: AffineGrid takes [N, C, H, W] or [N, C, D, H, W]"
        if attr(node, "align_corners", 0) and 1 in [int(s) for s in size.reshape(-1)[2:]]:
            # the spacing is 2 / (n - 1): ONNX's reference puts the one position at -1, ONNX Runtime at 1
            return "align_corners=1 with a spatial size of 1 has no defined coordinate"
        if constant_value(node.inputs[0]) is None and getattr(node.inputs[0], "dtype", None) is None:
            return "needs theta's element type"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        theta, size = node.inputs[0], [int(s) for s in constant_value(node.inputs[1]).reshape(-1)]
        spatial = size[2:]
        grid = base_grid(spatial, bool(attr(node, "align_corners", 0)))
        out_shape = [size[0], *spatial, len(spatial)]
        fixed = constant_value(theta)
        if fixed is not None:
            value = (grid @ np.swapaxes(fixed.astype(np.float64), 1, 2)).reshape(out_shape)
            out = b.op("Identity", [b.const(value, dtype=fixed.dtype, what="grid")])
        else:
            product = b.op("MatMul", [b.const(grid, dtype=theta.dtype, what="base"),
                                      b.op("Transpose", [theta], {"perm": [0, 2, 1]})])
            out = b.op("Reshape", [product, b.const(out_shape, np.int64, what="shape")])
        take_over_outputs(node, [out], b)


# --- Col2Im -------------------------------------------------------------------------------------------------------

class Col2ImGeometry(NamedTuple):
    columns: int  # the input's dimension 1: channels * prod(block)
    block: list[int]
    strides: list[int]
    dilations: list[int]
    pads: list[int]
    blocks: list[int]  # per spatial axis, how many block positions
    output_padding: list[int]  # per spatial axis, the image positions past the last block's reach

    @property
    def channels(self) -> int:
        return self.columns // math.prod(self.block)


def _col2im_geometry(node: gs.Node) -> Col2ImGeometry | None:
    """None where image_shape or block_shape is not a constant, or the input's dimension 1 is not static."""
    image, block = constant_value(node.inputs[1]), constant_value(node.inputs[2])
    shape = getattr(node.inputs[0], "shape", None) or []
    if image is None or block is None or len(shape) != 3 or not is_static(shape[1]):
        return None
    image, block = [int(v) for v in image.reshape(-1)], [int(v) for v in block.reshape(-1)]
    n = len(block)
    strides, dilations = list(attr(node, "strides", [1] * n)), list(attr(node, "dilations", [1] * n))
    pads = list(attr(node, "pads", [0] * 2 * n))
    span = [image[i] + pads[i] + pads[n + i] - dilations[i] * (block[i] - 1) - 1 for i in range(n)]
    return Col2ImGeometry(int(shape[1]), block, strides, dilations, pads,
                          [s // st + 1 for s, st in zip(span, strides)], [s % st for s, st in zip(span, strides)])


def one_hot_kernel(channels: int, block: list[int], dilations: list[int]) -> np.ndarray:
    """[channels * prod(block), 1, *dilated block]: input channel c * prod(block) + k has a one at tap k, the taps
    `dilations` apart (the builder has no strided and dilated ConvTranspose: the holes make it undilated)."""
    taps = math.prod(block)
    span = [d * (k - 1) + 1 for k, d in zip(block, dilations)]
    where = np.indices(block).reshape(len(block), taps) * np.asarray(dilations).reshape(-1, 1)
    flat = np.ravel_multi_index(tuple(where), span)
    kernel = np.zeros([channels * taps, 1, math.prod(span)])
    kernel[np.arange(channels * taps), 0, np.tile(flat, channels)] = 1.0
    return kernel.reshape([channels * taps, 1, *span])


class Col2ImAsConvTranspose(Rewrite):
    name = "col2im-convtranspose"
    op = OpKey("Col2Im")
    summary = "Reshape to the block grid + a grouped ConvTranspose with a one-hot kernel"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        g = _col2im_geometry(node)
        if g is None:
            return "needs constant image_shape and block_shape, and the input's dimension 1 static"
        if g.columns % math.prod(g.block):
            return f"{g.columns} columns is not a multiple of the block size {g.block}"
        if min(g.blocks) < 1:
            return f"the image holds no whole block ({g.blocks} per axis)"
        if getattr(node.inputs[0], "dtype", None) is None:
            return "needs the input's element type"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        g = _col2im_geometry(node)
        x = node.inputs[0]
        grid = b.op("Reshape", [x, b.const([0, g.columns, *g.blocks], np.int64, what="shape")])
        kernel = one_hot_kernel(g.channels, g.block, g.dilations)
        weights = b.const(kernel, dtype=x.dtype, what="one_hot")
        deconv = {"group": g.channels, "kernel_shape": list(kernel.shape[2:]), "strides": g.strides, "pads": g.pads,
                  "output_padding": g.output_padding}
        take_over_outputs(node, [b.op("ConvTranspose", [grid, weights], deconv)], b)
