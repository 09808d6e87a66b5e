"""Resize forms the parser refuses (antialias=1, coordinate_transformation_mode='tf_crop_and_resize',
keep_aspect_ratio_policy other than 'stretch') as two MatMuls: Y = A_h @ X @ A_w^T (+ E), the height then the width.

A Resize of an NCHW image over H and W only is separable: every mode (nearest, linear, cubic, with antialias) gives
each output row a fixed combination of input rows and each output column one of input columns, and
tf_crop_and_resize adds a constant E (the extrapolation value wherever the row or the column falls outside). The
matrices are read off ONNX Runtime itself, so they hold its exact semantics (the aspect-ratio policy's scale, the
antialias filter, the crop): the same Resize, with the node's input shape and constant roi/scales/sizes, is run on
probe images (zeros: E; ones; one row of ones at a time; one column of ones at a time), and A_h and A_w are taken from
those up to a common factor that cancels in the product. A random image then checks the factorization.

Preconditions: a float X of rank 4 with a static shape, constant roi/scales/sizes, N and C left as they are (only H
and W resized), opset >= 11, interpolation matrices of at most MAX_MATRIX elements together.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper

from trtflow.stages.onnx.rewrites.nodes import attr
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, constant_value, static_shape, take_over_outputs

MAX_MATRIX = 1 << 24  # elements of A_h and A_w together: 64 MB of float32
FLOATS = (np.float32, np.float16)
PROBE_ATOL = 1e-3  # a random image through the factorization vs ONNX Runtime: float32 rounding is ~1e-6
INPUTS = ("roi", "scales", "sizes")  # Resize's inputs after X (opset >= 11)


def _covered(node: gs.Node) -> bool:
    """The forms the parser refuses: antialiasing, cropping, an aspect-ratio policy."""
    return bool(attr(node, "antialias", 0)) or attr(node, "coordinate_transformation_mode") == "tf_crop_and_resize" \
        or attr(node, "keep_aspect_ratio_policy", "stretch") != "stretch"


def _constants(node: gs.Node) -> dict[str, np.ndarray] | None:
    """roi/scales/sizes that are given, by name; None where one of them is not a constant."""
    found = {}
    for name, tensor in zip(INPUTS, node.inputs[1:]):
        if not tensor.name:
            continue
        value = constant_value(tensor)
        if value is None:
            return None
        found[name] = value  # empty ones too (opset 11-12's "no scales"): the probe runs the node as it is
    return found


def _key(node: gs.Node, opset: int) -> tuple:
    """What the probe depends on, hashable (for the cache shared by `refuses` and `replace`)."""
    values = tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in sorted(_constants(node).items()))
    attrs = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in node.attrs.items()))
    return tuple(static_shape(node.inputs[0])), attrs, values, opset


def _probe_model(shape: list[int], attrs: dict, values: dict[str, np.ndarray], opset: int) -> onnx.ModelProto:
    inits = [onnx.numpy_helper.from_array(v, name) for name, v in values.items()]
    inputs = ["X"] + [name if name in values else "" for name in INPUTS]
    while inputs[-1] == "":
        inputs.pop()
    node = helper.make_node("Resize", inputs, ["Y"], **attrs)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)], initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


class _NotSeparable(Exception):
    pass


class _Runner:
    """The probe model in an ONNX Runtime session: images [H, W] in, their Resize out, N*C images a run."""

    def __init__(self, model: onnx.ModelProto, shape: list[int]):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        self.shape, self.slots = shape, shape[0] * shape[1]

    def run(self, images: np.ndarray) -> np.ndarray:
        """[k <= N*C, H, W] -> [k, oH, oW], float64."""
        batch = np.zeros((self.slots, *self.shape[2:]), np.float32)
        batch[:len(images)] = images
        out = self.session.run(None, {"X": batch.reshape(self.shape)})[0]
        if out.shape[:2] != tuple(self.shape[:2]):
            raise _NotSeparable(f"resizes N or C ({self.shape} -> {list(out.shape)}): covers H and W only")
        return out.reshape(self.slots, *out.shape[2:])[:len(images)].astype(np.float64)

    def each(self, count: int, image, keep) -> np.ndarray:
        """keep(output) of image(i) for i < count, stacked."""
        kept = []
        for start in range(0, count, self.slots):
            outs = self.run(np.stack([image(i) for i in range(start, min(count, start + self.slots))]))
            kept += [keep(o) for o in outs]
        return np.stack(kept)


def _factor(runner: _Runner) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A_h [oH, H], A_w [oW, W] and E [oH, oW]: E is the Resize of zeros; the Resize of ones less E is
    (A_h @ 1)(A_w @ 1)^T, of row j of ones A_h[:, j] (A_w @ 1)^T, of column m of ones (A_h @ 1) A_w[:, m]^T. At
    an output (r, c) where the ones' is largest, column c of the rows' and row r of the columns' give A_h and A_w,
    each off by a factor the other cancels."""
    h, w = runner.shape[2:]
    zeros_ones = runner.run(np.stack([np.zeros((h, w)), np.ones((h, w))]))
    e, ones = zeros_ones[0], zeros_ones[1] - zeros_ones[0]
    if ones.size and (ones.shape[0] * h + ones.shape[1] * w) > MAX_MATRIX:
        raise _NotSeparable(f"the interpolation matrices would hold {ones.shape[0] * h + ones.shape[1] * w} "
                            f"elements (at most {MAX_MATRIX})")
    r, c = np.unravel_index(np.argmax(np.abs(ones)), ones.shape)
    if ones[r, c] == 0:
        raise _NotSeparable("the Resize of an image of ones is constant: nothing to read the matrices off")

    def row(j):
        image = np.zeros((h, w))
        image[j] = 1
        return image

    def column(m):
        image = np.zeros((h, w))
        image[:, m] = 1
        return image

    a_h = runner.each(h, row, lambda out: out[:, c] - e[:, c]).T
    a_w = runner.each(w, column, lambda out: (out[r, :] - e[r, :]) / ones[r, c]).T
    return a_h, a_w, e


@lru_cache(maxsize=16)
def _probe(key: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray] | str:
    """(A_h, A_w, E) as ONNX Runtime computes this Resize; or why not, one line."""
    shape, attrs, values, opset = key
    model = _probe_model(list(shape), {k: list(v) if isinstance(v, tuple) else v for k, v in attrs},
                         {k: np.frombuffer(b, dtype=d).reshape(s) for k, d, s, b in values}, opset)
    n, c, h, w = shape
    try:
        runner = _Runner(model, list(shape))
        a_h, a_w, e = _factor(runner)
        check = np.random.default_rng(0).standard_normal((n * c, h, w))
        expected = runner.each(n * c, lambda i: check[i], lambda out: out)
    except _NotSeparable as why:
        return str(why)
    except Exception as err:  # noqa: BLE001 - ONNX Runtime refusing the node: the rule does not apply
        return f"ONNX Runtime could not run this Resize: {' '.join(str(err).split())[:300]}"
    if np.max(np.abs(a_h @ check @ a_w.T + e - expected), initial=0) > PROBE_ATOL:
        return "ONNX Runtime's Resize is not A_h @ X @ A_w^T + E here (are N or C resampled?)"
    return a_h, a_w, e


class ResizeMatMul(Rewrite):
    name = "resize-matmul"
    op = OpKey("Resize")
    summary = "two MatMuls (height, then width) with interpolation matrices read off ONNX Runtime"

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        if not _covered(node):
            return ("covers antialias=1, coordinate_transformation_mode='tf_crop_and_resize' and "
                    "keep_aspect_ratio_policy other than 'stretch' only (the parser takes this Resize as is)")
        if graph.opset < 11:
            return f"needs opset >= 11 (Resize's roi/scales/sizes inputs; the model's is {graph.opset})"
        x = node.inputs[0]
        shape = static_shape(x)
        if shape is None:
            return "needs a static input shape"
        if len(shape) != 4:
            return f"covers 4-D NCHW input only (resizing H and W), not rank {len(shape)}"
        if x.dtype not in FLOATS:
            return f"needs a float16/float32 input (MatMul), not {x.dtype}"
        if _constants(node) is None:
            return "needs constant roi, scales and sizes"
        found = _probe(_key(node, graph.opset))
        return found if isinstance(found, str) else None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        x = node.inputs[0]
        a_h, a_w, e = _probe(_key(node, graph.opset))
        rows = b.op("MatMul", [b.const(a_h, x.dtype, what="rows"), x])  # [N, C, oH, W]
        y = b.op("MatMul", [rows, b.const(a_w.T, x.dtype, what="columns")], dtype=x.dtype)  # [N, C, oH, oW]
        if np.any(e):  # tf_crop_and_resize's extrapolation value outside the crop
            y = b.op("Add", [y, b.const(e, x.dtype, what="outside")], dtype=x.dtype)
        take_over_outputs(node, [y], b)
