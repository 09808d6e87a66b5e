"""trtflow's FP16 conversion on the graph shapes onnxconverter-common turns into invalid models: Cast after shape
arithmetic (YOLO-style box decoding), control flow reading outer-scope tensors, models that already hold FP16,
loop-carried values; and the FP32 island found when an op has no FP16 form at all."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from trtflow.artifact import Artifact
from trtflow.pipelines.schema import PrecisionStage
from trtflow.stages import precision
from trtflow.stages.onnx import fp16

RNG = np.random.default_rng(0)


def _w(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def _model(nodes, inputs, outputs, inits, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def yolo_like() -> onnx.ModelProto:
    """Box decoding scales by a width read from the feature map's shape: Shape -> Gather -> Cast(to=FLOAT)."""
    return _model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Shape", ["y"], ["s"], name="shape"),
         helper.make_node("Gather", ["s", "idx"], ["wd"], name="width", axis=0),
         helper.make_node("Cast", ["wd"], ["wf"], name="to_float", to=TP.FLOAT),
         helper.make_node("Mul", ["y", "wf"], ["z"], name="scale")],
        [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, "W"])],
        [helper.make_tensor_value_info("z", TP.FLOAT, [1, 4, 8, "W"])],
        [_w("w", 4, 3, 3, 3), numpy_helper.from_array(np.array(3, np.int64), "idx")])


def if_with_outer_refs() -> onnx.ModelProto:
    """Both branches read `h` (computed in FP16 outside) and a weight from the enclosing graph."""
    then = helper.make_graph([helper.make_node("MatMul", ["h", "w2"], ["t"], name="then_mm")], "then", [],
                             [helper.make_tensor_value_info("t", TP.FLOAT, [2, 4])])
    other = helper.make_graph([helper.make_node("Identity", ["h"], ["e"], name="else_id")], "else", [],
                              [helper.make_tensor_value_info("e", TP.FLOAT, [2, 4])])
    return _model(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
         helper.make_node("ReduceSum", ["x"], ["sx"], name="sum", keepdims=0),
         helper.make_node("Greater", ["sx", "zero"], ["pos"], name="is_pos"),
         helper.make_node("If", ["pos"], ["b"], name="branch", then_branch=then, else_branch=other),
         helper.make_node("Relu", ["b"], ["y"], name="relu")],
        [helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])],
        [_w("w1", 4, 4), _w("w2", 4, 4), numpy_helper.from_array(np.array(0, np.float32), "zero")])


def partly_fp16() -> onnx.ModelProto:
    """A front-end already in FP16 (its own Casts and an FP16 weight), FP32 layers after it."""
    w16 = numpy_helper.from_array((RNG.standard_normal((4, 4)) * 0.3).astype(np.float16), "w16")
    return _model(
        [helper.make_node("Cast", ["x"], ["x16"], name="to_half", to=TP.FLOAT16),
         helper.make_node("MatMul", ["x16", "w16"], ["f16"], name="front"),
         helper.make_node("Cast", ["f16"], ["f"], name="to_single", to=TP.FLOAT),
         helper.make_node("MatMul", ["f", "w"], ["g"], name="body"),
         helper.make_node("Tanh", ["g"], ["y"], name="act")],
        [helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])], [w16, _w("w", 4, 4)])


def loop_carried() -> onnx.ModelProto:
    """A recurrent cell: a Loop carries a float state that its body updates with a weight from outside."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "w"], ["m"], name="cell_mm"),
         helper.make_node("Add", ["m", "x"], ["a"], name="cell_add"),
         helper.make_node("Tanh", ["a"], ["s_out"], name="cell_act"),
         helper.make_node("Identity", ["c_in"], ["c_out"], name="keep_going")],
        "body", [helper.make_tensor_value_info("i", TP.INT64, []), helper.make_tensor_value_info("c_in", TP.BOOL, []),
                 helper.make_tensor_value_info("s_in", TP.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("c_out", TP.BOOL, []), helper.make_tensor_value_info("s_out", TP.FLOAT, [2, 4])])
    return _model(
        [helper.make_node("MatMul", ["x0", "w0"], ["x"], name="embed"),
         helper.make_node("Loop", ["steps", "", "s0"], ["s"], name="recur", body=body),
         helper.make_node("MatMul", ["s", "w0"], ["y"], name="head")],
        [helper.make_tensor_value_info("x0", TP.FLOAT, [2, 4]), helper.make_tensor_value_info("s0", TP.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])],
        [_w("w0", 4, 4), _w("w", 4, 4), numpy_helper.from_array(np.array(3, np.int64), "steps")], opset=17)


def celu_in_the_middle() -> onnx.ModelProto:
    """Celu has no FP16 form in ONNX: the converted graph is invalid until Celu stays FP32."""
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"), helper.make_node("Celu", ["a"], ["b"], name="celu"),
         helper.make_node("MatMul", ["b", "w"], ["y"], name="mm2")],
        [helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])], [_w("w", 4, 4)])


def _feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value or 5 for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = RNG.uniform(-1, 1, shape).astype(np.float32)
    return feeds


def _run(model: onnx.ModelProto, feed) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def _check(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model)
    _run(model, _feed(model))


CASES = {"cast after shape arithmetic": yolo_like, "If reading outer tensors": if_with_outer_refs,
         "already part FP16": partly_fp16, "Loop with a carried state": loop_carried}


@pytest.mark.parametrize("case", list(CASES))
def test_converted_graph_is_valid_and_close(case):
    model = CASES[case]()
    converted, plan, island = fp16.convert_valid(model, {}, set(), True, _check)
    assert island == {}, "no FP32 island needed: the conversion itself is valid"
    assert plan.half, "something runs in FP16"
    halves = [i for i in converted.graph.initializer if i.data_type == TP.FLOAT16]
    assert halves, "weights read by FP16 nodes are stored as FP16"
    feed = _feed(model)
    (ref,), (got,) = _run(model, feed), _run(converted, feed)
    assert got.dtype == np.float32  # keep_io_types
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2)


def test_control_flow_stays_fp32_with_casts_at_its_boundary():
    converted, plan, _ = fp16.convert_valid(if_with_outer_refs(), {}, set(), True, _check)
    assert "branch" in plan.fp32 and {"mm1", "relu"} <= plan.half
    branch = next(n for n in converted.graph.node if n.name == "branch")
    then = next(a.g for a in branch.attribute if a.name == "then_branch")
    assert then.node[0].input[0] == "h__to_fp32"  # the subgraph reads the FP32 copy of the FP16 tensor
    other = next(a.g for a in branch.attribute if a.name == "else_branch")
    assert other.node[0].input[0] == "h__to_fp32"


def test_fp32_island_for_an_op_without_fp16():
    converted, plan, island = fp16.convert_valid(celu_in_the_middle(), {}, set(), True, _check)
    assert list(island) == ["celu"] and "Celu" in island["celu"]
    assert plan.half == {"mm", "mm2"} and "celu" in plan.fp32


def test_the_precision_stage_on_control_flow(tmp_path):
    """End to end: the stage's magnitudes, conversion, validity check and emulated accuracy on an If model."""
    path = tmp_path / "if.onnx"
    onnx.save(if_with_outer_refs(), str(path))
    (tmp_path / "out").mkdir()
    params = PrecisionStage.model_validate({"kind": "precision", "data": {"random": True, "samples": 2}, "holdout": 2})
    result = precision.run(params, {"model": Artifact(path, "onnx", "m")}, tmp_path / "out")
    report = json.loads(result.outputs["report"].read_text())
    assert report["kept_fp32"]["branch"].startswith("control flow (If) runs in FP32 as a whole")
    assert report["accuracy"]["outputs"]["y"]["cosine"] > 0.999
    _check(onnx.load(str(result.outputs["model"])))


def test_bounded(monkeypatch):
    """An error that keeps naming new nodes ends after ISLAND_ROUNDS rounds, with the error."""
    model = celu_in_the_middle()
    calls = []

    def always_invalid(candidate):
        calls.append(1)
        half = [n.name for n in candidate.graph.node if n.name in {"mm", "mm2", "celu"}]
        raise RuntimeError(f"Type Error: something about node ({half[len(calls) % len(half)]})")

    monkeypatch.setattr(fp16, "ISLAND_ROUNDS", 3)
    with pytest.raises(fp16.InvalidFP16):
        fp16.convert_valid(model, {}, set(), True, always_invalid)
    assert len(calls) <= 3


def lstm_model() -> onnx.ModelProto:
    """x -> MatMul -> LSTM (hidden 8) -> MatMul: ONNX Runtime's CPU provider crashes loading its FP16 form."""
    hidden, feat = 8, 4
    w = numpy_helper.from_array((RNG.standard_normal((1, 4 * hidden, feat)) * 0.3).astype(np.float32), "W")
    r = numpy_helper.from_array((RNG.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32), "R")
    return _model(
        [helper.make_node("MatMul", ["x", "proj"], ["xp"], name="proj_mm"),
         helper.make_node("LSTM", ["xp", "W", "R"], ["seq"], name="lstm", hidden_size=hidden),
         helper.make_node("Squeeze", ["seq", "axis1"], ["s"], name="squeeze"),
         helper.make_node("MatMul", ["s", "head"], ["y"], name="head_mm")],
        [helper.make_tensor_value_info("x", TP.FLOAT, [5, 2, feat])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [5, 2, 3])],
        [_w("proj", feat, feat), w, r, _w("head", hidden, 3), numpy_helper.from_array(np.array([1], np.int64), "axis1")])


def test_an_error_naming_no_node_is_narrowed_to_its_op_type(tmp_path):
    """A crash names no node. Seen here: ONNX Runtime 1.32 with its graph optimizations on (not as trtflow runs
    it) dies with SIGSEGV loading an FP16 MatMul after an LSTM. A stand-in for such a crash ("the LSTM in FP16
    crashes") drives the search here; the real probe, in a child process, then checks the model it settles on."""
    from trtflow.stages.ort.probe import ProbeFailed, probe

    model = lstm_model()
    feed = _feed(model)

    def runs(candidate):
        lstm = next(n for n in candidate.graph.node if n.op_type == "LSTM")
        weights = {i.name: i.data_type for i in candidate.graph.initializer}
        if weights.get(lstm.input[1]) == TP.FLOAT16:
            raise ProbeFailed("ONNX Runtime crashed loading or running the model (exit code -11)")
        path = tmp_path / "candidate.onnx"
        onnx.save(candidate, str(path))
        probe(path, feed, tmp_path)

    converted, plan, island = fp16.convert_valid(model, {}, set(), True, runs)
    assert list(island) == ["lstm"] and "crashed" in island["lstm"]
    assert "lstm" not in plan.half and {"proj_mm", "head_mm"} <= plan.half
    (ref,), (got,) = _run(model, feed), _run(converted, feed)
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2)
