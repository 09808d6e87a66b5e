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

from tests.graphs import seeded, celu_in_the_middle, if_with_outer_refs, loop_carried, lstm_model, partly_fp16, yolo_like
from trtflow.artifact import Artifact, Inputs
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.stages.onnx import fp16
from trtflow.stages.precision import stage as precision


def _feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value or 5 for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = seeded(vi.name).uniform(-1, 1, shape).astype(np.float32)
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
    result = precision.run(params, Inputs({"model": Artifact(path, "onnx", "m")}), tmp_path / "out")
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.tensorrt
def test_yolov8_head_builds_in_fp16_with_dynamic_height_and_width(tmp_path):
    """A YOLOv8-style head exported from torch (bench/zoo_models: its anchor grids are `torch.arange(end=w,
    dtype=float)` of the feature map's width, as ultralytics makes them). With the grid math in FP16, TensorRT-RTX's
    builder failed at a dynamic H/W profile (Myelin: float vs half in the Range's shape arithmetic) and the user's
    only way out was a block_nodes regex. The shape arithmetic now stays FP32, found by data flow; the precision
    stage's trial build proves the variant builds, with no block_nodes."""
    import torch

    from tests.assets import zoo
    from trtflow.stages.trt.preflight import run_preflight

    with zoo(tmp_path / "zoo") as models:
        net = models._yolo_head_module()
    path = tmp_path / "yolo.onnx"
    with torch.no_grad():
        torch.onnx.export(net, (torch.zeros(1, 3, 128, 128),), str(path), dynamo=False, opset_version=17,
                          input_names=["images"], output_names=["output0"],
                          dynamic_axes={"images": {0: "batch", 2: "height", 3: "width"}})
    model = onnx.load(str(path))
    (tmp_path / "out").mkdir()
    params = PrecisionStage.model_validate({"kind": "precision", "holdout": 1, "data": {
        "random": True, "samples": 2, "shapes": {"images": [1, 3, 128, 128]}, "ranges": {"images": [0, 1]}}})
    result = precision.run(params, Inputs({"model": Artifact(path, "onnx", "m")}), tmp_path / "out")
    report = json.loads(result.outputs["report"].read_text())
    trial = report["trial_build"]
    assert trial["ok"], trial
    assert trial["min_shapes"] == {"images": [1, 3, 64, 64]} and trial["shapes"] == {"images": [1, 3, 128, 128]}
    ranges = [n for n, why in report["kept_fp32"].items() if why == fp16.SHAPE_ARITHMETIC]
    assert any("Range" in n for n in ranges) and report["fp16_nodes"] > 100
    assert report["accuracy"]["outputs"]["output0"]["cosine"] > 0.999

    # the same head with its shape arithmetic put back into FP16 is what failed: one line, whole words
    from trtflow.stages.onnx.graph import name_nodes
    name_nodes(model)
    plan = fp16.plan(model, {}, set())
    plan.half |= set(ranges) - {n for n in ranges if "Range" in n}
    plan.half |= {n.name for n in model.graph.node if n.op_type == "Cast" and n.name in ranges}
    bad = tmp_path / "grid_in_fp16.onnx"
    onnx.save(fp16.convert(model, plan), str(bad))
    failed = run_preflight(bad, {"images": [1, 3, 128, 128]}, min_shapes={"images": [1, 3, 64, 64]}).trial_build
    assert not failed.ok and "\n" not in failed.error
    assert failed.error.startswith("Myelin: ") and "element type" in failed.error, failed.error
