"""MelWeightMatrix, which the parser has no importer for, with constant inputs: the matrix is then a constant,
computed here as the ONNX spec's reference does (the same operations on the same types, so the triangles' integer
edges fall on the same bins). Needs all five inputs constant, the edges inside the spectrogram's bins (ONNX Runtime
refuses the others too), and an output type numpy has.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, constant_value, take_over_outputs


def _edges(num_mel_bins: int, dft_length: int, sample_rate: int, lower_hz: np.ndarray,
           upper_hz: np.ndarray) -> np.ndarray:
    """The spectrogram bin of every triangle's edge (num_mel_bins + 2 of them)."""
    points = np.arange(0, num_mel_bins + 2)
    low_mel = 2595 * np.log1p(lower_hz / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper_hz / 700) / np.log(10)
    step = (high_mel - low_mel) / points.shape[0]  # sic: the spec divides by num_mel_bins + 2
    hertz = 700 * np.expm1((points * step + low_mel) / 2595 * np.log(10))
    return (((dft_length + 1) * hertz) // sample_rate).astype(int)


def mel_weight_matrix(num_mel_bins: int, dft_length: int, sample_rate: int, lower_hz: np.ndarray,
                      upper_hz: np.ndarray) -> np.ndarray | None:
    """[dft_length // 2 + 1, num_mel_bins] in float64; None where an edge falls outside the bins."""
    bins = dft_length // 2 + 1
    edges = _edges(num_mel_bins, dft_length, sample_rate, lower_hz, upper_hz)
    if edges.min() < 0 or edges.max() >= bins:
        return None
    out = np.zeros((bins, num_mel_bins))
    for i in range(num_mel_bins):
        left, center, right = (int(e) for e in edges[i:i + 3])
        if center == left:
            out[center, i] = 1.0
        else:
            rising = np.arange(left, center + 1)
            out[rising, i] = (rising - left) / float(center - left)
        if right > center:
            falling = np.arange(center, right)
            out[falling, i] = (right - falling) / float(right - center)
    return out


def _arguments(node: gs.Node) -> list[np.ndarray] | None:
    values = [constant_value(t) for t in node.inputs[:5]]
    return None if len(values) < 5 or any(v is None for v in values) else values


def _matrix(node: gs.Node) -> np.ndarray | None:
    args = _arguments(node)
    if args is None:
        return None
    bins, length, rate = (int(v) for v in args[:3])
    # the edges keep their own type (float32 in most models): the spec's arithmetic is done in it
    return mel_weight_matrix(bins, length, rate, args[3].reshape(()), args[4].reshape(()))


def _output_dtype(node: gs.Node) -> np.dtype | None:
    code = int(attr(node, "output_datatype", onnx.TensorProto.FLOAT))
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
    except (KeyError, ValueError, TypeError):
        return None


class MelWeightMatrixAsConstant(Rewrite):
    name = "melweightmatrix-constant"
    op = OpKey("MelWeightMatrix")
    summary = "the matrix as a constant"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        if _arguments(node) is None:
            return "needs all five inputs constant"
        if _output_dtype(node) is None:
            return f"output_datatype {attr(node, 'output_datatype')} has no numpy type"
        if _matrix(node) is None:
            return "the upper edge puts a triangle past the last spectrogram bin (dft_length // 2)"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        take_over_outputs(node, [b.op("Identity", [b.const(_matrix(node), dtype=_output_dtype(node), what="mel")])], b)
