"""Det, which the parser has no importer for, of 1x1 to 4x4 matrices (any batch dimensions before them).

Each entry x[..., i, j] is two Gathers of scalar indices (on the last two axes), and the determinant the cofactor
expansion along the first row: a*d - b*c for 2x2, a*(e*i - f*h) - b*(d*i - f*g) + c*(d*h - e*g) for 3x3, and for
4x4 the same Laplace expansion, sum over k of (-1)^k x[0][k] * det3(the minor without row 0 and column k), each
minor by the 3x3 path (40 products in all). Needs the last two sizes static and equal. Refuses larger matrices: the
expansion has n! terms, and the LU factorisation ONNX Runtime uses pivots (data-dependent row swaps), which these ops
cannot express.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import is_static
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, take_over_outputs

MAX_SIZE = 4


def _matrix_size(tensor: gs.Tensor) -> int | None:
    shape = getattr(tensor, "shape", None)
    if shape is None or len(shape) < 2:
        return None
    rows, cols = shape[-2], shape[-1]
    if not is_static(rows) or rows != cols:
        return None
    return int(rows)


def _entries(b: Builder, x: gs.Tensor, n: int) -> list[list[gs.Variable]]:
    """entries[i][j] = x[..., i, j]."""
    rows = [b.op("Gather", [x, b.const(i, np.int64, what="row")], {"axis": -2}) for i in range(n)]
    return [[b.op("Gather", [row, b.const(j, np.int64, what="col")], {"axis": -1}) for j in range(n)] for row in rows]


def _det2(b: Builder, p: gs.Tensor, q: gs.Tensor, r: gs.Tensor, s: gs.Tensor) -> gs.Variable:
    """p*s - q*r: the determinant of [[p, q], [r, s]]."""
    return b.op("Sub", [b.op("Mul", [p, s]), b.op("Mul", [q, r])])


def _minor(m: list[list[gs.Variable]], k: int) -> list[list[gs.Variable]]:
    """m without its first row and column k."""
    return [[e for j, e in enumerate(row) if j != k] for row in m[1:]]


def _det(b: Builder, m: list[list[gs.Variable]]) -> gs.Variable:
    """The determinant of the n x n entries m: m[0][0], the 2x2 formula, or the expansion over the first row
    ((m00*M0 - m01*M1) + m02*M2) - m03*M3 with each minor's determinant by this function."""
    if len(m) == 1:
        return m[0][0]
    if len(m) == 2:
        return _det2(b, m[0][0], m[0][1], m[1][0], m[1][1])
    det = None
    for k, entry in enumerate(m[0]):
        term = b.op("Mul", [entry, _det(b, _minor(m, k))])
        det = term if det is None else b.op("Sub" if k % 2 else "Add", [det, term])
    return det


class DetByCofactors(Rewrite):
    name = "det-cofactors"
    op = OpKey("Det")
    summary = "cofactor expansion over Gathered entries (up to 4x4)"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        n = _matrix_size(node.inputs[0])
        if n is None or n < 1:
            return "needs the matrix size static: the input's last two dimensions known, equal and not 0"
        if n > MAX_SIZE:
            return (f"{n}x{n}: the cofactor expansion has {n}! terms, and the LU factorisation needs data-dependent "
                    f"pivoting; rewritten only up to {MAX_SIZE}x{MAX_SIZE}")
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        n = _matrix_size(node.inputs[0])
        take_over_outputs(node, [_det(b, _entries(b, node.inputs[0], n))], b)
