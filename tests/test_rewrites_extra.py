"""The rules for Compress (constant condition), MaxUnpool (static shapes), Det of 4x4 matrices and ai.onnx.ml's
Normalizer. Each case is a small model built here: the rule applies, ONNX Runtime gives the same outputs before and
after, and TensorRT-RTX parses and builds the rewritten model where it refused the original
(tests/rewrite_checks.py). The rules also refuse, in one line saying why, what they do not cover."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.rewrite_checks import check_rewrite, run_ort
from trtflow.stages.onnx.rewrites.apply import Refused, apply
from trtflow.stages.onnx.rewrites.linalg import DetByCofactors
from trtflow.stages.onnx.rewrites.ml import ML, NormalizerAsReduceDiv
from trtflow.stages.onnx.rewrites.selection import CompressAsGather, MaxUnpoolAsScatter

FLOAT, DOUBLE, INT64, BOOL = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.BOOL


def _model(nodes: list, inputs: list, outputs: list, opset: int = 18, inits=(), ml: bool = False) -> onnx.ModelProto:
    """`inputs`, `outputs`: (name, elem type, shape); an output's shape None is what shape inference gives."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(ML, 1)] if ml else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model).graph
    for out, new in zip(model.graph.output, inferred.output):
        if not out.type.tensor_type.HasField("shape"):
            out.CopyFrom(new)
    return model


def _random(shape, seed: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _refusal(model: onnx.ModelProto, rule) -> str:
    with pytest.raises(Refused) as refused:
        apply(model, "n", rule)
    return str(refused.value)


# --- Compress (constant condition) --------------------------------------------------------------------------------

def compress(shape, condition, axis=None, constant=True):
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node("Compress", ["x", "c"], ["y"], name="n", **attrs)
    cond = np.array(condition, dtype=np.bool_)
    inputs = [("x", FLOAT, list(shape))] + ([] if constant else [("c", BOOL, [cond.size])])
    inits = [numpy_helper.from_array(cond, "c")] if constant else []
    model = _model([node], inputs, [("y", FLOAT, None)], inits=inits)
    return model, {"x": _random(shape, 1)} | ({} if constant else {"c": cond})


COMPRESS = {"axis-0": ([3, 2], [True, False, True], 0), "axis-negative": ([2, 3, 4], [False, True, True, True], -1),
            "axis-short-condition": ([2, 5, 2], [True, False, True], 1),
            "no-axis-flattened": ([2, 3], [False, True, False, True, True], None)}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", COMPRESS)
def test_compress_becomes_a_gather_of_constant_indices(case, tmp_path):
    shape, condition, axis = COMPRESS[case]
    model, feeds = compress(shape, condition, axis)
    check_rewrite(model, "n", CompressAsGather(), feeds, 0.0, tmp_path)


def test_compress_refuses_a_computed_or_all_false_condition():
    assert "constant condition" in _refusal(compress([3, 2], [True, False, True], 0, constant=False)[0],
                                            CompressAsGather())
    assert "keeps nothing" in _refusal(compress([3, 2], [False, False, False], 0)[0], CompressAsGather())


# --- MaxUnpool (static shapes) ------------------------------------------------------------------------------------

def _pooled(shape, seed, **pool):
    """MaxPool's values and flat indices of a random input of `shape`, by ONNX Runtime (the convention to match)."""
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="p", **pool)
    model = _model([node], [("x", FLOAT, list(shape))], [("y", FLOAT, None), ("i", INT64, None)])
    return run_ort(model, {"x": _random(shape, seed)})


def maxunpool(shape, output_shape=None, computed_shape=False, **pool):
    y, i = _pooled(shape, 5, **pool)
    names, inits, inputs = ["y", "i"], [], [("y", FLOAT, list(y.shape)), ("i", INT64, list(i.shape))]
    feeds = {"y": y, "i": i}
    if output_shape is not None:
        names.append("s")
        if computed_shape:
            inputs.append(("s", INT64, [len(output_shape)]))
            feeds["s"] = np.array(output_shape, np.int64)
        else:
            inits.append(numpy_helper.from_array(np.array(output_shape, np.int64), "s"))
    node = helper.make_node("MaxUnpool", names, ["u"], name="n", **pool)
    return _model([node], inputs, [("u", FLOAT, output_shape)], inits=inits), feeds


MAXUNPOOL = {"2d-k2-s2": ([2, 3, 4, 4], None, {"kernel_shape": [2, 2], "strides": [2, 2]}),
             "2d-overlapping-k3-s2-pads": ([1, 2, 7, 7], None,
                                           {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
             "2d-output-shape": ([1, 2, 5, 5], [1, 2, 5, 5], {"kernel_shape": [2, 2], "strides": [2, 2]}),
             "1d-stride-1": ([2, 2, 6], None, {"kernel_shape": [2]}),
             "3d": ([1, 1, 4, 4, 4], None, {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]})}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", MAXUNPOOL)
def test_maxunpool_becomes_a_scatter_into_zeros(case, tmp_path):
    shape, output_shape, pool = MAXUNPOOL[case]
    model, feeds = maxunpool(shape, output_shape, **pool)
    check_rewrite(model, "n", MaxUnpoolAsScatter(), feeds, 0.0, tmp_path)


def test_maxunpool_refuses_a_computed_output_shape_and_unknown_shapes():
    model, _ = maxunpool([1, 2, 4, 4], [1, 2, 4, 4], computed_shape=True, kernel_shape=[2, 2], strides=[2, 2])
    assert "constant output_shape" in _refusal(model, MaxUnpoolAsScatter())
    node = helper.make_node("MaxUnpool", ["y", "i"], ["u"], name="n", kernel_shape=[2, 2], strides=[2, 2])
    dynamic = _model([node], [("y", FLOAT, ["b", 1, 2, 2]), ("i", INT64, ["b", 1, 2, 2])], [("u", FLOAT, None)])
    assert "static" in _refusal(dynamic, MaxUnpoolAsScatter())


# --- Det (4x4) ----------------------------------------------------------------------------------------------------

def det(shape, declared=None, seed=10):
    model = _model([helper.make_node("Det", ["x"], ["y"], name="n")], [("x", FLOAT, declared or shape)],
                   [("y", FLOAT, None)])
    return model, {"x": _random(shape, seed)}


DET4 = {"4x4-batched": {"shape": [3, 4, 4]}, "4x4-single": {"shape": [4, 4]},
        "4x4-two-batch-dims": {"shape": [2, 3, 4, 4], "seed": 11},
        "4x4-dynamic-batch": {"shape": [5, 4, 4], "declared": ["b", 4, 4], "seed": 12}}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", DET4)
def test_det_4x4_becomes_a_laplace_expansion(case, tmp_path):
    model, feeds = det(**DET4[case])
    check_rewrite(model, "n", DetByCofactors(), feeds, 1e-6, tmp_path)  # measured 4.8e-7


def test_det_refuses_5x5():
    assert "5! terms" in _refusal(det([2, 5, 5])[0], DetByCofactors())


# --- ai.onnx.ml Normalizer ----------------------------------------------------------------------------------------

def normalizer(norm, dtype=FLOAT, shape=(5, 4), opset=18, declared=None):
    node = helper.make_node("Normalizer", ["x"], ["y"], name="n", domain=ML, norm=norm)
    model = _model([node], [("x", dtype, declared or list(shape))], [("y", FLOAT, list(shape))], opset, ml=True)
    x = _random(shape, 7, helper.tensor_dtype_to_np_dtype(dtype))
    if len(shape) == 2:
        x[1] = 0  # an all-zero row: ONNX Runtime leaves it as it is
        x[2] = -np.abs(x[2])  # a row whose MAX norm is negative
        x[3, :-1], x[3, -1] = -np.abs(x[3, :-1]), 0  # ... and one whose maximum is 0: left as it is too
    return model, {"x": x}


NORMALIZER = {f"{norm}-{tag}": (norm, kwargs) for norm in ("MAX", "L1", "L2") for tag, kwargs in
              {"float": {}, "double": {"dtype": DOUBLE}, "opset-13": {"opset": 13}, "1-d": {"shape": (6,)},
               "dynamic-batch": {"declared": ["n", 4]}}.items()}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", NORMALIZER)
def test_normalizer_becomes_a_reduce_and_a_div(case, tmp_path):
    norm, kwargs = NORMALIZER[case]
    model, feeds = normalizer(norm, **kwargs)
    check_rewrite(model, "n", NormalizerAsReduceDiv(), feeds, 1.2e-7, tmp_path)  # L2: 6e-8, MAX and L1: 0


def test_normalizer_refuses_an_unknown_norm_and_rank():
    assert "none of MAX, L1, L2" in _refusal(normalizer("L3")[0], NormalizerAsReduceDiv())
    node = helper.make_node("Normalizer", ["x"], ["y"], name="n", domain=ML, norm="L2")
    model = _model([node], [("x", FLOAT, [2, 3, 4])], [("y", FLOAT, [2, 3, 4])], ml=True)
    assert "rank" in _refusal(model, NormalizerAsReduceDiv())
