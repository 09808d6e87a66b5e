"""Selection ops the parser has no importer for, where what they select is known when the model is rewritten.

Compress with a constant `condition`: the entries it keeps are the constant indices of its true values, so the node
is a Gather of those indices on `axis`; without `axis` the input is flattened first (a Reshape to [-1]) and gathered
on axis 0. A condition shorter than the axis keeps nothing past its end, as the spec says. Needs the condition
constant and at least one of it true (an empty result is a zero-size tensor), and the input's rank where `axis` is
given.

MaxUnpool: its indices I are MaxPool's, flat over the whole output tensor (batch and channel included), so the node
scatters X into zeros of the output's element count: Expand of a zero to [numel], ScatterElements (axis 0, no
reduction) at Reshape(I, [-1]) with Reshape(X, [-1]), then a Reshape to the output shape. The output shape is the
constant `output_shape` input where there is one, else per axis (in - 1) * stride + kernel - pad_begin - pad_end.
Needs X's shape static and I's shape the same.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr, present, rank
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, constant_value, static_shape, take_over_outputs

# --- Compress -----------------------------------------------------------------------------------------------------

def _kept(node: gs.Node) -> np.ndarray | None:
    """The indices Compress keeps (int64, 1-D); None where the condition is not a constant."""
    condition = constant_value(node.inputs[1]) if len(node.inputs) > 1 else None
    return None if condition is None else np.flatnonzero(condition.reshape(-1)).astype(np.int64)


class CompressAsGather(Rewrite):
    name = "compress-gather"
    op = OpKey("Compress")
    summary = "Gather of the constant indices of the condition's true entries (the input flattened without axis)"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        kept = _kept(node)
        if kept is None:
            return "needs a constant condition"
        if kept.size == 0:
            return "the condition keeps nothing: the result is an empty tensor"
        if attr(node, "axis", None) is not None and rank(node.inputs[0]) is None:
            return "needs the input's rank to place the axis"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x, axis = node.inputs[0], attr(node, "axis", None)
        if axis is None:
            x, axis = b.op("Reshape", [x, b.const([-1], np.int64, what="flat")]), 0
        else:
            axis = int(axis) % rank(node.inputs[0])
        out = b.op("Gather", [x, b.const(_kept(node), np.int64, what="kept")], {"axis": axis})
        take_over_outputs(node, [out], b)


# --- MaxUnpool ----------------------------------------------------------------------------------------------------

def _spatial_from_attrs(node: gs.Node, shape: list[int]) -> list[int]:
    """The default output's spatial sizes: (in - 1) * stride + kernel - pad_begin - pad_end per axis."""
    kernel = [int(k) for k in attr(node, "kernel_shape", [])]
    d = len(kernel)
    strides = [int(s) for s in attr(node, "strides", [1] * d)]
    pads = [int(p) for p in attr(node, "pads", [0] * 2 * d)]
    return [(shape[2 + i] - 1) * strides[i] + kernel[i] - pads[i] - pads[d + i] for i in range(d)]


def _unpool_shape(node: gs.Node) -> list[int] | None:
    """The output's shape; None where it is not known when the model is rewritten."""
    shape = static_shape(node.inputs[0])
    given = present(node, 2)
    if given is not None:
        value = constant_value(given)
        return None if value is None else [int(v) for v in value.reshape(-1)]
    if shape is None or len(shape) != 2 + len(attr(node, "kernel_shape", [])):
        return None
    return shape[:2] + _spatial_from_attrs(node, shape)


class MaxUnpoolAsScatter(Rewrite):
    name = "maxunpool-scatter"
    op = OpKey("MaxUnpool")
    summary = "ScatterElements of X at the flat indices into zeros of the output's size, reshaped"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        x_shape, i_shape = static_shape(node.inputs[0]), static_shape(node.inputs[1])
        if x_shape is None or x_shape != i_shape:
            return "needs X's shape static and the indices' shape the same"
        if present(node, 2) is not None and constant_value(node.inputs[2]) is None:
            return "needs a constant output_shape"
        out = _unpool_shape(node)
        if out is None or len(out) != len(x_shape) or min(out) <= 0:
            return "the output shape is not known, or does not match the input's rank"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x, indices = node.inputs[0], node.inputs[1]
        out_shape = _unpool_shape(node)
        flat = b.const([-1], np.int64, what="flat")
        zero = b.const(np.zeros(1, dtype=x.dtype), what="zero")
        zeros = b.op("Expand", [zero, b.const([math.prod(out_shape)], np.int64, what="numel")])
        scattered = b.op("ScatterElements", [zeros, b.op("Reshape", [indices, flat]), b.op("Reshape", [x, flat])],
                         {"axis": 0})
        out = b.op("Reshape", [scattered, b.const(out_shape, np.int64, what="shape")])
        take_over_outputs(node, [out], b)
