"""ScatterElements and ScatterND with a reduction (add, mul, max, min) as a one-hot comparison, a Where and a Reduce*.

TensorRT's parser takes both scatters without a reduction only. With one, every update is compared with every
position it could land on: `Equal(index, range)` gives a one-hot mask with one more axis, `Where(mask, update,
neutral)` puts each update on its position and the reduction's neutral element (0, 1, -inf, +inf) everywhere else,
and ReduceSum/ReduceProd/ReduceMax/ReduceMin over the updates' axis folds duplicates together; the result is combined
with the data by Add/Mul/Max/Min (for max and min the data's own value takes part, as ONNX says). ScatterND first
flattens its index tuples into one index over the data's leading dimensions.

Preconditions: static shapes for data, indices and updates; the one-hot mask (updates x positions) at most
MAX_ONE_HOT elements. Reduce* takes its axes as an input from opset 13 (ReduceSum) or 18 (the others), as an
attribute before: the form follows the model's opset.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, constant_value, static_shape, take_over_outputs

REDUCE = {"add": ("ReduceSum", "Add"), "mul": ("ReduceProd", "Mul"), "max": ("ReduceMax", "Max"),
          "min": ("ReduceMin", "Min")}
MAX_ONE_HOT = 1 << 24  # elements of the one-hot mask (and of the Where's output): 64 MB of float32


def _neutral(reduction: str, dtype) -> np.ndarray:
    """The value that leaves the reduction unchanged, as a scalar of `dtype`."""
    dtype = np.dtype(dtype)
    big = np.inf if dtype.kind == "f" else np.iinfo(dtype).max
    small = -np.inf if dtype.kind == "f" else np.iinfo(dtype).min
    return np.array({"add": 0, "mul": 1, "max": small, "min": big}[reduction], dtype=dtype)


def _reduce(b: Builder, op: str, x: gs.Tensor, axis: int, opset: int) -> gs.Variable:
    """`op` over one axis, keepdims=0, its axes an input or an attribute as the opset wants."""
    if opset >= (13 if op == "ReduceSum" else 18):
        return b.op(op, [x, b.const([axis], np.int64)], {"keepdims": 0})
    return b.op(op, [x], {"axes": [axis], "keepdims": 0})


def _reshape(b: Builder, x: gs.Tensor, shape: list[int]) -> gs.Variable:
    return b.op("Reshape", [x, b.const(shape, np.int64)])


def _non_negative(b: Builder, index: gs.Tensor, size: np.ndarray | int) -> gs.Tensor:
    """Indices counted from the end (negative) as counted from the start; folded where the indices are constant."""
    value = constant_value(index)
    if value is not None:
        return b.const(np.where(value < 0, value + size, value).astype(value.dtype), what="index")
    size_c = b.const(size, index.dtype)
    negative = b.op("Less", [index, b.const(0, index.dtype)])
    return b.op("Where", [negative, b.op("Add", [index, size_c]), index])


def _scatter(b: Builder, node: gs.Node, one_hot: gs.Tensor, updates: gs.Tensor, axis: int, opset: int) -> gs.Tensor:
    """Reduce the updates placed by `one_hot` (updates' shape with the positions inserted after `axis`) over
    `axis`: the positions' values, the neutral element where no update lands."""
    reduction = attr(node, "reduction")
    placed = b.op("Where", [one_hot, updates, b.const(_neutral(reduction, node.inputs[2].dtype))])
    return _reduce(b, REDUCE[reduction][0], placed, axis, opset)


def _combine(b: Builder, node: gs.Node, data: gs.Tensor, reduced: gs.Tensor) -> None:
    y = b.op(REDUCE[attr(node, "reduction")][1], [data, reduced], dtype=data.dtype)
    take_over_outputs(node, [y], b)


def _refusal(node: gs.Node, graph: gs.Graph, one_hot_size: Callable[[gs.Node, list[int], list[int]], int]) -> \
        str | None:
    """Why a scatter rule does not apply to `node`: a reduction it does not cover, an opset without reductions,
    shapes it needs static, or a one-hot mask (`one_hot_size` of the node, data's and indices' shapes) too large."""
    reduction = attr(node, "reduction", "none")
    if reduction not in REDUCE:
        return f"covers reduction add/mul/max/min only, not '{reduction}' (the parser takes 'none' as is)"
    if graph.opset < 16:
        return f"needs opset >= 16 (scatter reductions; the model's is {graph.opset})"
    if any(static_shape(t) is None for t in node.inputs[:3]):
        return "needs static shapes for data, indices and updates"
    size = one_hot_size(node, static_shape(node.inputs[0]), static_shape(node.inputs[1]))
    if size > MAX_ONE_HOT:
        return f"the one-hot mask would hold {size} elements (at most {MAX_ONE_HOT})"
    return None


def _elements_one_hot(node: gs.Node, data: list[int], indices: list[int]) -> int:
    return int(np.prod(indices)) * data[attr(node, "axis", 0) % len(data)]


def _nd_one_hot(node: gs.Node, data: list[int], indices: list[int]) -> int:
    return int(np.prod(indices[:-1])) * int(np.prod(data[:indices[-1]])) * int(np.prod(data[indices[-1]:]))


class ScatterElementsReduction(Rewrite):
    name = "scatterelements-onehot"
    op = OpKey("ScatterElements")
    summary = "one-hot Equal + Where + Reduce* over the updates, combined with the data"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        return _refusal(node, graph, _elements_one_hot)

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        data, indices, updates = node.inputs[:3]
        d_shape, u_shape = static_shape(data), static_shape(indices)
        axis = attr(node, "axis", 0) % len(d_shape)
        size = d_shape[axis]
        spread = u_shape[:axis + 1] + [1] + u_shape[axis + 1:]  # a positions axis after `axis`
        index = _reshape(b, _non_negative(b, indices, size), spread)
        positions = b.const(np.arange(size).reshape([1] * (axis + 1) + [size] + [1] * (len(d_shape) - axis - 1)),
                            np.dtype(indices.dtype), what="positions")
        one_hot = b.op("Equal", [index, positions])
        reduced = _scatter(b, node, one_hot, _reshape(b, updates, spread), axis, graph.opset)
        short = [d - u for d, u in zip(d_shape, u_shape)]
        short[axis] = 0
        if any(short):  # the updates cover only a leading block of the other axes: the neutral element elsewhere
            pads = b.const([0] * len(d_shape) + short, np.int64)
            reduced = b.op("Pad", [reduced, pads, b.const(_neutral(attr(node, "reduction"), updates.dtype))])
        _combine(b, node, data, reduced)


class ScatterNDReduction(Rewrite):
    name = "scatternd-onehot"
    op = OpKey("ScatterND")
    summary = "index tuples flattened, one-hot Equal + Where + Reduce* over the updates, combined with the data"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        return _refusal(node, graph, _nd_one_hot)

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        data, indices, updates = node.inputs[:3]
        d_shape, i_shape = static_shape(data), static_shape(indices)
        k = i_shape[-1]
        lead, rest = d_shape[:k], d_shape[k:]
        count, positions = int(np.prod(i_shape[:-1])), int(np.prod(lead))
        flat = _flat_index(b, indices, count, lead)  # [count, 1]
        arange = b.const(np.arange(positions).reshape(1, positions), np.dtype(indices.dtype), what="positions")
        one_hot = _reshape(b, b.op("Equal", [flat, arange]), [count, positions] + [1] * len(rest))
        spread = _reshape(b, updates, [count, 1] + rest)
        reduced = _scatter(b, node, one_hot, spread, 0, graph.opset)  # [positions, *rest]
        _combine(b, node, data, _reshape(b, reduced, d_shape))


def _flat_index(b: Builder, indices: gs.Tensor, count: int, lead: list[int]) -> gs.Tensor:
    """ScatterND's index tuples (`count` of them) into the data's leading dimensions `lead` -> row-major flat
    indices [count, 1]; folded where the indices are constant."""
    dims = np.array(lead, dtype=np.int64)
    strides = np.cumprod([1] + lead[::-1])[:-1][::-1]
    value = constant_value(indices)
    if value is not None:
        value = value.reshape(count, len(lead))
        flat = (np.where(value < 0, value + dims, value) * strides).sum(axis=1, keepdims=True)
        return b.const(flat.astype(value.dtype), what="index")
    dtype = np.dtype(indices.dtype)
    tuples = _reshape(b, _non_negative(b, indices, dims.astype(dtype)), [count, len(lead)])
    flat = None
    for i, stride in enumerate(strides):  # a sum of k columns: no integer ReduceSum or MatMul for the parser
        column = b.op("Gather", [tuples, b.const([i], np.int64)], {"axis": 1})
        term = b.op("Mul", [column, b.const(stride, dtype)]) if stride != 1 else column
        flat = term if flat is None else b.op("Add", [flat, term])
    return flat
