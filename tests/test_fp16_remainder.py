"""INT8 with its unquantized remainder in FP16 (calibrate `remainder: fp16`, stages/ort/fp16_remainder.py): the
graph TensorRT builds (FP16 Q/DQ scales at opset 19, no FP32 left), built by TensorRT-RTX on the CPU, simulated with
fake quantization and FP16 rounding at once, the FP16 safeguards, and validate's repair rebuilding it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.assets import IMAGENET, PHOTOS, SQUEEZENET
from tests.test_calibrate_stage import run_calibrate
from trtflow.artifact import Artifact
from trtflow.stages.image import preprocess
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.fp16_emulation import emulated, holds_fp16
from trtflow.stages.onnx.graph import default_opset
from trtflow.stages.ort import fp16_remainder, qdq
from trtflow.stages.ort.runner import session


@pytest.mark.slow
def test_squeezenet_on_real_photos(tmp_path, tensorrt_available, engine_size):
    pre = preprocess.save(preprocess.canonical(IMAGENET), tmp_path / "preprocess.json")
    inputs = {"preprocess": Artifact(pre, "preprocess", "p"), "images": [Artifact(p, "file", p.name) for p in PHOTOS]}
    kw = {"data": {"images": "*.png", "samples": 4}, "holdout": 1, "metrics": {"logits": {"topk": {"k": 5}}}}
    half = run_calibrate(SQUEEZENET, tmp_path / "fp16", inputs, remainder="fp16", **kw)
    full = run_calibrate(SQUEEZENET, tmp_path / "fp32", inputs, remainder="fp32", **kw)
    report = json.loads(half.outputs["report"].read_text())
    model = onnx.load(str(half.outputs["model"]))

    assert report["remainder"] == "fp16" and default_opset(model) == 19
    assert "FP16 at opset 19" in half.summary
    inits = {i.name: i for i in model.graph.initializer}
    scales = [inits[n.input[1]].data_type for n in model.graph.node if n.op_type == "DequantizeLinear"]
    assert scales and set(scales) == {TensorProto.FLOAT16}
    assert all(v.type.tensor_type.elem_type == TensorProto.FLOAT for v in [*model.graph.input, *model.graph.output])
    # as TensorRT builds it: no multiply-accumulate and (almost) nothing else left in FP32
    made = report["composition"]
    assert made["mac_share"]["fp32"] == 0 and made["mac_share"]["int8"] > 0.9
    assert made["other_share"]["fp32"] < 0.05 < made["other_share"]["fp16"]
    assert json.loads(full.outputs["report"].read_text())["composition"]["other_share"]["fp32"] > 0.9
    assert qdq.recipe(model).fp16_remainder == report["remainder_fp32"]

    # the pre-flight ran the variant with both roundings; the same weights as the FP32-remainder variant
    acc = report["accuracy"]
    assert "INT8 with an FP16 remainder" in acc["runtime"] and acc["outputs"]["logits"]["cosine"] > 0.99
    wide = emulated(model)
    # each Conv's FP16 output rounded (two Casts); its Relus, Concats and pools select FP16 values and are not
    convs = sum(n.op_type == "Conv" for n in model.graph.node)
    assert not holds_fp16(wide) and sum(n.op_type == "Cast" for n in wide.graph.node) >= 2 * convs > 0
    if tensorrt_available:
        assert engine_size(half.outputs["model"], {"input": [1, 3, 224, 224]}, tmp_path / "engine") > 100_000


def _overflowing(path: Path) -> None:
    """Conv -> Mul(x 1e5) -> Conv -> Div(/ 1e5) -> Conv (+ the first Conv's output, so that ONNX Runtime's
    pre-processing cannot fold the Mul into it): an activation FP16 cannot hold, between INT8 Convs (16 channels:
    quantized by the default recipe)."""
    rng = np.random.default_rng(0)

    def w(name: str) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["a", "big"], ["b"], name="scale_up"),
             helper.make_node("Conv", ["b", "w2"], ["c"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Div", ["c", "big"], ["d"], name="scale_down"),
             helper.make_node("Conv", ["d", "w3"], ["e"], name="conv3", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["e", "a"], ["y"], name="skip")]
    inits = [w("w1"), w("w2"), w("w3"), numpy_helper.from_array(np.array(1e5, np.float32), "big")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _tensors(folder: Path, n: int) -> list[Artifact]:
    folder.mkdir()
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        np.save(folder / f"t{i}.npy", rng.standard_normal((1, 16, 8, 8)).astype(np.float32))
        out.append(Artifact(folder / f"t{i}.npy", "file", f"t{i}.npy"))
    return out


@pytest.mark.slow
def test_an_activation_fp16_cannot_hold_stays_fp32_and_the_simulation_shows_why(tmp_path):
    src = tmp_path / "overflow.onnx"
    _overflowing(src)
    result = run_calibrate(src, tmp_path / "out", {"tensors": _tensors(tmp_path / "t", 6)}, remainder="fp16",
                           data={"tensors": "*.npy", "samples": 6}, holdout=2)
    report = json.loads(result.outputs["report"].read_text())
    kept = report["remainder_fp32"]
    assert {"scale_up", "conv2", "scale_down"} <= set(kept) and "conv1" not in kept and "conv3" not in kept
    assert "> data_max 512" in kept["conv2"]
    assert report["quantized_nodes"] == 3  # conv2 is still INT8, its output FP32
    acc = report["accuracy"]["outputs"]["y"]
    assert acc["nan"] == 0 and acc["inf"] == 0 and acc["cosine"] > 0.99

    # the same Q/DQ model with everything FP16: the simulation overflows where TensorRT's FP16 would
    model = model_io.load(result.outputs["model"])
    recipe = qdq.recipe(model)
    assert recipe.fp16_remainder == kept
    fp32_qdq = tmp_path / "fp32_qdq.onnx"
    qdq.write(src, fp32_qdq, tmp_path / "ranges.json", recipe.tensors, recipe.per_channel, recipe.quantize_ops,
              recipe.excluded)
    forced, _ = fp16_remainder.convert(model_io.load(fp32_qdq), {}, None, tmp_path)
    sims = {"forced": emulated(forced), "kept": emulated(model)}
    x = np.load(tmp_path / "t" / "t5.npy")
    ref = session(src).run(None, {"x": x})[0]
    error = {}
    for name, sim in sims.items():
        sim.graph.output.extend([helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
        model_io.save(sim, tmp_path / f"{name}.sim.onnx")
        y, b = session(tmp_path / f"{name}.sim.onnx").run(["y", "b"], {"x": x})
        error[name] = (float(np.linalg.norm(y - ref) / np.linalg.norm(ref)), bool(np.isfinite(b).all()))
    # FP16 turns the 1e5-scaled activation to inf (the quantizer after it hides the NaN that follows, not the harm)
    assert error["forced"][1] is False and error["forced"][0] > 0.3
    assert error["kept"][1] is True and error["kept"][0] < 0.05


@pytest.mark.slow
def test_validates_repair_rebuilds_the_fp16_remainder(tmp_path):
    from trtflow.stages.validate.repair import int8_variant

    src = tmp_path / "overflow.onnx"
    _overflowing(src)
    result = run_calibrate(src, tmp_path / "out", {"tensors": _tensors(tmp_path / "t", 4)}, remainder="fp16",
                           data={"tensors": "*.npy", "samples": 4}, holdout=1)
    variant = model_io.load(result.outputs["model"])
    (tmp_path / "work").mkdir()
    v = int8_variant(src, model_io.load(src), variant, tmp_path / "work")
    rebuilt, sim = v.rebuild(["conv3"])
    assert "conv3" not in qdq.quantized_nodes(rebuilt) and {"conv1", "conv2"} <= set(qdq.quantized_nodes(rebuilt))
    assert holds_fp16(rebuilt) and not holds_fp16(sim)
    # conv3, given back, runs in the remainder's FP16 (as calibrate's exclude_nodes makes it)
    inferred = onnx.shape_inference.infer_shapes(rebuilt).graph.value_info
    types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred}
    conv3 = next(n for n in rebuilt.graph.node if n.name == "conv3")
    assert types[conv3.input[0]] == TensorProto.FLOAT16
    assert qdq.recipe(rebuilt).fp16_remainder == qdq.recipe(variant).fp16_remainder


@pytest.mark.slow
def test_a_dead_weight_channel_keeps_a_scale_fp16_holds(tmp_path, tensorrt_available, engine_size):
    """Trained models have dead channels (PP-OCRv4 rec: weights of 1e-38): their per-channel scale rounds to 0 in
    FP16, which TensorRT refuses ("Scale coefficients must all be positive"). The channel is requantized at the
    smallest FP16 scale."""
    src = tmp_path / "dead.onnx"
    _overflowing(src)
    model = onnx.load(str(src))
    w1 = next(i for i in model.graph.initializer if i.name == "w1")
    w = numpy_helper.to_array(w1).copy()
    w[3] = 1e-37
    w1.CopyFrom(numpy_helper.from_array(w, "w1"))
    onnx.save(model, str(src))
    result = run_calibrate(src, tmp_path / "out", {"tensors": _tensors(tmp_path / "t", 4)}, remainder="fp16",
                           data={"tensors": "*.npy", "samples": 4}, holdout=1)
    q = onnx.load(str(result.outputs["model"]))
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("w1"))
    scale, weights = inits[dq.input[1]], inits[dq.input[0]]
    assert scale.dtype == np.float16 and (scale > 0).all()
    assert not weights[3].any() and weights[2].any()
    if tensorrt_available:
        assert engine_size(result.outputs["model"], {"x": [1, 16, 8, 8]}, tmp_path / "engine") > 0
