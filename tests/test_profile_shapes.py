"""Validate checks every dynamic profile at its min, opt and max shapes with data made from what the user declared
(issue #39): a planted FP16 overflow that grows with the sequence length fails only at the profile's max, and the
failure names that shape; repair works on it; real text lines go through the declared preprocessing at each width;
token ids are padded with the pad id and their mask with 0; the report and the model card have a row per shape.
Engines are real TensorRT-RTX builds (CPU), simulated on ONNX Runtime (no GPU here)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tests.assets import EXAMPLES, IMAGENET, PHOTOS
from tests.test_validate_stage import run_stage
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.build import BuildStage
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.pipelines.schema import SampleData
from trtflow.stages.build import stage as build
from trtflow.stages.image import preprocess
from trtflow.stages.onnx.graph import sanitize_dims
from trtflow.stages.ort.runner import session
from trtflow.stages.ort.samples import SampleSource
from trtflow.stages.precision import stage as precision
from trtflow.stages.validate import stage as validate
from trtflow.stages.validate.report import ValidateReport

SEQ = {"tensors": "*.npy"}
K = 1000.0  # the planted scale: pooled sums of 16 frames (at most 24) stay below 65504 / K, of 256 frames do not


def _model(path: Path, nodes, inputs, outputs, inits) -> Path:
    model = helper.make_model(helper.make_graph(nodes, "m", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def sequence_pooler(path: Path) -> Path:
    """A sequence encoder's pooling head: the frames summed over time, then a planted x K / K pair (the same math in
    FP32; in FP16 the product passes 65504 once the sequence is long enough), then a projection."""
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((8, 4)) * 0.3).astype(np.float32), "w")
    return _model(path, [helper.make_node("ReduceSum", ["x", "axes"], ["s"], name="pool", keepdims=1),
                         helper.make_node("Mul", ["s", "k"], ["u"], name="scale_up"),
                         helper.make_node("Div", ["u", "k"], ["v"], name="scale_down"),
                         helper.make_node("MatMul", ["v", "w"], ["y"], name="head")],
                  [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "T", 8])],
                  [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 1, 4])],
                  [w, numpy_helper.from_array(np.array([1], np.int64), "axes"),
                   numpy_helper.from_array(np.array(K, np.float32), "k")])


def engines(tmp: Path, name: str, models: list[Artifact], profile: dict) -> Artifact:
    built = run_stage(build, BuildStage, tmp / name, {"models": models}, profiles={"seq": profile},
                      engine_cache=False, timing_cache=False)
    return Artifact(built.outputs["engines"], "engines", name, "build")


@pytest.fixture(scope="module")
def pooler(tmp_path_factory) -> dict:
    """The pooler, 4 saved sequences of 16 frames (values 0.5..1.5), and its FP16 variant made by the precision
    stage from them (at 16 frames nothing overflows: it converts every node)."""
    tmp = tmp_path_factory.mktemp("pooler")
    reference = Artifact(sequence_pooler(tmp / "pooler.onnx"), "onnx", "ref", "prepare")
    rng = np.random.default_rng(1)
    files = []
    for i in range(4):
        files.append(tmp / f"seq{i}.npy")
        np.save(files[-1], rng.uniform(0.5, 1.5, (1, 16, 8)).astype(np.float32))
    tensors = {"tensors": [Artifact(p, "file", p.name) for p in files]}
    fp16 = run_stage(precision, PrecisionStage, tmp / "fp16", {"model": reference, **tensors}, data=SEQ, holdout=1,
                     fallback={"auto": False}, preflight="off")
    variant = Artifact(fp16.outputs["model"], "onnx", "f16", "fp16")
    return {"tmp": tmp, "models": [reference, variant], "tensors": tensors, "built": {}}


def pooler_engines(pooler: dict, max_frames: int) -> Artifact:
    """The pooler's FP32 and FP16 engines for 4..max_frames frames, batches of 1..2 (built once per module)."""
    if max_frames not in pooler["built"]:
        pooler["built"][max_frames] = engines(pooler["tmp"], f"b{max_frames}", pooler["models"],
                                              {"x": {"min": [1, 4, 8], "opt": [1, 16, 8], "max": [2, max_frames, 8]}})
    return pooler["built"][max_frames]


def validate_pooler(pooler: dict, out: Path, max_frames: int, **kw):
    models = pooler["models"]
    eng = pooler_engines(pooler, max_frames)
    return run_stage(validate, ValidateStage, out, {"reference": models[0], "models": models, "engines": eng,
                                                    **pooler["tensors"]}, data=SEQ, **kw)


@pytest.mark.slow
def test_an_fp16_overflow_at_the_longest_sequence_fails_validate_naming_that_shape(tmp_path, pooler,
                                                                                    tensorrt_backend):
    with pytest.raises(StageFailed) as failed:
        validate_pooler(pooler, tmp_path / "v256", 256, locate_first_bad_layer=False)
    line = str(failed.value)
    assert "fp16.seq.native" in line and "at seq.max (x [2, 256, 8]): output 'y'" in line and "NaN/Inf" in line, line
    report = json.loads(failed.value.result.outputs["report"].read_text())
    fp16 = next(c for c in report["candidates"] if c["name"] == "fp16.seq.native")
    rows = {r["name"]: r for r in fp16["per_shape"]}
    assert list(rows) == ["seq.min", "seq.opt", "seq.max"]
    assert rows["seq.min"]["passed"] and rows["seq.opt"]["passed"] and not rows["seq.max"]["passed"]
    assert [r["shapes"] for r in rows.values()] == [[{"x": [1, 4, 8]}], [{"x": [1, 16, 8]}], [{"x": [2, 256, 8]}]]
    assert [r["samples"] for r in rows.values()] == [4, 4, 2]  # at batch 2, two files a sample
    assert rows["seq.min"]["data"] == "saved tensors: x cropped along dim 1 from 16 to 4"
    assert rows["seq.opt"]["data"] == "saved tensors: as given"
    assert rows["seq.max"]["data"] == "saved tensors: batches of 2: 2 files each; x tiled along dim 1 from 16 to 256"
    assert rows["seq.max"]["outputs"]["y"]["nan"] > 0 and rows["seq.opt"]["outputs"]["y"]["nan"] == 0
    assert report["not_shipped"]["fp16.seq.native"].startswith("at seq.max (x [2, 256, 8]): ")
    fp32 = next(c for c in report["candidates"] if c["name"] == "prepare.seq.native")
    assert fp32["passed"] and all(r["passed"] for r in fp32["per_shape"])
    # the summary: a row per shape, the failing one's verdict in bold
    summary = failed.value.result.summary
    assert "| seq\\.max | x \\[2\\, 256\\, 8\\] | 2 |" in summary and "**fails\\: output \\'y\\'" in summary

    # the same engines with the max lowered to 32 frames: nothing overflows, it passes at every shape
    passed = validate_pooler(pooler, tmp_path / "v32", 32)
    report = json.loads(passed.outputs["report"].read_text())
    assert report["passed"] and report["shipped"] == ["fp16.seq.native", "prepare.seq.native"]
    assert [r["shapes"] for r in report["candidates"][0]["per_shape"]][-1] == [{"x": [2, 32, 8]}]


@pytest.mark.slow
def test_repair_works_on_the_shape_that_fails(tmp_path, pooler, tensorrt_backend):
    fixed = validate_pooler(pooler, tmp_path / "r", 256, repair=True, repair_max_giveback=0.5)
    report = json.loads(fixed.outputs["report"].read_text())
    assert sorted(report["repair"]["nodes"]) == ["scale_down", "scale_up"]
    assert report["repair"]["shapes"] == ["seq.max"]  # each round checked where it failed
    repaired = next(c for c in report["candidates"] if c["name"] == "fp16.seq.native.repaired")
    assert repaired["passed"] and [r["name"] for r in repaired["per_shape"]] == ["seq.min", "seq.opt", "seq.max"]
    assert "each checked at seq\\.max" in fixed.summary


REC_STEPS = [{"read": {"color": "bgr", "depth": 8}}, {"resize": {"height": 48, "max_width": 320, "round": "ceil"}},
             {"scale": 1 / 255}, {"normalize": {"mean": [0.5], "std": [0.5]}}, {"layout": "chw"},
             {"pad": {"size": [48, 320], "value": 0}}, {"batch": True}]  # the ppocr-rec example's, declared


@pytest.mark.slow
def test_text_lines_are_read_at_each_width_through_the_declared_preprocessing(tmp_path, tensorrt_backend):
    """PP-OCRv4's recognizer (a real model, real text lines), its width dynamic 64..512: each width's rows are the
    lines through the example's preprocessing with its resize and pad set for that width."""
    model = onnx.load(str(EXAMPLES / "ppocr-rec" / "models" / "ch_PP-OCRv4_rec_infer.onnx"))
    sanitize_dims(model)
    onnx.save(model, str(tmp_path / "rec.onnx"))
    reference = Artifact(tmp_path / "rec.onnx", "onnx", "ref", "prepare")
    pre = preprocess.save(preprocess.canonical(REC_STEPS), tmp_path / "preprocess.json")
    lines = sorted((EXAMPLES / "ppocr-rec" / "data").glob("*.png"))
    inputs = {"preprocess": Artifact(pre, "preprocess", "parity"), "images": [Artifact(p, "file", p.name) for p in lines]}
    built = run_stage(build, BuildStage, tmp_path / "build", {"models": [reference]}, engine_cache=False,
                      timing_cache=False, profiles={"line": {"x": {"min": [1, 3, 48, 64], "opt": [1, 3, 48, 320],
                                                                   "max": [2, 3, 48, 512]}}})
    data = {"images": "*.png", "samples": 4}
    result = run_stage(validate, ValidateStage, tmp_path / "v", {
        "reference": reference, "models": [reference], **inputs,
        "engines": Artifact(built.outputs["engines"], "engines", "e", "build")},
        data=data, metrics={"softmax_11.tmp_0": {"ctc": {"blank": 0}}})
    (cand,) = json.loads(result.outputs["report"].read_text())["candidates"]
    rows = {r["name"]: r for r in cand["per_shape"]}
    assert [r["shapes"] for r in rows.values()] == [[{"x": [1, 3, 48, 64]}], [{"x": [1, 3, 48, 320]}],
                                                    [{"x": [2, 3, 48, 512]}]]
    assert rows["line.opt"]["data"].endswith(": as given")
    assert ('the preprocessing set for 48x512 (resize {"height": 48, "max_width": 512, "round": "ceil", '
            '"interp": "linear"}, pad {"size": [48, 512], "value": 0}); batches of 2: 2 files each'
            ) in rows["line.max"]["data"]
    assert all("text_exact" in r["outputs"]["softmax_11.tmp_0"] for r in rows.values())

    # the samples are exactly the declared preprocessing at that width: lines squeezed into 64, or padded to 512
    # (as PaddleOCR pads a batch to its widest line)
    sess = session(tmp_path / "rec.onnx")
    source = SampleSource(SampleData(**data), Inputs(inputs), sess.get_inputs(), "validate")
    def at_width(w: int) -> preprocess.Preprocessor:
        return preprocess.Preprocessor(preprocess.canonical(
            [REC_STEPS[0], {"resize": {"height": 48, "max_width": w, "round": "ceil"}}, *REC_STEPS[2:5],
             {"pad": {"size": [48, w], "value": 0}}, REC_STEPS[6]]))

    assert np.array_equal(source.at({"x": [1, 3, 48, 64]}).sample(0)["x"], at_width(64)(lines[0]))
    wide = source.at({"x": [2, 3, 48, 512]}).sample(1)["x"]  # the second batch: the third and fourth lines
    assert np.array_equal(wide, np.concatenate([at_width(512)(lines[2]), at_width(512)(lines[3])]))


def test_sizing_steps_scale_together_and_a_size_no_step_fixes_is_padded(tmp_path):
    """ImageNet's resize-256-then-crop-224 at 112x160: the resize grows with the larger factor, so the crop fits.
    A resize to a height alone fixes no width: the preprocessed tensor is padded (or cut) to it, and the row says so."""
    pre = preprocess.Preprocessor(preprocess.canonical(IMAGENET))
    sized, changed = pre.resized(112, 160)
    assert changed == ['resize {"shorter": 183, "interp": "linear", "antialias": true}', "center_crop [112, 160]"]
    assert sized(PHOTOS[0]).shape == (1, 3, 112, 160)
    assert preprocess.Preprocessor(preprocess.canonical([{"resize": {"height": 48}}, {"layout": "chw"}])).resized(
        48, 100) is None

    steps = preprocess.save(preprocess.canonical([{"read": "rgb"}, {"resize": {"height": 32}}, {"scale": 1 / 255},
                                                  {"layout": "chw"}, {"batch": True}]), tmp_path / "p.json")
    inputs = Inputs({"preprocess": Artifact(steps, "preprocess", "parity"),
                     "images": [Artifact(p, "file", p.name) for p in PHOTOS[:2]]})
    x = helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 32, "W"])
    model = _model(tmp_path / "id.onnx", [helper.make_node("Identity", ["x"], ["y"])], [x],
                   [helper.make_tensor_value_info("y", TP.FLOAT, [1, 3, 32, "W"])], [])
    source = SampleSource(SampleData(images="*.png"), inputs, session(model).get_inputs(), "validate")
    at = source.at({"x": [1, 3, 32, 40]})  # the photos are 32 and 48 wide at a height of 32
    first, second = at.sample(0)["x"], at.sample(1)["x"]
    assert first.shape == second.shape == (1, 3, 32, 40) and (first[..., 32:] == 0).all()
    assert np.array_equal(second, source.sample(1)["x"][..., :40])
    assert at.made() == ("images via preprocess " + at.pre.digest[:12] + ": the preprocessing does not fix the image "
                         "size: each preprocessed image padded with 0 or cropped to 32x40; x cropped along dim 3 from "
                         "48 to 40; x padded with 0 along dim 3 from 32 to 40")


def token_model(path: Path) -> Path:
    """A sentence encoder's embedding and masked mean pooling: ids looked up in a table, the mask weighting them."""
    table = numpy_helper.from_array((np.random.default_rng(2).standard_normal((32, 4))).astype(np.float32), "table")
    return _model(path, [helper.make_node("Gather", ["table", "input_ids"], ["e"], name="embed"),
                         helper.make_node("Cast", ["attention_mask"], ["m"], name="mask", to=TP.FLOAT),
                         helper.make_node("Unsqueeze", ["m", "last"], ["m3"], name="mask3"),
                         helper.make_node("Mul", ["e", "m3"], ["em"], name="masked"),
                         helper.make_node("ReduceSum", ["em", "axes"], ["s"], name="sum", keepdims=0),
                         helper.make_node("ReduceSum", ["m3", "axes"], ["n"], name="count", keepdims=0),
                         helper.make_node("Div", ["s", "n"], ["y"], name="mean")],
                  [helper.make_tensor_value_info("input_ids", TP.INT64, ["N", "T"]),
                   helper.make_tensor_value_info("attention_mask", TP.INT64, ["N", "T"])],
                  [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 4])],
                  [table, numpy_helper.from_array(np.array([1], np.int64), "axes"),
                   numpy_helper.from_array(np.array([-1], np.int64), "last")])


@pytest.mark.slow
def test_token_ids_are_padded_with_the_pad_id_and_their_mask_with_zero(tmp_path, tensorrt_backend):
    model = token_model(tmp_path / "tokens.onnx")
    ids = np.array([[2, 17, 9, 23, 5, 3]], np.int64)
    np.savez(tmp_path / "s0.npz", input_ids=ids, attention_mask=np.ones_like(ids))
    inputs = {"tensors": [Artifact(tmp_path / "s0.npz", "file", "s0.npz")]}
    data = SampleData(tensors="*.npz", pad={"input_ids": 1})
    source = SampleSource(data, Inputs(inputs), session(model).get_inputs(), "validate")
    longest = source.at({"input_ids": [1, 10], "attention_mask": [1, 10]})
    feed = longest.sample(0)
    assert feed["input_ids"].tolist() == [[2, 17, 9, 23, 5, 3, 1, 1, 1, 1]]
    assert feed["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 0, 0, 0, 0]]
    assert longest.made() == ("saved tensors: attention_mask padded with 0 along dim 1 from 6 to 10; input_ids padded "
                              "with 1 along dim 1 from 6 to 10")
    shortest = source.at({"input_ids": [1, 4], "attention_mask": [1, 4]}).sample(0)
    assert shortest["input_ids"].tolist() == [[2, 17, 9, 23]] and shortest["attention_mask"].tolist() == [[1] * 4]
    with pytest.raises(StageError, match=r"validate: data.pad: the model has no input 'input_id'.*input_ids"):
        SampleSource(SampleData(tensors="*.npz", pad={"input_id": 1}), Inputs(inputs), session(model).get_inputs(),
                     "validate")

    # through the stage: the padded rows are what the engine's profile is checked at, each row saying so
    reference = Artifact(model, "onnx", "ref", "prepare")
    built = run_stage(build, BuildStage, tmp_path / "build", {"models": [reference]}, engine_cache=False,
                      timing_cache=False, profiles={"s": {n: {"min": [1, 4], "opt": [1, 6], "max": [1, 10]}
                                                          for n in ("input_ids", "attention_mask")}})
    result = run_stage(validate, ValidateStage, tmp_path / "v", {
        "reference": reference, "models": [reference], **inputs,
        "engines": Artifact(built.outputs["engines"], "engines", "e", "build")},
        data={"tensors": "*.npz", "pad": {"input_ids": 1}})
    (cand,) = json.loads(result.outputs["report"].read_text())["candidates"]
    assert [r["data"] for r in cand["per_shape"]] == [
        "saved tensors: attention_mask cropped along dim 1 from 6 to 4; input_ids cropped along dim 1 from 6 to 4",
        "saved tensors: as given", longest.made()]


@pytest.mark.slow
def test_the_model_card_shows_the_shipped_engine_at_each_shape(tmp_path, pooler, tensorrt_backend):
    from tests.test_release import release_of

    models = pooler["models"]
    eng = pooler_engines(pooler, 32)
    checked = run_stage(validate, ValidateStage, tmp_path / "v", {"reference": models[0], "models": models,
                                                                  "engines": eng, **pooler["tensors"]}, data=SEQ)
    released, out = release_of(tmp_path, eng.path, reports={"validation": checked.outputs["report"]},
                               select={"prefer": "size"})
    chosen = released["targets"][0]["chosen"]
    assert [r["name"] for r in chosen["shapes"]] == ["seq.min", "seq.opt", "seq.max"]
    card = (out / "card" / "model-card.md").read_text()
    assert "Validated at each shape of its profiles" in card
    assert "| seq\\.max | x \\[2\\, 32\\, 8\\] | 2 |" in card and "x tiled along dim 1 from 16 to 32" in card
    page = (out / "card" / "model-card.html").read_text()
    assert all(f'<tr data-shape="seq.{p}" data-passed="true">' in page for p in ("min", "opt", "max"))
    # a report written before per-shape rows existed still reads (the release of an older validate result)
    old = json.loads(checked.outputs["report"].read_text())
    for c in old["candidates"]:
        del c["per_shape"]
    assert ValidateReport.model_validate(old).candidates[0].per_shape == []


def test_the_accuracy_drop_release_weighs_is_the_worst_shapes():
    """Pooled over every shape, top-1 agreement lost 2%; at the max shape alone it lost 12%: max_accuracy_drop
    weighs 12%, and says where."""
    from trtflow.stages.compare.records import Accuracy, OutputAccuracy
    from trtflow.stages.release.selection import worst_drop
    from trtflow.stages.validate.report import ShapeResult

    def outputs(top1: float) -> dict[str, OutputAccuracy]:
        return {"logits": OutputAccuracy(cosine=0.999, max_abs=0.1, task_values={"top1": top1})}

    rows = [ShapeResult(name=f"seq.{p}", shapes=[{"x": [1, n]}], data="tensors", samples=4, outputs=outputs(t),
                        passed=True, violations=[]) for p, n, t in (("min", 8, 1.0), ("opt", 16, 0.99),
                                                                   ("max", 32, 0.88))]
    pooled = Accuracy("onnxruntime", 12, outputs(0.98))
    _, drop, where = worst_drop(pooled, rows, weigh=True)
    assert drop == pytest.approx(0.12) and where == "seq.max: logits/top1"
    assert worst_drop(pooled, rows[:1], weigh=True)[1] == pytest.approx(0.02)  # one shape: the pooled figure
