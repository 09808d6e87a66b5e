"""`ai.onnx.ml` ops (scikit-learn's exports through skl2onnx) the parser has no importer for, where the op is plain
arithmetic.

Scaler: Y = (float(X) - offset) * scale, per feature along the last axis (or one value for all), in float as ONNX
Runtime computes it: a Cast (where X is not float), a Sub and a Mul by constants. Needs the feature count where
offset and scale have more than one value; the default domain's Sub/Mul/Cast exist at every opset a model with ml ops
has.

Normalizer: each row of a [N, C] input (or the one row of a [C] one), cast to float, divided by its norm over the
last axis, as ONNX Runtime computes it: MAX the row's (signed) maximum, L1 the sum of absolute values, L2 the square
root of the sum of squares, and a row whose norm is 0 left as it is (ONNX Runtime divides only where the norm is not
0). So Cast, ReduceMax / ReduceL1 / Sqrt(ReduceSumSquare) with keepdims, a Where(norm == 0, 1, norm), and a Div.
Needs the input's rank (1 or 2); the Reduce ops take their axes as an input from opset 18, an attribute before.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr, dtype_of, rank
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, take_over_outputs

ML = "ai.onnx.ml"
FLOAT = 1  # onnx.TensorProto.FLOAT
NORMS = ("MAX", "L1", "L2")
REDUCE_AXES_AS_INPUT = 18  # the opset from which every Reduce op takes `axes` as an input


class ScalerAsSubMul(Rewrite):
    name = "scaler-sub-mul"
    op = OpKey("Scaler", ML)
    summary = "(float(X) - offset) * scale: a Cast, a Sub and a Mul by constants"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        offset, scale = _values(node, "offset"), _values(node, "scale")
        widths = {len(v) for v in (offset, scale)} - {1}
        if len(widths) > 1:
            return f"offset has {len(offset)} values and scale {len(scale)}: not one per feature"
        if not widths:
            return None
        shape = getattr(node.inputs[0], "shape", None)
        features = shape[-1] if shape else None
        if not isinstance(features, (int, np.integer)) or features < 0:
            return "needs the input's feature count (its last dimension) to check offset and scale against it"
        if features != widths.pop():
            return f"offset and scale have {len(offset)} values for {features} features"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x = _as_float(b, node.inputs[0])
        shifted = b.op("Sub", [x, b.const(_values(node, "offset"), np.float32, "offset")], dtype=np.float32)
        scaled = b.op("Mul", [shifted, b.const(_values(node, "scale"), np.float32, "scale")], dtype=np.float32)
        take_over_outputs(node, [scaled], b)


def _values(node: gs.Node, name: str) -> list[float]:
    """Scaler's offset or scale (the ONNX defaults: none given means one value, 0 for offset and 1 for scale)."""
    given = attr(node, name, None)
    return [float(v) for v in given] if given else [0.0 if name == "offset" else 1.0]




# --- Normalizer ---------------------------------------------------------------------------------------------------

def _norm(node: gs.Node) -> str:
    given = attr(node, "norm", "MAX")
    return given.decode() if isinstance(given, bytes) else str(given)


def _reduce(b: Builder, op: str, x: gs.Tensor, opset: int) -> gs.Variable:
    """`op` over the last axis, keepdims."""
    if opset >= REDUCE_AXES_AS_INPUT:
        return b.op(op, [x, b.const([-1], np.int64, what="axes")], {"keepdims": 1}, dtype=np.float32)
    return b.op(op, [x], {"axes": [-1], "keepdims": 1}, dtype=np.float32)


def _row_norm(b: Builder, norm: str, x: gs.Tensor, opset: int) -> gs.Variable:
    if norm == "MAX":
        return _reduce(b, "ReduceMax", x, opset)
    if norm == "L1":
        return _reduce(b, "ReduceL1", x, opset)
    return b.op("Sqrt", [_reduce(b, "ReduceSumSquare", x, opset)], dtype=np.float32)


class NormalizerAsReduceDiv(Rewrite):
    name = "normalizer-reduce-div"
    op = OpKey("Normalizer", ML)
    summary = "x / norm over the last axis (ReduceMax, ReduceL1 or Sqrt of ReduceSumSquare), a 0 norm taken as 1"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        if _norm(node) not in NORMS:
            return f"norm {_norm(node)!r} is none of {', '.join(NORMS)}"
        if rank(node.inputs[0]) not in (1, 2):
            return "needs the input's rank, 1 or 2 ([C] or [N, C])"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x = _as_float(b, node.inputs[0])
        norm = _row_norm(b, _norm(node), x, graph.opset)
        is_zero = b.op("Equal", [norm, b.const(0.0, np.float32, "zero")], dtype=np.bool_)
        safe = b.op("Where", [is_zero, b.const(1.0, np.float32, "one"), norm], dtype=np.float32)
        take_over_outputs(node, [b.op("Div", [x, safe], dtype=np.float32)], b)


def _as_float(b: Builder, x: gs.Tensor) -> gs.Tensor:
    """`x` in float32, as ONNX Runtime computes the ml ops (a Cast where it is another type)."""
    return x if dtype_of(x) == np.dtype(np.float32) else b.op("Cast", [x], {"to": FLOAT}, dtype=np.float32)
