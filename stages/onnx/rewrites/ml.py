"""`ai.onnx.ml` ops (scikit-learn's exports through skl2onnx) the parser has no importer for, where the op is plain
arithmetic.

Scaler: Y = (float(X) - offset) * scale, per feature along the last axis (or one value for all), in float as ONNX
Runtime computes it: a Cast (where X is not float), a Sub and a Mul by constants. Needs the feature count where
offset and scale have more than one value; the default domain's Sub/Mul/Cast exist at every opset a model with ml ops
has.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr, dtype_of
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, take_over_outputs

ML = "ai.onnx.ml"
FLOAT = 1  # onnx.TensorProto.FLOAT


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
        x = node.inputs[0]
        if dtype_of(x) != np.dtype(np.float32):
            x = b.op("Cast", [x], {"to": FLOAT}, dtype=np.float32)
        shifted = b.op("Sub", [x, b.const(_values(node, "offset"), np.float32, "offset")], dtype=np.float32)
        scaled = b.op("Mul", [shifted, b.const(_values(node, "scale"), np.float32, "scale")], dtype=np.float32)
        take_over_outputs(node, [scaled], b)


def _values(node: gs.Node, name: str) -> list[float]:
    """Scaler's offset or scale (the ONNX defaults: none given means one value, 0 for offset and 1 for scale)."""
    given = attr(node, name, None)
    return [float(v) for v in given] if given else [0.0 if name == "offset" else 1.0]


