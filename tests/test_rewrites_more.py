"""Issue #68: the rules for Mod (fmod=0 on floats), Dropout (training mode, ratio 0), LpPool, CenterCropPad,
AffineGrid, Col2Im, Det, MelWeightMatrix and ONNX Runtime's SkipLayerNormalization, FusedMatMul, BiasGelu, FastGelu
and QuickGelu. Each case is a small model built here: the rule applies, ONNX Runtime gives the same outputs before
and after, and TensorRT-RTX parses and builds the rewritten model where it refused the original
(tests/rewrite_checks.py). The rules also refuse, in one line saying why, what they do not cover."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.rewrite_checks import check_rewrite, run_ort
from trtflow.stages.onnx.rewrites.apply import Refused, apply
from trtflow.stages.onnx.rewrites.audio import MelWeightMatrixAsConstant, mel_weight_matrix
from trtflow.stages.onnx.rewrites.elementwise import DropoutWithoutRatio, ModFloorOnFloats
from trtflow.stages.onnx.rewrites.geometry import AffineGridAsMatMul, CenterCropPadAsSlicePad, Col2ImAsConvTranspose
from trtflow.stages.onnx.rewrites.linalg import DetByCofactors
from trtflow.stages.onnx.rewrites.microsoft import (
    BiasGeluAsGelu,
    FastGeluAsGelu,
    FusedMatMulAsMatMul,
    QuickGeluAsSigmoid,
    SkipLayerNormalizationAsLayerNorm,
)
from trtflow.stages.onnx.rewrites.pooling import LpPoolAsConv

FLOAT, FLOAT16, DOUBLE = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE
INT32, INT64, BOOL = TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL
NP = {FLOAT: np.float32, FLOAT16: np.float16, DOUBLE: np.float64}
MS = "com.microsoft"


def _model(nodes: list, inputs: list, outputs: list, opset: int, inits=(), microsoft: bool = False) -> onnx.ModelProto:
    """`inputs`, `outputs`: (name, elem type, shape); an output's shape None is what shape inference gives."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(MS, 1)] if microsoft else [])
    ir_version = min(10, helper.find_min_ir_version_for(opsets, ignore_unknown=True))  # what this ORT and parser read
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    inferred = onnx.shape_inference.infer_shapes(model).graph
    for out, new in zip(model.graph.output, inferred.output):
        if not out.type.tensor_type.HasField("shape"):
            out.CopyFrom(new)
    return model


def _node(op: str, inputs: list[str], outputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name="n", **attrs)


def _ms_node(op: str, inputs: list[str], outputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, name="n", domain=MS, **attrs)


def _random(shape, seed: int, dtype=np.float32, scale: float = 1.0) -> np.ndarray:
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(dtype)


def _const(value, name: str, dtype=None) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _refusal(model: onnx.ModelProto, rule) -> str:
    with pytest.raises(Refused) as refused:
        apply(model, "n", rule)
    return str(refused.value)


# --- Mod (fmod=0, floats) -----------------------------------------------------------------------------------------

def mod(elem=FLOAT, a_shape=(2, 5), b_shape=(5,), opset=28):
    dtype = NP[elem]
    model = _model([_node("Mod", ["a", "b"], ["y"], fmod=0)], [("a", elem, list(a_shape)), ("b", elem, list(b_shape))],
                   [("y", elem, None)], opset)
    a = _random(a_shape, 1, dtype, scale=10.0)
    a.reshape(-1)[0] = 0
    b = _random(b_shape, 2, dtype)
    b = np.where(np.abs(b) < 0.5, np.asarray(1.5, dtype), b).astype(dtype)  # quotients well inside float precision
    return model, {"a": a, "b": b}


MOD = {"float32-broadcast": ({}, 1e-5), "float16": ({"elem": FLOAT16, "b_shape": (2, 5)}, 2e-2),
       "double-scalar-divisor": ({"elem": DOUBLE, "b_shape": ()}, 1e-12)}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", MOD)
def test_float_mod_becomes_floor_division(case, tmp_path):
    kwargs, atol = MOD[case]
    model, feeds = mod(**kwargs)
    check_rewrite(model, "n", ModFloorOnFloats(), feeds, atol, tmp_path)


def test_mod_refuses_what_the_parser_takes_and_float_mod_before_opset_28():
    assert "opset 28" in _refusal(mod(opset=18)[0], ModFloorOnFloats())
    ints = _model([_node("Mod", ["a", "b"], ["y"], fmod=0)], [("a", INT32, [4]), ("b", INT32, [4])],
                  [("y", INT32, None)], 28)
    assert "integers" in _refusal(ints, ModFloorOnFloats())
    fmod = _model([_node("Mod", ["a", "b"], ["y"], fmod=1)], [("a", FLOAT, [4]), ("b", FLOAT, [4])],
                  [("y", FLOAT, None)], 28)
    assert "fmod=1" in _refusal(fmod, ModFloorOnFloats())


# --- Dropout (training mode, ratio 0) -----------------------------------------------------------------------------

def dropout(ratio=0.0, mode=True, mode_input=False, mask=True, opset=18):
    inputs, inits = [("x", FLOAT, [2, 4])], [_const(ratio, "r", np.float32)]
    if mode_input:
        inputs.append(("t", BOOL, []))
    else:
        inits.append(_const(mode, "t", np.bool_))
    outputs = [("y", FLOAT, [2, 4])] + ([("m", BOOL, [2, 4])] if mask else [])
    model = _model([_node("Dropout", ["x", "r", "t"], [o[0] for o in outputs])], inputs, outputs, opset, inits)
    feeds = {"x": _random([2, 4], 3)} | ({"t": np.array(True)} if mode_input else {})
    return model, feeds


DROPOUT = {"training-mask-read": {}, "training-mask-unread": {"mask": False}, "mode-an-input": {"mode_input": True}}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", DROPOUT)
def test_dropout_of_ratio_0_becomes_identity(case, tmp_path):
    model, feeds = dropout(**DROPOUT[case])
    check_rewrite(model, "n", DropoutWithoutRatio(), feeds, 0.0, tmp_path)


def test_dropout_refuses_a_random_one_and_what_the_parser_takes():
    assert "random" in _refusal(dropout(ratio=0.5)[0], DropoutWithoutRatio())
    assert "random" in _refusal(dropout(ratio=0.1, mode_input=True)[0], DropoutWithoutRatio())
    assert "parser takes it" in _refusal(dropout(mode=False)[0], DropoutWithoutRatio())
    ratio_input = _model([_node("Dropout", ["x", "r", "t"], ["y"])], [("x", FLOAT, [4]), ("r", FLOAT, [])],
                         [("y", FLOAT, [4])], 18, [_const(True, "t", np.bool_)])
    assert "not a constant" in _refusal(ratio_input, DropoutWithoutRatio())


# --- LpPool -------------------------------------------------------------------------------------------------------

def lppool(shape=(2, 3, 7, 6), channels=None, **attrs):
    in_shape = [shape[0], channels or shape[1], *shape[2:]]
    model = _model([_node("LpPool", ["x"], ["y"], **attrs)], [("x", FLOAT, in_shape)], [("y", FLOAT, None)], 18)
    return model, {"x": _random(shape, 4)}


LPPOOL = {
    "p3-stride2": {"p": 3, "kernel_shape": [2, 2], "strides": [2, 2]},
    "p3-uneven-pads": {"p": 3, "kernel_shape": [3, 3], "pads": [1, 0, 2, 1]},
    "p4-ceil-mode": {"p": 4, "kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    "p2-dilations": {"p": 2, "kernel_shape": [2, 2], "dilations": [2, 1]},
    "p3-same-upper": {"p": 3, "kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    "p3-same-lower": {"p": 3, "kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
    "p2-1d": {"p": 2, "kernel_shape": [3], "shape": (1, 3, 9)},
    "p1-1d-ceil-mode": {"p": 1, "kernel_shape": [3], "strides": [2], "ceil_mode": 1, "shape": (1, 3, 9)},
    "p3-3d": {"p": 3, "kernel_shape": [2, 2, 2], "shape": (1, 2, 4, 5, 4)},
}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", LPPOOL)
def test_lppool_becomes_a_depthwise_conv_of_ones(case, tmp_path):
    model, feeds = lppool(**LPPOOL[case])
    check_rewrite(model, "n", LpPoolAsConv(), feeds, 1e-5, tmp_path)


def test_lppool_refuses_what_the_parser_takes_and_unknown_channels():
    assert "parser takes it" in _refusal(lppool(p=2, kernel_shape=[2, 2])[0], LpPoolAsConv())
    assert "channel count" in _refusal(lppool(p=3, kernel_shape=[2, 2], channels="c")[0], LpPoolAsConv())
    dynamic = _model([_node("LpPool", ["x"], ["y"], p=3, kernel_shape=[3], strides=[2], ceil_mode=1)],
                     [("x", FLOAT, [1, 3, "w"])], [("y", FLOAT, None)], 18)
    assert "ceil_mode" in _refusal(dynamic, LpPoolAsConv())


# --- CenterCropPad ------------------------------------------------------------------------------------------------

def center_crop_pad(shape, target, axes=None, batch=None):
    attrs = {"axes": axes} if axes is not None else {}
    in_shape = [batch or shape[0], *shape[1:]]
    model = _model([_node("CenterCropPad", ["x", "s"], ["y"], **attrs)], [("x", FLOAT, in_shape)],
                   [("y", FLOAT, None)], 18, [_const(target, "s", np.int64)])
    return model, {"x": _random(shape, 5)}


CENTER_CROP_PAD = {
    "crop-and-pad-odd": {"shape": [1, 3, 6, 5], "target": [1, 3, 4, 8]},
    "axes-negative": {"shape": [2, 7, 5, 3], "target": [4, 8], "axes": [1, -2]},
    "same-size": {"shape": [5, 6], "target": [5, 6]},
    "crop-one-axis-dynamic-batch": {"shape": [2, 9, 4, 4], "target": [2, 1], "axes": [2, 3], "batch": "n"},
}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", CENTER_CROP_PAD)
def test_center_crop_pad_becomes_slice_and_pad(case, tmp_path):
    model, feeds = center_crop_pad(**CENTER_CROP_PAD[case])
    check_rewrite(model, "n", CenterCropPadAsSlicePad(), feeds, 0.0, tmp_path)


def test_center_crop_pad_refuses_a_computed_shape_and_unknown_sizes():
    computed = _model([_node("CenterCropPad", ["x", "s"], ["y"])], [("x", FLOAT, [4, 4]), ("s", INT64, [2])],
                      [("y", FLOAT, [2, 2])], 18)
    assert "constant target shape" in _refusal(computed, CenterCropPadAsSlicePad())
    dynamic = center_crop_pad([2, 9, 4, 4], [2], axes=[0], batch="n")[0]
    assert "static sizes" in _refusal(dynamic, CenterCropPadAsSlicePad())


# --- AffineGrid ---------------------------------------------------------------------------------------------------

def affine_grid(size, align_corners=0):
    dims = len(size) - 2
    theta = [size[0], dims, dims + 1]
    model = _model([_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align_corners)],
                   [("theta", FLOAT, theta)], [("grid", FLOAT, None)], 20, [_const(size, "size", np.int64)])
    return model, {"theta": _random(theta, 6)}


def affine_grid_sampled():
    """A constant theta (a spatial transformer's, frozen) whose grid a GridSample reads."""
    nodes = [_node("AffineGrid", ["theta", "size"], ["grid"]), helper.make_node("GridSample", ["x", "grid"], ["y"])]
    inits = [_const(_random([2, 2, 3], 7, scale=0.5), "theta"), _const([2, 3, 4, 5], "size", np.int64)]
    model = _model(nodes, [("x", FLOAT, [2, 3, 6, 7])], [("y", FLOAT, None)], 20, inits)
    return model, {"x": _random([2, 3, 6, 7], 8)}


AFFINE_GRID = {
    "2d": lambda: affine_grid([2, 3, 4, 5]),
    "2d-align-corners": lambda: affine_grid([2, 3, 4, 5], align_corners=1),
    "3d": lambda: affine_grid([1, 2, 3, 4, 5]),
    "height-1": lambda: affine_grid([2, 1, 1, 6]),
    "constant-theta-into-gridsample": affine_grid_sampled,
}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", AFFINE_GRID)
def test_affine_grid_becomes_a_matmul_or_a_constant(case, tmp_path):
    model, feeds = AFFINE_GRID[case]()
    check_rewrite(model, "n", AffineGridAsMatMul(), feeds, 1e-5, tmp_path)


def test_affine_grid_refuses_a_computed_size_and_an_undefined_coordinate():
    computed = _model([_node("AffineGrid", ["theta", "size"], ["grid"])],
                      [("theta", FLOAT, [1, 2, 3]), ("size", INT64, [4])], [("grid", FLOAT, [1, 4, 5, 2])], 20)
    assert "constant size" in _refusal(computed, AffineGridAsMatMul())
    assert "no defined coordinate" in _refusal(affine_grid([1, 1, 1, 5], align_corners=1)[0], AffineGridAsMatMul())


# --- Col2Im -------------------------------------------------------------------------------------------------------

def col2im(image, block, channels=2, **attrs):
    n = len(block)
    strides, dilations = attrs.get("strides", [1] * n), attrs.get("dilations", [1] * n)
    pads = attrs.get("pads", [0] * 2 * n)
    blocks = [(image[i] + pads[i] + pads[n + i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
              for i in range(n)]
    shape = [2, channels * int(np.prod(block)), int(np.prod(blocks))]
    model = _model([_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)], [("x", FLOAT, shape)],
                   [("y", FLOAT, None)], 18, [_const(image, "image", np.int64), _const(block, "block", np.int64)])
    return model, {"x": _random(shape, 9)}


COL2IM = {
    "2x2": {"image": [4, 4], "block": [2, 2]},
    "stride2-uneven-reach": {"image": [5, 6], "block": [2, 3], "channels": 3, "strides": [2, 2]},
    "dilated-strided-padded": {"image": [6, 5], "block": [3, 2], "dilations": [2, 1], "pads": [1, 0, 2, 1],
                               "strides": [1, 2]},
    "3d": {"image": [3, 4, 5], "block": [2, 2, 2]},
    "1d-stride2": {"image": [9], "block": [3], "strides": [2]},
}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", COL2IM)
def test_col2im_becomes_a_one_hot_conv_transpose(case, tmp_path):
    model, feeds = col2im(**COL2IM[case])
    check_rewrite(model, "n", Col2ImAsConvTranspose(), feeds, 1e-5, tmp_path)


def test_col2im_refuses_a_computed_image_shape():
    computed = _model([_node("Col2Im", ["x", "image", "block"], ["y"])],
                      [("x", FLOAT, [1, 8, 9]), ("image", INT64, [2])], [("y", FLOAT, [1, 2, 4, 4])], 18,
                      [_const([2, 2], "block", np.int64)])
    assert "constant image_shape" in _refusal(computed, Col2ImAsConvTranspose())


# --- Det ----------------------------------------------------------------------------------------------------------

def det(shape, declared=None):
    model = _model([_node("Det", ["x"], ["y"])], [("x", FLOAT, declared or shape)], [("y", FLOAT, None)], 18)
    return model, {"x": _random(shape, 10)}


DET = {"2x2-batched": {"shape": [3, 2, 2]}, "3x3-two-batch-dims": {"shape": [2, 3, 3, 3]},
       "3x3-single": {"shape": [3, 3]}, "1x1": {"shape": [4, 1, 1]},
       "3x3-dynamic-batch": {"shape": [5, 3, 3], "declared": ["b", 3, 3]}}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", DET)
def test_det_becomes_cofactor_products(case, tmp_path):
    model, feeds = det(**DET[case])
    check_rewrite(model, "n", DetByCofactors(), feeds, 1e-5, tmp_path)


def test_det_refuses_large_and_unknown_matrices():
    assert "5! terms" in _refusal(det([2, 5, 5])[0], DetByCofactors())
    assert "static" in _refusal(det([2, 3, 3], declared=[2, "m", "m"])[0], DetByCofactors())


# --- MelWeightMatrix ----------------------------------------------------------------------------------------------

def mel(bins=4, dft=8, rate=8000, low=100.0, high=3000.0):
    """The matrix applied to a magnitude spectrogram, as a log-mel front end does."""
    spectrum = dft // 2 + 1
    inits = [_const(bins, "bins", np.int64), _const(dft, "dft", np.int64), _const(rate, "rate", np.int64),
             _const(low, "low", np.float32), _const(high, "high", np.float32)]
    nodes = [_node("MelWeightMatrix", ["bins", "dft", "rate", "low", "high"], ["w"]),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = _model(nodes, [("x", FLOAT, [1, 6, spectrum])], [("y", FLOAT, None)], 17, inits)
    return model, {"x": np.abs(_random([1, 6, spectrum], 11))}


MEL = {"4-bins": {}, "40-bins-512": {"bins": 40, "dft": 512, "rate": 16000, "low": 20.0, "high": 7600.0}}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", MEL)
def test_mel_weight_matrix_becomes_a_constant(case, tmp_path):
    model, feeds = mel(**MEL[case])
    check_rewrite(model, "n", MelWeightMatrixAsConstant(), feeds, 1e-5, tmp_path)


@pytest.mark.parametrize("seed", range(3))
def test_the_mel_matrix_is_onnx_runtimes_exactly(seed):
    """The triangles' edges are integer bins computed in float32: one off moves whole rows."""
    rng = np.random.default_rng(seed)
    for _ in range(20):
        rate = int(rng.choice([8000, 16000, 22050, 44100]))
        dft, bins = int(rng.integers(16, 1024)), int(rng.integers(2, 64))
        low = np.float32(rng.uniform(0, 500))
        high = np.float32(rng.uniform(low + 500, rate / 2))
        inits = [_const(bins, "bins", np.int64), _const(dft, "dft", np.int64), _const(rate, "rate", np.int64),
                 _const(low, "low"), _const(high, "high")]
        model = _model([_node("MelWeightMatrix", ["bins", "dft", "rate", "low", "high"], ["w"])], [],
                       [("w", FLOAT, [dft // 2 + 1, bins])], 17, inits)
        mine = mel_weight_matrix(bins, dft, rate, np.asarray(low), np.asarray(high))
        if mine is None:  # an edge past the last bin: ONNX Runtime refuses it too
            with pytest.raises(Exception, match="out of range"):
                run_ort(model, {})
        else:
            assert np.array_equal(run_ort(model, {})[0], mine.astype(np.float32))


def test_mel_weight_matrix_refuses_computed_inputs_and_edges_past_the_spectrum():
    computed = _model([_node("MelWeightMatrix", ["bins", "dft", "rate", "low", "high"], ["w"])],
                      [("bins", INT64, [])], [("w", FLOAT, None)], 17,
                      [_const(8, "dft", np.int64), _const(8000, "rate", np.int64), _const(0.0, "low", np.float32),
                       _const(4000.0, "high", np.float32)])
    assert "constant" in _refusal(computed, MelWeightMatrixAsConstant())
    assert "past the last" in _refusal(mel(high=8000.0)[0], MelWeightMatrixAsConstant())


# --- SkipLayerNormalization ---------------------------------------------------------------------------------------

def skip_layer_norm(opset=17, outputs=("y",), beta=True, bias=True, elem=FLOAT):
    dtype = NP[elem]
    names = ["x", "skip", "gamma", "beta" if beta else "", "bias" if bias else ""]
    while not names[-1]:
        names.pop()
    inits = [_const(_random(8, 12, dtype), "gamma")] + [_const(_random(8, n, dtype), name)
                                                        for n, name in ((13, "beta"), (14, "bias")) if name in names]
    shapes = {"y": [2, 3, 8], "mean": [2, 3, 1], "inv_std": [2, 3, 1], "sum": [2, 3, 8]}
    model = _model([_ms_node("SkipLayerNormalization", names, list(outputs), epsilon=1e-5)],
                   [("x", elem, [2, 3, 8]), ("skip", elem, [1, 3, 8])],
                   [(o, elem, shapes[o]) for o in outputs if o], opset, inits, microsoft=True)
    return model, {"x": _random([2, 3, 8], 15, dtype), "skip": _random([1, 3, 8], 16, dtype)}


SKIP_LAYER_NORM = {
    "layernorm": ({}, 1e-5),
    "opset16-explicit": ({"opset": 16}, 1e-5),
    "every-output": ({"outputs": ("y", "mean", "inv_std", "sum")}, 1e-5),
    "sum-output-no-beta-no-bias": ({"opset": 18, "outputs": ("y", "", "", "sum"), "beta": False, "bias": False}, 1e-5),
    "mean-read-opset13": ({"opset": 13, "outputs": ("y", "mean"), "beta": False}, 1e-5),
    "float16": ({"opset": 18, "elem": FLOAT16}, 1e-2),  # measured 2e-3: one float16 step at 2..4
}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", SKIP_LAYER_NORM)
def test_skip_layer_norm_becomes_add_and_layer_norm(case, tmp_path):
    kwargs, atol = SKIP_LAYER_NORM[case]
    model, feeds = skip_layer_norm(**kwargs)
    check_rewrite(model, "n", SkipLayerNormalizationAsLayerNorm(), feeds, atol, tmp_path)


def test_skip_layer_norm_refuses_float16_without_layer_normalization():
    refusal = _refusal(skip_layer_norm(opset=16, elem=FLOAT16)[0], SkipLayerNormalizationAsLayerNorm())
    assert "float16" in refusal and "opset >= 17" in refusal


# --- FusedMatMul --------------------------------------------------------------------------------------------------

def _stored(logical: list[int], batch: bool, last_two: bool) -> list[int]:
    """The shape an operand is stored in for FusedMatMul's transposition of it to give `logical`."""
    n = len(logical)
    perm = list(range(n))
    if batch:
        perm = perm[1:n - 1] + [0, n - 1]
    if last_two and n >= 2:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    stored = [0] * n
    for axis, source in enumerate(perm):
        stored[source] = logical[axis]
    return stored


def fused_matmul(a=(3, 4, 2, 5), b=(3, 4, 5, 6), alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    sa, sb = _stored(list(a), transBatchA, transA), _stored(list(b), transBatchB, transB)
    y = list(np.matmul(np.zeros(a), np.zeros(b)).shape)
    node = _ms_node("FusedMatMul", ["a", "b"], ["y"], alpha=alpha, transA=transA, transB=transB,
                    transBatchA=transBatchA, transBatchB=transBatchB)
    model = _model([node], [("a", FLOAT, sa), ("b", FLOAT, sb)], [("y", FLOAT, y)], 17, microsoft=True)
    return model, {"a": _random(sa, 17), "b": _random(sb, 18)}


FUSED_MATMUL = {
    "plain": {},
    "transA-alpha": {"transA": 1, "alpha": 0.5},
    "transB-alpha": {"transB": 1, "alpha": 2.0},
    "every-transpose": {"transA": 1, "transB": 1, "transBatchA": 1, "transBatchB": 1, "alpha": 0.125},
    "transBatchA": {"transBatchA": 1},
    "vector-transposes-ignored": {"a": (5,), "b": (5, 6), "transA": 1, "alpha": 0.5},
}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", FUSED_MATMUL)
def test_fused_matmul_becomes_transpose_matmul_mul(case, tmp_path):
    model, feeds = fused_matmul(**FUSED_MATMUL[case])
    check_rewrite(model, "n", FusedMatMulAsMatMul(), feeds, 1e-5, tmp_path)


def test_fused_matmul_refuses_batch_transposes_onnx_runtime_refuses_and_unknown_ranks():
    node = _ms_node("FusedMatMul", ["a", "b"], ["y"], transBatchA=1)
    ranks = _model([node], [("a", FLOAT, [2, 3, 4]), ("b", FLOAT, [4, 5])], [("y", FLOAT, None)], 17, microsoft=True)
    assert "same rank" in _refusal(ranks, FusedMatMulAsMatMul())
    node = _ms_node("FusedMatMul", ["a", "b"], ["y"], transA=1)
    unknown = _model([node], [("a", FLOAT, None), ("b", FLOAT, [4, 5])], [("y", FLOAT, None)], 17, microsoft=True)
    assert "ranks" in _refusal(unknown, FusedMatMulAsMatMul())


# --- BiasGelu, FastGelu, QuickGelu --------------------------------------------------------------------------------

def gelu(op, opset=13, bias=True, **attrs):
    inputs = ["x", "b"] if bias else ["x"]
    inits = [_const(_random(8, 19), "b")] if bias else []
    model = _model([_ms_node(op, inputs, ["y"], **attrs)], [("x", FLOAT, [2, 3, 8])], [("y", FLOAT, [2, 3, 8])],
                   opset, inits, microsoft=True)
    return model, {"x": _random([2, 3, 8], 20, scale=3.0)}


GELU = {
    "biasgelu-erf-formula": (BiasGeluAsGelu, {"op": "BiasGelu"}),
    "biasgelu-opset20": (BiasGeluAsGelu, {"op": "BiasGelu", "opset": 20}),
    "fastgelu-tanh-formula": (FastGeluAsGelu, {"op": "FastGelu", "bias": False}),
    "fastgelu-bias-tanh-formula": (FastGeluAsGelu, {"op": "FastGelu"}),
    "fastgelu-bias-opset20": (FastGeluAsGelu, {"op": "FastGelu", "opset": 20}),
    "quickgelu": (QuickGeluAsSigmoid, {"op": "QuickGelu", "bias": False}),
    "quickgelu-alpha1": (QuickGeluAsSigmoid, {"op": "QuickGelu", "bias": False, "alpha": 1.0}),
}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", GELU)
def test_gelu_variants_become_standard_ops(case, tmp_path):
    rule, kwargs = GELU[case]
    model, feeds = gelu(**kwargs)
    check_rewrite(model, "n", rule(), feeds, 1e-5, tmp_path)


def test_gelu_variants_refuse_opsets_without_their_ops():
    assert "opset >= 9" in _refusal(gelu("BiasGelu", opset=8)[0], BiasGeluAsGelu())
    assert "opset >= 6" in _refusal(gelu("FastGelu", opset=5)[0], FastGeluAsGelu())
    assert "opset >= 6" in _refusal(gelu("QuickGelu", opset=5, bias=False)[0], QuickGeluAsSigmoid())


# --- ai.onnx.ml Scaler --------------------------------------------------------------------------------------------

def _scaler(dtype: int, offset: list[float], scale: list[float], features: int | str = 3) -> onnx.ModelProto:
    from trtflow.stages.onnx.rewrites.ml import ML

    x = helper.make_tensor_value_info("x", dtype, ["n", features])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", features])
    node = helper.make_node("Scaler", ["x"], ["y"], name="scale0", domain=ML, offset=offset, scale=scale)
    graph = helper.make_graph([node], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)])


@pytest.mark.parametrize("dtype,offset,scale", [
    (TensorProto.FLOAT, [5.36, 0.0, 12.77], [0.355, 1.0, 0.147]),
    (TensorProto.INT64, [1.5, -2.0, 3.25], [0.5, 2.0, 0.25]),
    (TensorProto.DOUBLE, [0.5], [3.0]),  # one value for every feature
])
def test_scaler_becomes_a_sub_and_a_mul(tmp_path, dtype, offset, scale):
    from trtflow.stages.onnx.rewrites.ml import ScalerAsSubMul

    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    x = (np.random.default_rng(3).uniform(-50, 300, (4, 3))).astype(np_type)
    # outputs up to ~1000: float32 rounds at 6e-5 there (ONNX Runtime computes a double input in double, then casts)
    check_rewrite(_scaler(dtype, offset, scale), "scale0", ScalerAsSubMul(), {"x": x}, 1.2e-4, tmp_path)


def test_scaler_refuses_offsets_that_are_not_one_per_feature():
    from trtflow.stages.onnx.rewrites.ml import ScalerAsSubMul

    with pytest.raises(Refused, match="offset and scale have 2 values for 3 features"):
        apply(_scaler(TensorProto.FLOAT, [1.0, 2.0], [1.0, 2.0]), "scale0", ScalerAsSubMul())
    with pytest.raises(Refused, match="needs the input's feature count"):
        apply(_scaler(TensorProto.FLOAT, [1.0, 2.0], [1.0, 2.0], features="f"), "scale0", ScalerAsSubMul())
