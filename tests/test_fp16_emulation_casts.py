"""The FP16 emulation rounds only where rounding changes something (stages/onnx/fp16_emulation.py): an FP16 node
that only moves, selects or compares FP16 values (Relu, MaxPool, Concat, Reshape, Clip at FP16 bounds...) gives FP16
values, so its outputs are not rounded again; the emulated outputs are bit for bit those of rounding every FP16
node's outputs, with fewer Casts to run (#71 item 5: bench/emulation.py measures the passes)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.assets import EXAMPLES, SQUEEZENET
from tests.graphs import seeded
from trtflow.stages.onnx import fp16_emulation
from trtflow.stages.ort.runner import session


def _named(path) -> onnx.ModelProto:
    model = onnx.load(str(path))
    for i, node in enumerate(model.graph.node):
        node.name = node.name or f"n{i}"
    return model


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray], path) -> list[np.ndarray]:
    onnx.save(model, str(path))
    return session(path).run(None, feed)


def _casts(model: onnx.ModelProto) -> int:
    return sum(n.op_type == "Cast" for n in model.graph.node)


def _both(model: onnx.ModelProto, monkeypatch) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The emulation as built, and with every FP16 node's outputs rounded (what it did before the rule)."""
    half = {n.name for n in model.graph.node}
    now = fp16_emulation.emulate(model, half, True)
    with monkeypatch.context() as m:
        m.setattr(fp16_emulation, "_stays_fp16", lambda *args: False)
        every = fp16_emulation.emulate(model, half, True)
    return now, every


def _compare(model, feed, tmp_path, monkeypatch) -> tuple[int, int]:
    now, every = _both(model, monkeypatch)
    got, want = _run(now, feed, tmp_path / "now.onnx"), _run(every, feed, tmp_path / "every.onnx")
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert np.array_equal(a, b, equal_nan=True)
    return _casts(now), _casts(every)


def test_squeezenet_emulated_with_a_third_of_the_casts_and_the_same_outputs(tmp_path, monkeypatch):
    model = _named(SQUEEZENET)
    feed = {model.graph.input[0].name: (seeded("squeezenet").standard_normal((2, 3, 224, 224)) * 3).astype(np.float32)}
    now, every = _compare(model, feed, tmp_path, monkeypatch)
    # its Relus, Concats, MaxPools and Identities hold their inputs' FP16 values: only the 26 Convs and the pool
    # round their outputs
    assert (now, every) == (56, 168)


@pytest.mark.slow
def test_pp_ocr_recognizer_and_detector_emulated_with_the_same_outputs(tmp_path, monkeypatch):
    """PP-OCRv4's recognizer (an SVTR transformer: Reshape, Transpose, Slice, Concat between its MatMuls) and
    detector (hard-swish's Clip at 0 and 6, unsimplified: hundreds of Constant nodes, rounded as weights are)."""
    for name, shape in (("rec", (1, 3, 48, 320)), ("det", (1, 3, 320, 320))):
        model = _named(EXAMPLES / f"ppocr-{name}" / "models" / f"ch_PP-OCRv4_{name}_infer.onnx")
        feed = {model.graph.input[0].name: (seeded(name).standard_normal(shape) * 3).astype(np.float32)}
        work = tmp_path / name
        work.mkdir()
        now, every = _compare(model, feed, work, monkeypatch)
        assert now < every * 0.55, (name, now, every)


def _clip_graph(opset: int, low: float) -> onnx.ModelProto:
    """x * w -> Clip(low, 6) -> y, every node FP16 in the emulation: Clip's bounds as attributes before opset 11."""
    w = numpy_helper.from_array(np.full((1, 8), 1.1, np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"], name="mul")]
    inits = [w]
    if opset < 11:
        nodes.append(helper.make_node("Clip", ["m"], ["y"], name="clip", min=low, max=6.0))
    else:
        inits += [numpy_helper.from_array(np.array(low, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", ["m", "lo", "hi"], ["y"], name="clip"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset,low,rounded", [(10, 0.0, False), (10, 0.1, True), (13, 0.1, False)])
def test_clip_is_rounded_unless_its_bounds_are_fp16(tmp_path, opset, low, rounded):
    """0.1 is not an FP16 value: as an attribute (opset 10) it is kept as written, so values clipped to it are
    rounded; as an input (opset 13) it is a weight, rounded to FP16 first, and then Clip gives FP16 values."""
    model = _clip_graph(opset, low)
    x = np.array([[-3.0, 0.05, 0.3, 1.7, 2.9, 5.3, 7.0, 100.0]], np.float32)
    emulated = fp16_emulation.emulate(model, {"mul", "clip"}, True)
    (y,) = _run(emulated, {"x": x}, tmp_path / "m.onnx")

    def r16(v):
        return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)

    bound = np.float32(low) if opset < 11 else r16(low)
    want = r16(np.clip(r16(r16(x) * r16(np.float32(1.1))), bound, np.float32(6.0)))  # x enters FP16 rounded
    assert np.array_equal(y, want)
    clip_rounded = any(n.op_type == "Cast" and n.input[0] == "y__fp32" for n in emulated.graph.node)
    assert clip_rounded == rounded


def test_a_value_from_an_fp32_node_shape_inference_cannot_type_is_rounded(tmp_path):
    """ONNX's shape inference does not know ONNX Runtime's contrib ops: the FP32 Gelu's output has no type, so it
    reaches the FP16 Relu without a rounded copy; the Relu must round its output, not pass the FP32 value on."""
    graph = helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["g"], name="gelu", domain="com.microsoft"),
         helper.make_node("Relu", ["g"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    x = {"x": seeded("gelu").standard_normal((1, 64)).astype(np.float32) * 3}
    (fp32,) = _run(model, x, tmp_path / "fp32.onnx")
    (y,) = _run(fp16_emulation.emulate(model, {"relu"}, True), x, tmp_path / "emulated.onnx")
    rounded = fp32.astype(np.float16).astype(np.float32)
    assert not np.array_equal(fp32, rounded)  # the case is real: Gelu's outputs are not FP16 values
    assert np.array_equal(y, rounded)
