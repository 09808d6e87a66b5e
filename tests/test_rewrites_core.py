"""Issue #68: the rules for DeformConv, ScatterElements/ScatterND with a reduction, Resize's refused forms and DFT.
Each case is a one-node model built here: the rule applies, ONNX Runtime gives the same outputs before and after,
and TensorRT-RTX parses and builds the rewritten model where it refused the original (tests/rewrite_checks.py). The
rules also refuse, in one line saying why, what they do not cover: dynamic shapes, too low an opset, other forms."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.rewrite_checks import check_rewrite
from trtflow.stages.onnx.rewrites.apply import Refused, apply
from trtflow.stages.onnx.rewrites.deformconv import DeformConvGridSample
from trtflow.stages.onnx.rewrites.dft import DftMatMul
from trtflow.stages.onnx.rewrites.resize import ResizeMatMul
from trtflow.stages.onnx.rewrites.scatter import ScatterElementsReduction, ScatterNDReduction

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _model(node: onnx.NodeProto, inputs: list, output_shape: list, opset: int, inits=()) -> onnx.ModelProto:
    """One node in a model; `inputs`: (name, elem type, shape) of its graph inputs."""
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(node.output[0], FLOAT, output_shape)],
                              initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


def _random(shape, seed: int) -> np.ndarray:
    """Seeded normal float32 values of `shape` (a named, dynamic dimension: 2)."""
    return np.random.default_rng(seed).standard_normal([d if isinstance(d, int) else 2 for d in shape]) \
        .astype(np.float32)


def _refusal(model: onnx.ModelProto, rule, opset: int | None = None) -> str | None:
    """The rule's `refuses` on the model's only node, the graph's opset replaced by `opset` where given."""
    graph = gs.import_onnx(onnx.shape_inference.infer_shapes(model))
    if opset is not None:
        graph.opset = opset
    return rule.refuses(graph.nodes[0], graph)


# --- DeformConv ---------------------------------------------------------------------------------------------------

def deformconv(n=1, c=4, hw=(7, 6), oc=4, kernel=(3, 3), group=1, offset_group=1, strides=(1, 1),
               dilations=(1, 1), pads=(0, 0, 0, 0), mask=False, bias=False, opset=19, batch_dim=None):
    (h, w), (kh, kw) = hw, kernel
    oh = (h + pads[0] + pads[2] - ((kh - 1) * dilations[0] + 1)) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - ((kw - 1) * dilations[1] + 1)) // strides[1] + 1
    taps = offset_group * kh * kw
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((oc, c // group, kh, kw)).astype(np.float32), "W")]
    names = ["X", "W", "offset", "B" if bias else "", "mask" if mask else ""]
    while not names[-1]:
        names.pop()
    n_in = batch_dim or n
    inputs = [("X", FLOAT, [n_in, c, h, w]), ("offset", FLOAT, [n_in, taps * 2, oh, ow])]
    feeds = {"X": rng.standard_normal((n, c, h, w)).astype(np.float32),
             "offset": 2 * rng.standard_normal((n, taps * 2, oh, ow)).astype(np.float32)}
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(oc).astype(np.float32), "B"))
    if mask:
        inputs.append(("mask", FLOAT, [n_in, taps, oh, ow]))
        feeds["mask"] = rng.random((n, taps, oh, ow)).astype(np.float32)
    node = helper.make_node("DeformConv", names, ["Y"], name="dc", group=group, offset_group=offset_group, strides=list(strides),
                            dilations=list(dilations), pads=list(pads), kernel_shape=list(kernel))
    return _model(node, inputs, [n_in, oc, oh, ow], opset, inits), feeds


DEFORMCONV = {
    "pads-bias": {"pads": (1, 1, 1, 1), "bias": True},
    "mask": {"mask": True},
    "groups2-offset-groups2-batch2": {"n": 2, "group": 2, "offset_group": 2, "mask": True, "bias": True},
    "stride2": {"strides": (2, 2), "pads": (1, 1, 1, 1), "hw": (9, 8)},
    "dilation2-uneven-pads": {"dilations": (2, 2), "pads": (2, 1, 0, 2)},
    "kernel2x3-offset-groups2-opset22": {"kernel": (2, 3), "offset_group": 2, "mask": True, "opset": 22},
}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", DEFORMCONV)
def test_deformconv_becomes_gridsample_and_conv(case, tmp_path):
    model, feeds = deformconv(**DEFORMCONV[case])
    check_rewrite(model, "dc", DeformConvGridSample(), feeds, 2e-5, tmp_path)  # measured <= 5.3e-6


def test_deformconv_refuses_dynamic_shapes_and_opsets_without_gridsample():
    model, _ = deformconv(batch_dim="N")
    with pytest.raises(Refused, match="needs static shapes for X, W and offset"):
        apply(model, "dc", DeformConvGridSample())
    assert "needs opset >= 16 for GridSample" in _refusal(deformconv()[0], DeformConvGridSample(), opset=15)


# --- ScatterElements / ScatterND with a reduction -----------------------------------------------------------------

def scatter_elements(reduction, axis=0, data=(4, 5), updates=None, constant=False, negative=False, opset=18,
                     dynamic=False):
    rng = np.random.default_rng(2)
    updates = updates or ((3, 5) if axis == 0 else (4, 3))
    index = rng.integers(0, data[axis], size=updates).astype(np.int64)
    along = np.moveaxis(index, axis, 0)  # a view: the updates 0 and 1 along the axis land together (duplicates)
    along[1] = along[0]
    if negative:
        index -= data[axis]
    feeds = {"data": rng.standard_normal(data).astype(np.float32),
             "updates": rng.standard_normal(updates).astype(np.float32)}
    inputs = [("data", FLOAT, ["D", *data[1:]] if dynamic else list(data)), ("updates", FLOAT, list(updates))]
    inits = [numpy_helper.from_array(index, "indices")] if constant else []
    if not constant:
        inputs.append(("indices", INT64, list(updates)))
        feeds["indices"] = index
    node = helper.make_node("ScatterElements", ["data", "indices", "updates"], ["Y"], name="s", axis=axis,
                            reduction=reduction)
    return _model(node, inputs, list(data), opset, inits), feeds


def scatter_nd(reduction, data=(4, 3, 2), indices=(5, 2), constant=False, opset=18):
    rng = np.random.default_rng(3)
    k = indices[-1]
    index = np.stack([rng.integers(0, data[i], size=indices[:-1]) for i in range(k)], -1).astype(np.int64)
    tuples = index.reshape(-1, k)
    tuples[1] = tuples[0]  # a duplicate
    tuples[2] -= np.array(data[:k])  # counted from the end
    updates = [*indices[:-1], *data[k:]]
    feeds = {"data": rng.standard_normal(data).astype(np.float32),
             "updates": rng.standard_normal(updates).astype(np.float32)}
    inputs = [("data", FLOAT, list(data)), ("updates", FLOAT, updates)]
    inits = [numpy_helper.from_array(index, "indices")] if constant else []
    if not constant:
        inputs.append(("indices", INT64, list(indices)))
        feeds["indices"] = index
    node = helper.make_node("ScatterND", ["data", "indices", "updates"], ["Y"], name="s", reduction=reduction)
    return _model(node, inputs, list(data), opset, inits), feeds


SCATTER = {
    "elements-add-axis0": (ScatterElementsReduction, scatter_elements, {"reduction": "add"}),
    "elements-mul-axis1-constant": (ScatterElementsReduction, scatter_elements,
                                    {"reduction": "mul", "axis": 1, "constant": True}),
    "elements-mul-opset16": (ScatterElementsReduction, scatter_elements, {"reduction": "mul", "opset": 16}),
    "elements-max-axis-last-negative": (ScatterElementsReduction, scatter_elements,
                                        {"reduction": "max", "axis": -1, "data": (2, 3, 4), "updates": (2, 2, 3),
                                         "negative": True}),
    "elements-min-axis1-partial": (ScatterElementsReduction, scatter_elements,
                                   {"reduction": "min", "axis": 1, "data": (4, 6, 3), "updates": (2, 3, 2)}),
    "nd-add": (ScatterNDReduction, scatter_nd, {"reduction": "add"}),
    "nd-mul-constant": (ScatterNDReduction, scatter_nd, {"reduction": "mul", "constant": True}),
    "nd-max-tuples3": (ScatterNDReduction, scatter_nd, {"reduction": "max", "indices": (2, 3, 3)}),
    "nd-min-tuples1": (ScatterNDReduction, scatter_nd, {"reduction": "min", "indices": (6, 1)}),
}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", SCATTER)
def test_scatter_reduction_becomes_one_hot_where_reduce(case, tmp_path):
    rule, build, kwargs = SCATTER[case]
    model, feeds = build(**kwargs)
    check_rewrite(model, "s", rule(), feeds, 1e-6, tmp_path)  # measured <= 2.4e-7


def test_scatter_refuses_no_reduction_dynamic_shapes_and_old_opsets():
    with pytest.raises(Refused, match="covers reduction add/mul/max/min only, not 'none'"):
        apply(scatter_elements("none")[0], "s", ScatterElementsReduction())
    with pytest.raises(Refused, match="needs static shapes for data, indices and updates"):
        apply(scatter_elements("add", dynamic=True)[0], "s", ScatterElementsReduction())
    assert "needs opset >= 16" in _refusal(scatter_nd("add")[0], ScatterNDReduction(), opset=15)


# --- Resize -------------------------------------------------------------------------------------------------------

def resize(out, shape=(1, 3, 8, 12), scales=None, sizes=None, roi=None, opset=19, scales_input=False, **attrs):
    names, inits, inputs = ["X", "", "", ""], [], [("X", FLOAT, list(shape))]
    for i, (name, value, dtype) in enumerate((("roi", roi, np.float32), ("scales", scales, np.float32),
                                              ("sizes", sizes, np.int64)), 1):
        if value is not None:
            names[i] = name
            inits.append(numpy_helper.from_array(np.array(value, dtype), name))
    if scales_input:  # scales computed at run time
        inits = [t for t in inits if t.name != "scales"]
        inputs.append(("scales", FLOAT, [len(scales)]))
    while not names[-1]:
        names.pop()
    node = helper.make_node("Resize", names, ["Y"], name="rz", **attrs)
    feeds = {"X": _random(shape, 4)}
    return _model(node, inputs, list(out), opset, inits), feeds


CROP = "tf_crop_and_resize"
RESIZE = {
    "antialias-linear-down": {"out": (1, 3, 4, 9), "mode": "linear", "antialias": 1, "scales": [1, 1, 0.5, 0.75]},
    "antialias-cubic-up-exclude-outside": {"out": (1, 3, 13, 17), "mode": "cubic", "antialias": 1,
                                           "exclude_outside": 1, "sizes": [1, 3, 13, 17]},
    "crop-linear-down": {"out": (1, 3, 5, 6), "mode": "linear", "coordinate_transformation_mode": CROP,
                         "roi": [0, 0, 0.1, 0.2, 1, 1, 0.9, 0.7], "sizes": [1, 3, 5, 6]},
    "crop-linear-opset13-empty-scales": {"out": (1, 3, 5, 6), "mode": "linear", "coordinate_transformation_mode": CROP,
                                         "roi": [0, 0, 0.1, 0.2, 1, 1, 0.9, 0.7], "scales": [], "sizes": [1, 3, 5, 6],
                                         "opset": 13},
    "crop-cubic-up-extrapolated-axes": {"out": (1, 3, 16, 18), "mode": "cubic", "coordinate_transformation_mode": CROP,
                                        "roi": [-0.2, 0.1, 1.3, 0.9], "sizes": [16, 18], "axes": [2, 3],
                                        "extrapolation_value": 0.5},
    "aspect-not-larger-linear": {"out": (1, 3, 4, 6), "mode": "linear", "keep_aspect_ratio_policy": "not_larger",
                                 "sizes": [6, 6], "axes": [2, 3]},
    "aspect-not-smaller-nearest-opset18": {"out": (1, 3, 14, 21), "mode": "nearest", "opset": 18,
                                           "keep_aspect_ratio_policy": "not_smaller", "sizes": [14, 20],
                                           "axes": [-2, -1]},
}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", RESIZE)
def test_resize_becomes_two_matmuls(case, tmp_path):
    model, feeds = resize(**RESIZE[case])
    check_rewrite(model, "rz", ResizeMatMul(), feeds, 3e-6, tmp_path)  # measured <= 7.2e-7


def test_resize_refuses_what_the_parser_takes_and_what_it_cannot_read_off():
    rule = ResizeMatMul()
    plain = resize((1, 3, 4, 6), mode="linear", scales=[1, 1, 0.5, 0.5])[0]
    assert "the parser takes this Resize as is" in _refusal(plain, rule)
    aa = {"out": (1, 3, 4, 6), "mode": "linear", "antialias": 1, "scales": [1, 1, 0.5, 0.5]}
    with pytest.raises(Refused, match="needs a static input shape"):
        apply(resize(shape=("N", 3, 8, 12), **aa)[0], "rz", rule)
    with pytest.raises(Refused, match="needs constant roi, scales and sizes"):
        apply(resize(scales_input=True, **aa)[0], "rz", rule)
    with pytest.raises(Refused, match="covers 4-D NCHW input only"):
        apply(resize(shape=(3, 8, 12), **{**aa, "out": (3, 4, 6), "scales": [1, 0.5, 0.5]})[0], "rz", rule)
    assert "needs opset >= 11" in _refusal(resize(**aa)[0], rule, opset=10)
    # the aspect ratio's scale (0.5 from H) applies to C as well: 3 channels become 2
    channels = resize((1, 2, 4, 6), mode="nearest", keep_aspect_ratio_policy="not_larger", sizes=[1, 3, 4, 20])[0]
    assert "resizes N or C" in _refusal(channels, rule)


# --- DFT ----------------------------------------------------------------------------------------------------------

def dft(shape, out, opset=20, axis=None, length=None, **attrs):
    names, inits = ["X"], []
    if length is not None:
        inits.append(numpy_helper.from_array(np.array(length, np.int64), "length"))
        names.append("length")
    if axis is not None and opset >= 20:
        inits.append(numpy_helper.from_array(np.array(axis, np.int64), "axis"))
        names += ([""] if length is None else []) + ["axis"]
    elif axis is not None:
        attrs["axis"] = axis
    node = helper.make_node("DFT", names, ["Y"], name="f", **attrs)
    feeds = {"X": _random(shape, 5)}
    return _model(node, [("X", FLOAT, list(shape))], list(out), opset, inits), feeds


DFT = {
    "opset17-real": {"shape": [2, 16, 1], "out": [2, 16, 2], "opset": 17},
    "opset17-complex-inverse": {"shape": [2, 12, 2], "out": [2, 12, 2], "opset": 17, "inverse": 1},
    "opset17-onesided-axis2": {"shape": [2, 3, 10, 1], "out": [2, 3, 6, 2], "opset": 17, "axis": 2, "onesided": 1},
    "opset17-length-padded": {"shape": [2, 8, 1], "out": [2, 12, 2], "opset": 17, "length": 12},
    "opset20-default-axis": {"shape": [2, 3, 16, 1], "out": [2, 3, 16, 2]},
    "opset20-axis-input-complex": {"shape": [2, 6, 5, 2], "out": [2, 6, 5, 2], "axis": -3},
    "opset20-inverse-onesided": {"shape": [2, 9, 2], "out": [2, 16, 1], "inverse": 1, "onesided": 1},
    "opset20-onesided-length-cut": {"shape": [2, 16, 1], "out": [2, 6, 2], "onesided": 1, "length": 10},
}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", DFT)
def test_dft_becomes_a_matmul(case, tmp_path):
    model, feeds = dft(**DFT[case])
    check_rewrite(model, "f", DftMatMul(), feeds, 3e-5, tmp_path)  # measured <= 9.3e-6 (ONNX Runtime's own error)


def test_dft_refuses_dynamic_shapes_old_opsets_and_complex_rfft():
    rule = DftMatMul()
    with pytest.raises(Refused, match="needs a static length along the axis"):  # the matrix's rows
        apply(dft(["N", "L", 1], ["N", "L", 2])[0], "f", rule)
    with pytest.raises(Refused, match="the last dimension must be 1 .real. or 2 .complex."):
        apply(dft(["N", 16, "C"], ["N", 16, 2])[0], "f", rule)
    unranked = dft([2, 16, 1], [2, 16, 2])[0]
    for value in (*unranked.graph.input, *unranked.graph.output):
        value.type.tensor_type.ClearField("shape")
    with pytest.raises(Refused, match="needs an input of known rank"):
        apply(unranked, "f", rule)
    assert "needs opset >= 17" in _refusal(dft([2, 16, 1], [2, 16, 2], opset=17)[0], rule, opset=16)
    with pytest.raises(Refused, match="a one-sided forward DFT takes real input"):
        apply(dft([2, 16, 2], [2, 9, 2], onesided=1)[0], "f", rule)


# the leading dimensions symbolic (a batch, a frame count) or unknown (None), fed at two sizes of them each; "atol":
# above the max abs diff measured at either (largest where the outputs are large: ONNX Runtime's own FFT error, 3.0e-5
# from float64 numpy on the 400-sample window, where the MatMul's is 2.4e-5)
DFT_DYNAMIC = {
    "batch-frames-onesided-length-opset17": {"shape": ["B", "T", 400, 1], "out": ["B", "T", 257, 2], "opset": 17,
                                             "axis": -2, "onesided": 1, "length": 512,  # wespeaker's STFT
                                             "atol": 1e-4},  # measured <= 3.4e-5, |Y| up to 55
    "batch-frames-axis1-complex-transposed": {"shape": ["B", 12, "T", 2], "out": ["B", 12, "T", 2], "axis": 1,
                                              "atol": 6e-5},  # measured <= 2.9e-5
    "batch-frames-inverse-onesided": {"shape": ["B", "T", 9, 2], "out": ["B", "T", 16, 1], "inverse": 1,
                                      "onesided": 1, "atol": 3e-6},  # measured <= 1.8e-7
    "unknown-batch-opset17": {"shape": [None, 16, 1], "out": [None, 16, 2], "opset": 17,
                              "atol": 3e-5},  # measured <= 2.4e-6
}
SIZES = ({"B": 2, "T": 7, None: 3}, {"B": 1, "T": 13, None: 5})  # the trial engine is built at the first


def _fed(shape, sizes: dict, seed: int) -> dict[str, np.ndarray]:
    dims = [d if isinstance(d, int) else sizes[d] for d in shape]
    return {"X": np.random.default_rng(seed).standard_normal(dims).astype(np.float32)}


@pytest.mark.tensorrt
@pytest.mark.parametrize("case", DFT_DYNAMIC)
def test_dft_with_dynamic_leading_dims_becomes_a_matmul(case, tmp_path):
    """Only the axis's length and the last dimension need be static: the Reshapes copy the others (a 0 entry)."""
    from tests.rewrite_checks import run_ort

    spec = dict(DFT_DYNAMIC[case])
    atol = spec.pop("atol")
    model = dft(**spec)[0]
    check_rewrite(model, "f", DftMatMul(), _fed(spec["shape"], SIZES[0], 5), atol, tmp_path)
    new, feeds = apply(model, "f", DftMatMul()), _fed(spec["shape"], SIZES[1], 6)
    (before,), (after,) = run_ort(model, feeds), run_ort(new, feeds)
    assert before.shape == after.shape
    assert float(np.max(np.abs(before.astype(np.float64) - after))) <= atol


# --- DFT in a shipped model: wespeaker's fbank front-end (onnx-asr) -----------------------------------------------

ONNX_ASR = "onnx-asr==0.12.0"  # MIT; fetched like rapidocr (tests/wheels.py), not a dependency of the project
WESPEAKER = "onnx_asr/preprocessors/data/wespeaker.onnx"  # waveforms [batch, N] -> 80 log-mel features [batch, T, 80]
RATE = 16000


def voiced(seconds: float, seed: int) -> np.ndarray:
    """A deterministic synthetic voiced signal, 16 kHz, scaled to [-1, 1]: 15 harmonics (1/k) of an f0 drifting
    slowly between 90 and 150 Hz, a syllable-rate loudness envelope, and a little white noise (no speech synthesizer:
    the tests cannot rely on espeak-ng)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    phase = 2 * np.pi * np.cumsum(120 + 30 * np.sin(2 * np.pi * 0.7 * t + seed)) / RATE
    x = sum(np.sin(k * phase) / k for k in range(1, 16)) * (0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t) ** 2)
    x = x + 0.01 * rng.standard_normal(t.size)
    return (x / np.max(np.abs(x))).astype(np.float32)


@pytest.fixture(scope="module")
def wespeaker() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """onnx-asr's wespeaker.onnx as shipped (every shape dynamic) and with its DFT `n21` rewritten: the DFT's input
    is [batch_size, T, 400, 1], T the frame count a Scan makes, only the window (400) and the 1 static."""
    from tests.assets import wheel_file

    model = onnx.load(wheel_file(ONNX_ASR, WESPEAKER))
    new = apply(model, "n21", DftMatMul())
    onnx.checker.check_model(new)
    assert "DFT" not in {n.op_type for n in new.graph.node}
    return model, new


@pytest.mark.parametrize("seconds, batch", [(1.0, 1), (2.5, 2)])
def test_dft_rewrite_keeps_wespeakers_features(wespeaker, seconds, batch):
    """The features of a voiced signal agree with the original's at two lengths and batches (the model is dynamic):
    max abs diff measured 6.1e-5 (1.0 s) and 9.9e-5 (2.5 s, batch 2), <= 7.1e-6 of the features' range (about
    -11..2.8), largest in the quietest mel bins where the log magnifies ONNX Runtime's own FFT error."""
    from tests.rewrite_checks import run_ort

    model, new = wespeaker
    waves = np.stack([voiced(seconds, seed) for seed in range(batch)])
    feeds = {"waveforms": waves, "waveforms_lens": np.full(batch, waves.shape[1], np.int64)}
    (features, lens), (features_new, lens_new) = run_ort(model, feeds), run_ort(new, feeds)
    assert features.shape == features_new.shape == (batch, 1 + (waves.shape[1] - 400) // 160, 80)
    assert np.array_equal(lens, lens_new)
    span = float(features.max() - features.min())
    diff = float(np.max(np.abs(features.astype(np.float64) - features_new)))
    assert span > 5 and diff <= 5e-5 * span, (diff, span)


@pytest.mark.slow
@pytest.mark.tensorrt
def test_dft_rewrite_makes_wespeaker_parse_and_build(wespeaker, tmp_path):
    """The parser refuses the shipped model's DFT and takes the rewritten one, Scan and all; a trial engine builds
    at one second of one waveform."""
    from trtflow.stages.trt.preflight import run_preflight

    model, new = wespeaker
    onnx.save(model, tmp_path / "original.onnx")
    before = run_preflight(tmp_path / "original.onnx")
    assert before.ran and not before.parsed and {f.op_type for f in before.failures} == {"DFT"}, before.failures
    onnx.save(new, tmp_path / "rewritten.onnx")
    assert run_preflight(tmp_path / "rewritten.onnx").parsed
    report = run_preflight(tmp_path / "rewritten.onnx", {"waveforms": [1, RATE], "waveforms_lens": [1]})
    assert report.parsed and report.trial_build is not None and report.trial_build.ok, report.trial_build
