"""ONNX Runtime's contrib ops (domain com.microsoft), which the parser looks for as plugins it does not have
("Plugin not found"), as the standard ops they fuse. ONNX Runtime runs both, so every rewrite is checked against it.

SkipLayerNormalization: s = input + skip (+ bias), then LayerNormalization(s, gamma, beta) over the last axis (opset
17 on); where the mean or inv_std_var output is read (the parser takes LayerNormalization with one output only) or the
opset is older, the explicit mean / variance / reciprocal square root. The optional last output is s. Float16 needs
the LayerNormalization path (ONNX Runtime normalises in float32, as LayerNormalization's stash_type does).

FusedMatMul: alpha * MatMul(op(A), op(B)), op a Transpose: transBatch moves the first axis to just before the last
two, trans swaps the last two (ignored for rank 1). transBatch needs equal ranks >= 3, as ONNX Runtime does; any
transpose needs the rank.

BiasGelu: Gelu(A + B), erf-based: Gelu (opset 20 on) or 0.5 * x * (1 + Erf(x / sqrt(2))) (opset 9 on).
FastGelu: Gelu(X (+ bias)) in the tanh approximation: Gelu(approximate="tanh") (opset 20 on) or
0.5 * x * (1 + Tanh(x * (sqrt(2 / pi) + 0.044715 * sqrt(2 / pi) * x^2))).
QuickGelu: x * Sigmoid(alpha * x).
"""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr, dtype_of, is_read, present, rank
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, take_over_outputs

MS = "com.microsoft"
TRANSPOSES = ("transA", "transB", "transBatchA", "transBatchB")


def _take_over_read_outputs(node: gs.Node, produced: list[gs.Variable | None], b: Builder) -> None:
    """take_over_outputs for the outputs something reads (the others may have no replacement)."""
    for out, new in zip(node.outputs, produced):
        if is_read(out, b.graph):
            b.op("Identity", [new], outputs=[out])
    node.outputs.clear()
    node.inputs.clear()


# --- SkipLayerNormalization ---------------------------------------------------------------------------------------

def _reduce_mean(b: Builder, x: gs.Tensor, opset: int) -> gs.Variable:
    if opset >= 18:
        return b.op("ReduceMean", [x, b.const([-1], np.int64, what="axes")], {"keepdims": 1})
    return b.op("ReduceMean", [x], {"axes": [-1], "keepdims": 1})


def _explicit_layer_norm(b: Builder, s: gs.Tensor, gamma: gs.Tensor, beta: gs.Tensor | None, epsilon: np.ndarray,
                         opset: int) -> tuple[gs.Variable, gs.Variable, gs.Variable]:
    """(normalised * gamma (+ beta), mean, 1 / sqrt(variance + epsilon)) over the last axis."""
    mean = _reduce_mean(b, s, opset)
    centred = b.op("Sub", [s, mean])
    variance = _reduce_mean(b, b.op("Mul", [centred, centred]), opset)
    inv_std = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [variance, b.const(epsilon, what="epsilon")])])])
    out = b.op("Mul", [b.op("Mul", [centred, inv_std]), gamma])
    return (b.op("Add", [out, beta]) if beta is not None else out), mean, inv_std


class SkipLayerNormalizationAsLayerNorm(Rewrite):
    name = "skiplayernorm-layernorm"
    op = OpKey("SkipLayerNormalization", MS)
    summary = "Add (+ bias) + LayerNormalization (or its explicit formula where mean / inv_std are read)"

    @staticmethod
    def _explicit(node: gs.Node, graph: gs.Graph) -> bool:
        return graph.opset < 17 or any(is_read(o, graph) for o in node.outputs[1:3])

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        dtype = dtype_of(node.inputs[0])
        if dtype is None:
            return "needs the input's element type (float32, float16 or double)"
        if dtype == np.float16 and self._explicit(node, graph):
            return ("float16 is rewritten only to LayerNormalization (it normalises in float32, as ONNX Runtime does): "
                    "needs opset >= 17 and the mean and inv_std_var outputs unread")
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x, skip, gamma, beta, bias = node.inputs[0], node.inputs[1], node.inputs[2], present(node, 3), present(node, 4)
        s = b.op("Add", [x, skip])
        if bias is not None:
            s = b.op("Add", [s, bias])
        epsilon = float(attr(node, "epsilon", 1e-12))
        if self._explicit(node, graph):
            eps = np.asarray(epsilon, dtype=dtype_of(x))
            out, mean, inv_std = _explicit_layer_norm(b, s, gamma, beta, eps, graph.opset)
        else:
            ln_inputs = [s, gamma] + ([beta] if beta is not None else [])
            out, mean, inv_std = b.op("LayerNormalization", ln_inputs, {"axis": -1, "epsilon": epsilon}), None, None
        _take_over_read_outputs(node, [out, mean, inv_std, s], b)


# --- FusedMatMul --------------------------------------------------------------------------------------------------

def _perm(n: int, batch: bool, last_two: bool) -> list[int] | None:
    """FusedMatMul's transposition of an operand of rank n; None where it is the identity."""
    perm = list(range(n))
    if batch:
        perm = perm[1:n - 1] + [0, n - 1]
    if last_two and n >= 2:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    return None if perm == list(range(n)) else perm


class FusedMatMulAsMatMul(Rewrite):
    name = "fusedmatmul-matmul"
    op = OpKey("FusedMatMul", MS)
    summary = "Transpose + MatMul + Mul(alpha)"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        ranks = [rank(t) for t in node.inputs[:2]]
        batch = bool(attr(node, "transBatchA", 0) or attr(node, "transBatchB", 0))
        if any(attr(node, k, 0) for k in TRANSPOSES) and None in ranks:
            return "a transposed operand needs both inputs' ranks"
        if batch and (ranks[0] != ranks[1] or ranks[0] < 3):
            return f"transBatchA/B needs both inputs of the same rank >= 3 (ranks {ranks[0]} and {ranks[1]})"
        if float(attr(node, "alpha", 1.0)) != 1.0 and dtype_of(node.inputs[0]) is None:
            return "alpha needs the inputs' element type"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        operands = []
        for t, side in zip(node.inputs[:2], "AB"):
            n = rank(t)
            perm = None if n is None else _perm(n, bool(attr(node, f"transBatch{side}", 0)),
                                                bool(attr(node, f"trans{side}", 0)))
            operands.append(t if perm is None else b.op("Transpose", [t], {"perm": perm}))
        out = b.op("MatMul", operands)
        alpha = float(attr(node, "alpha", 1.0))
        if alpha != 1.0:
            out = b.op("Mul", [out, b.const(alpha, dtype=dtype_of(node.inputs[0]), what="alpha")])
        take_over_outputs(node, [out], b)


# --- Gelu family --------------------------------------------------------------------------------------------------

def _gelu_erf(b: Builder, x: gs.Tensor, dtype: np.dtype) -> gs.Variable:
    erf = b.op("Erf", [b.op("Mul", [x, b.const(1.0 / math.sqrt(2.0), dtype=dtype, what="rsqrt2")])])
    half = b.op("Mul", [x, b.const(0.5, dtype=dtype, what="half")])
    return b.op("Mul", [half, b.op("Add", [erf, b.const(1.0, dtype=dtype, what="one")])])


def _gelu_tanh(b: Builder, x: gs.Tensor, dtype: np.dtype) -> gs.Variable:
    k = math.sqrt(2.0 / math.pi)
    slope = b.op("Add", [b.const(k, dtype=dtype, what="k"),
                         b.op("Mul", [b.const(0.044715 * k, dtype=dtype, what="k3"), b.op("Mul", [x, x])])])
    tanh = b.op("Tanh", [b.op("Mul", [x, slope])])
    half = b.op("Mul", [x, b.const(0.5, dtype=dtype, what="half")])
    return b.op("Mul", [half, b.op("Add", [tanh, b.const(1.0, dtype=dtype, what="one")])])


def _gelu_refusal(node: gs.Node, graph: gs.Graph, min_opset: int, what: str) -> str | None:
    if dtype_of(node.inputs[0]) is None:
        return "needs the input's element type (for the formula's constants)"
    if graph.opset < min_opset:
        return f"{what} needs opset >= {min_opset}; this model is opset {graph.opset}"
    return None


def _biased(b: Builder, node: gs.Node) -> gs.Tensor:
    bias = present(node, 1)
    return node.inputs[0] if bias is None else b.op("Add", [node.inputs[0], bias])


class BiasGeluAsGelu(Rewrite):
    name = "biasgelu-gelu"
    op = OpKey("BiasGelu", MS)
    summary = "Add + Gelu (opset 20) or its Erf formula"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        return _gelu_refusal(node, graph, 9, "the Erf formula")

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x = _biased(b, node)
        out = b.op("Gelu", [x]) if graph.opset >= 20 else _gelu_erf(b, x, dtype_of(node.inputs[0]))
        take_over_outputs(node, [out], b)


class FastGeluAsGelu(Rewrite):
    name = "fastgelu-gelu-tanh"
    op = OpKey("FastGelu", MS)
    summary = "(Add +) Gelu(approximate=tanh) (opset 20) or its Tanh formula"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        return _gelu_refusal(node, graph, 6, "the Tanh formula")

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x = _biased(b, node)
        out = (b.op("Gelu", [x], {"approximate": "tanh"}) if graph.opset >= 20
               else _gelu_tanh(b, x, dtype_of(node.inputs[0])))
        take_over_outputs(node, [out], b)


class QuickGeluAsSigmoid(Rewrite):
    name = "quickgelu-sigmoid"
    op = OpKey("QuickGelu", MS)
    summary = "x * Sigmoid(alpha * x)"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        return _gelu_refusal(node, graph, 6, "Sigmoid")

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x = node.inputs[0]
        alpha = float(attr(node, "alpha", 1.702))
        scaled = x if alpha == 1.0 else b.op("Mul", [x, b.const(alpha, dtype=dtype_of(x), what="alpha")])
        take_over_outputs(node, [b.op("Mul", [x, b.op("Sigmoid", [scaled])])], b)
