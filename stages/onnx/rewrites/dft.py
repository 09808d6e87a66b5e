"""DFT (opset 17: `axis` an attribute; opset 20: an input) as one MatMul with a constant cos/sin matrix.

A DFT over one axis is linear in the real and imaginary parts of its input: with the axis moved next to the last
(complex) dimension by a Transpose and the two merged by a Reshape into [..., L*c] (c = 1 real, 2 complex), one
MatMul by a [L*c, K*2] matrix gives the real and imaginary parts of every output bin interleaved, [..., K*2], and a
Reshape splits them into [..., K, 2] (the cos and sin terms of both parts in the one matrix, so no Concat is needed).
Both Reshapes copy the leading dimensions (a 0 in the target shape), so those may be dynamic: a batch, or a frame
count coming out of a Scan (an fbank front-end's STFT frames).
The matrix holds everything else: forward or inverse (sign, 1/n), one-sided (RFFT: K = n//2+1 bins; IRFFT: the
conjugate-symmetric half weighted twice, a real output of n), and dft_length (the signal cut or zero-padded to n).

Preconditions: a float16/float32 input of known rank whose length along the axis and last dimension are static (the
other dimensions may be dynamic), constant dft_length and axis, opset >= 17, a matrix of at most MAX_MATRIX
elements.
"""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr, is_static, rank
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, constant_value, take_over_outputs

MAX_MATRIX = 1 << 24  # elements of the cos/sin matrix: 64 MB of float32
FLOATS = (np.float32, np.float16)


def _scalar_input(node: gs.Node, i: int) -> tuple[bool, int | None]:
    """(given, its value) for an optional scalar input; value None where it is given but not a constant."""
    if len(node.inputs) <= i or not node.inputs[i].name:
        return False, None
    value = constant_value(node.inputs[i])
    return True, None if value is None else int(value.reshape(-1)[0])


def _static(dim) -> int | None:
    return int(dim) if is_static(dim) else None


class _Dft:
    """The node's parameters with the ONNX defaults: axis (non-negative), L (the input's length along it, None where
    dynamic), c_in (the last dimension, None where dynamic), n (the DFT length), K (output bins)."""

    def __init__(self, node: gs.Node, opset: int):
        self.shape = list(node.inputs[0].shape)  # the caller checked the rank is known
        r = len(self.shape)
        self.inverse, self.onesided = bool(attr(node, "inverse", 0)), bool(attr(node, "onesided", 0))
        if opset >= 20:
            given, axis = _scalar_input(node, 2)
            axis = axis if given else -2
        else:
            axis = attr(node, "axis", 1)
        self.axis = None if axis is None else axis + r if axis < 0 else axis
        valid = self.axis is not None and 0 <= self.axis <= r - 2
        self.length = _static(self.shape[self.axis]) if valid else None
        self.complex_in = _static(self.shape[-1])
        given, n = _scalar_input(node, 1)
        self.constants = self.axis is not None and (n is not None or not given)
        irfft = self.inverse and self.onesided
        self.n = n if given else None if self.length is None else 2 * (self.length - 1) if irfft else self.length
        self.bins = 0 if self.n is None else self.n // 2 + 1 if self.onesided and not self.inverse else self.n
        self.complex_out = 1 if irfft else 2


def _why_not(d: _Dft, r: int) -> str | None:
    if not d.constants:
        return "needs constant axis and dft_length"
    if not 0 <= d.axis <= r - 2:
        return f"axis {d.axis} is out of range for rank {r}"
    if d.length is None:
        return f"needs a static length along the axis ({d.axis}), not {d.shape[d.axis]!r}"
    if d.complex_in not in (1, 2):
        return f"the last dimension must be 1 (real) or 2 (complex), not {d.shape[-1]!r}"
    if d.onesided and d.complex_in != (2 if d.inverse else 1):
        return "a one-sided forward DFT takes real input, a one-sided inverse complex input"
    if d.n < 1:
        return f"the DFT length must be positive, not {d.n}"
    if d.length * d.complex_in * d.bins * d.complex_out > MAX_MATRIX:
        return f"the matrix would hold {d.length * d.complex_in * d.bins * d.complex_out} elements (at most " \
               f"{MAX_MATRIX})"
    return None


def _matrix(d: _Dft) -> np.ndarray:
    """[L*c_in, K*c_out]: row p*c_in + (0 re, 1 im) of input bin p, column q*c_out + (0 re, 1 im) of output bin q."""
    used = min(d.length, d.n)  # input bins past n are cut; missing ones are the zero padding
    p, q = np.arange(used)[:, None], np.arange(d.bins)[None, :]
    theta = 2 * np.pi * ((p * q) % d.n) / d.n  # the product reduced mod n first: exact angles for large n
    sign, scale = (1.0, 1.0 / d.n) if d.inverse else (-1.0, 1.0)
    cos, sin = scale * np.cos(theta), scale * sign * np.sin(theta)
    if d.complex_out == 1:  # IRFFT: bins 1..ceil(n/2)-1 stand for their conjugate mirrors too
        weight = np.where((p == 0) | (2 * p == d.n), 1.0, 2.0) * (p <= d.n // 2)
        cos, sin = cos * weight, sin * weight
    m = np.zeros((d.length, d.complex_in, d.bins, d.complex_out))
    m[:used, 0, :, 0] = cos
    if d.complex_out == 2:
        m[:used, 0, :, 1] = sin
    if d.complex_in == 2:
        m[:used, 1, :, 0] = -sin
        if d.complex_out == 2:
            m[:used, 1, :, 1] = cos
    return m.reshape(d.length * d.complex_in, d.bins * d.complex_out)


class DftMatMul(Rewrite):
    name = "dft-matmul"
    op = OpKey("DFT")
    summary = "one MatMul with a cos/sin matrix over the axis (Transpose and Reshape around it)"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        if graph.opset < 17:
            return f"needs opset >= 17 (DFT; the model's is {graph.opset})"
        x = node.inputs[0]
        r = rank(x)
        if r is None:
            return "needs an input of known rank"
        if r < 2:
            return f"needs an input of rank >= 2, not {r}"
        if x.dtype not in FLOATS:
            return f"needs a float16/float32 input (MatMul), not {x.dtype}"
        return _why_not(_Dft(node, graph.opset), r)

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b, d = Builder(graph, node), _Dft(node, graph.opset)
        x, r = node.inputs[0], len(d.shape)
        perm = [i for i in range(r - 1) if i != d.axis] + [d.axis, r - 1]  # the axis next to the last
        copy = [0] * (r - 2)  # the other dimensions, copied by both Reshapes: any of them may be dynamic
        moved = b.op("Transpose", [x], {"perm": perm}) if perm != list(range(r)) else x
        rows = b.op("Reshape", [moved, b.const(copy + [d.length * d.complex_in], np.int64)])
        product = b.op("MatMul", [rows, b.const(_matrix(d), x.dtype, what="dft")])
        y = b.op("Reshape", [product, b.const(copy + [d.bins, d.complex_out], np.int64)], dtype=x.dtype)
        if perm != list(range(r)):
            y = b.op("Transpose", [y], {"perm": [int(i) for i in np.argsort(perm)]}, dtype=x.dtype)
        take_over_outputs(node, [y], b)
