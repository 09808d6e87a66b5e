"""Task-level accuracy (issue #24): each metric on outputs whose right answer is known, on the trained PP-OCRv4
recognizer with real text lines where a model is needed; the gate's numerics (both-zero outputs, near-zero
probability maps); repair settings refused by `trtflow validate` before anything runs."""
from __future__ import annotations

import glob

import cv2
import numpy as np
import onnx
import pytest

from tests.assets import EXAMPLES
from trtflow.errors import SpecError, StageError
from trtflow.metrics.builtin.ctc import ctc_greedy
from trtflow.pipelines.graph import build_graph
from trtflow.pipelines.loader import load_pipeline
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.compare import gate
from trtflow.stages.compare.accuracy import Comparison
from trtflow.stages.onnx.graph import output_floors
from trtflow.stages.ort.runner import session

REC = EXAMPLES / "ppocr-rec" / "models" / "ch_PP-OCRv4_rec_infer.onnx"
LINES = sorted(glob.glob(str(EXAMPLES / "ppocr-rec" / "data" / "*.png")))


def rec_input(path: str) -> np.ndarray:
    """PaddleOCR's recognizer preprocessing: height 48, width in proportion (at most 320), padded right."""
    img = cv2.imread(path)
    h, w = img.shape[:2]
    nw = min(320, int(np.ceil(48 * w / h)))
    x = (cv2.resize(img, (nw, 48)).astype(np.float32) / 255.0 - 0.5) / 0.5
    out = np.zeros((48, 320, 3), np.float32)
    out[:, :nw] = x
    return out.transpose(2, 0, 1)[None]


@pytest.fixture(scope="module")
def rec_outputs():
    sess = session(REC)
    chars = [""] + next(p.value for p in onnx.load(str(REC)).metadata_props if p.key == "character").splitlines()
    outs = [sess.run(None, {"x": rec_input(p)})[0] for p in LINES[:8]]
    return outs, chars + [" "]


def judge(ref: list, got: list, precision: str, metrics: dict | None = None, tolerances: dict | None = None,
          floors: dict | None = None):
    params = ValidateStage(kind="validate", metrics=metrics or {}, tolerances=tolerances or {})
    cmp = Comparison(params.metrics, floors)
    for r, g in zip(ref, got):
        cmp.add({"y": r}, {"y": g})
    return gate.judge(cmp.result("test"), precision, params.tolerances, True, params.metrics)


def test_ctc_agreement_reads_the_decoded_text(rec_outputs):
    outs, chars = rec_outputs
    text = ["".join(chars[i] for i in ctc_greedy(o)[0]) for o in outs]
    assert text[0] == "Region-based" and text[3] == "Region-based segmentation"  # the real lines, read
    same = judge(outs, outs, "int8", {"y": {"ctc": {"blank": 0}}})
    assert same and same.outputs["y"].task_values == {"text_exact": 1.0, "cer": 0.0}
    # one line read as another: 1 of 8 texts wrong, its edits counted against all the reference's characters
    swapped = outs[:7] + [outs[0]]
    res = judge(outs, swapped, "int8", {"y": {"ctc": {"blank": 0}}})
    edits = __import__("trtflow.metrics.builtin.ctc", fromlist=["x"]).edit_distance(
        ctc_greedy(outs[7])[0], ctc_greedy(outs[0])[0])
    assert res.outputs["y"].task_values["text_exact"] == pytest.approx(7 / 8)
    assert res.outputs["y"].task_values["cer"] == pytest.approx(edits / sum(len(t) for t in text))
    assert not res and any("text_exact 0.875 < 0.9" in v for v in res.violations)
    # the task metric is the judge: the elementwise cosine (still reported) does not fail it by default
    assert "cosine" not in " ".join(res.violations)


def test_map_iou_counts_regions():
    ref = np.zeros((2, 1, 8, 8), np.float32)
    ref[0, 0, 2:6, 2:6] = 0.9  # 16 pixels
    got = ref.copy()
    got[0, 0, 2:6, 5] = 0.1  # 4 of them lost
    res = judge([ref], [got], "fp16", {"y": {"map_iou": {"threshold": 0.3}}})
    assert res.outputs["y"].task_values["iou"] == pytest.approx(12 / 16)
    assert res.outputs["y"].task_values["iou_min"] == pytest.approx(12 / 16)  # sample 1: both empty, they agree
    assert any("iou 0.75 < 0.95" in v for v in res.violations)


def test_embedding_cosine_is_per_sample_not_the_flattened_batch():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(16, 6, 32)).astype(np.float32)  # 16 sentences x 6 tokens x 32
    ref[0] *= 1e-3  # a short, small sentence: it hardly weighs in a cosine over the whole batch
    got = ref.copy()
    got[0] = -got[0]  # ... and its embedding points the other way
    res = judge([ref], [got], "int8", {"y": {"embedding": {"pool": "mean"}}})
    assert res.outputs["y"].cosine > 0.999  # the flattened batch sees nothing
    assert res.outputs["y"].task_values["embedding_cosine"] == pytest.approx(-1.0)
    assert not res and "embedding_cosine -1 < 0.98" in res.violations[0]


def test_top_k_on_any_class_axis():
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(2, 5, 4, 4)).astype(np.float32)  # segmentation scores, classes on axis 1
    got = ref.copy()
    got[0, :, 0, 0] = -got[0, :, 0, 0]  # one pixel's best class changes
    res = judge([ref], [got], "fp16", {"y": {"topk": {"k": 2, "axis": 1}}})
    assert res.outputs["y"].task_values["top1"] == pytest.approx(31 / 32)
    assert res.outputs["y"].task_values["top2"] == pytest.approx(31 / 32)  # its best class is now its worst
    # issue #69, item 3: a top-5 of 5 classes holds every class whatever the candidate gives: refused, not 1.0
    with pytest.raises(StageError, match=r"^validate: metrics.y.topk.k: 5, and the output has 5 classes along its "
                                         r"axis: .* agrees whatever the candidate gives; give k below 5$"):
        judge([ref], [got], "fp16", {"y": {"topk": {"k": 5, "axis": 1}}})


def test_a_user_metric_with_its_own_bound():
    ref = np.array([[1.0, -2.0, 3.0, -4.0]], np.float32)
    got = np.array([[1.0, 2.0, 3.0, -4.0]], np.float32)
    metrics = {"y": {"callable": "tests.stage_fns:sign_agreement"}}
    res = judge([ref], [got], "fp16", metrics, {"y": {"sign_agree": {"min": 0.9}}})
    assert res.outputs["y"].task_values["sign_agree"] == 0.75
    assert res.violations == ["output 'y': sign_agree 0.75 < 0.9"]
    assert judge([ref], [got], "fp16", metrics, {"y": {"sign_agree": {"min": 0.7}}})


def test_tolerances_name_only_metrics_that_exist():
    with pytest.raises(ValueError, match="no metric declared for 'y' gives 'cer'.*ctc"):
        ValidateStage(kind="validate", tolerances={"y": {"cer": 0.01}})
    with pytest.raises(ValueError, match="give {min: x}"):
        ValidateStage(kind="validate", metrics={"y": {"ctc": {}}}, tolerances={"y": {"cerr": 0.01}})


def test_both_zero_outputs_pass_and_near_zero_probability_maps_are_not_a_difference(tmp_path):
    zeros = np.zeros((2, 1000), np.float32)  # a zero-initialised head: reference and candidate both all-zero
    assert judge([zeros], [zeros.copy()], "fp32").outputs["y"].cosine == 1.0
    assert judge([zeros], [zeros.copy()], "fp32")
    # a DBNet-style map on an image with no text: ~1e-6 everywhere; FP16 changes it by 3e-7
    rng = np.random.default_rng(2)
    ref = (rng.random((1, 1, 32, 32)) * 2e-6).astype(np.float32)
    got = ref + (rng.random(ref.shape) * 3e-7).astype(np.float32)
    assert judge([ref], [got], "fp16").outputs["y"].cosine < 0.999
    assert not judge([ref], [got], "fp16"), "on an unknown scale the cosine stands"
    # the map comes out of a Sigmoid: its scale is 1, and 3e-7 is nothing on it
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 32, 32])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 32, 32])
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Sigmoid", ["x"], ["s"]), onnx.helper.make_node("Reshape", ["s", "shape"], ["y"])],
        "g", [x], [y], [onnx.numpy_helper.from_array(np.array([1, 1, 32, 32], np.int64), "shape")]))
    assert output_floors(model) == {"y": 1.0}
    assert judge([ref], [got], "fp16", floors=output_floors(model))


PIPE = """
version: 1
name: demo
model: models/cls.onnx
stages:
  prepare: {kind: prepare, target_opset: 17}
  fp16: {kind: precision}
  int8: {kind: calibrate, data: {random: true}}
  build: {kind: build, profiles: {bs1: {x: {min: [1, 3, 48, 192], opt: [1, 3, 48, 192], max: [1, 3, 48, 192]}}}}
  check: {kind: validate, repair: true}
"""


def test_repair_settings_that_cannot_work_are_refused_before_anything_runs(write_yaml):
    def error(text: str) -> str:
        with pytest.raises(SpecError) as info:
            build_graph(load_pipeline(write_yaml(text), environ={}))
        return str(info.value)

    msg = error(PIPE)
    assert "stages.check.repair_variant: repair: true with several FP16/INT8 variants (fp16, int8)" in msg
    assert "set repair_variant: to one of fp16, int8" in msg
    assert "'fp17' is not a precision or calibrate stage" in error(PIPE.replace("repair: true",
                                                                              "repair: true, repair_variant: fp17"))
    alone = PIPE.replace("  fp16: {kind: precision}\n", "").replace("  int8: {kind: calibrate, data: {random: true}}\n",
                                                                     "")
    assert "stages.check.repair: repair: true, but no precision or calibrate stage feeds" in error(alone)
    build_graph(load_pipeline(write_yaml(PIPE.replace("repair: true", "repair: true, repair_variant: int8")),
                              environ={}))


def test_sentence_embeddings_pool_over_real_tokens_only():
    """sentence-transformers' mean pooling: padding tokens do not count (their hidden states may differ freely)."""
    rng = np.random.default_rng(3)
    ref = rng.normal(size=(2, 8, 16)).astype(np.float32)
    got = ref.copy()
    got[:, 5:] = rng.normal(size=(2, 3, 16))  # the candidate differs only on the padding
    mask = np.zeros((2, 8), np.int64)
    mask[:, :5] = 1
    params = ValidateStage(kind="validate", metrics={"y": {"embedding": {"pool": "mean", "mask": "attention_mask"}}})
    cmp = Comparison(params.metrics)
    cmp.add({"y": ref}, {"y": got}, {"attention_mask": mask})
    assert cmp.result("test").outputs["y"].task_values["embedding_cosine"] == pytest.approx(1.0)
    plain = Comparison(ValidateStage(kind="validate", metrics={"y": {"embedding": {"pool": "mean"}}}).metrics)
    plain.add({"y": ref}, {"y": got}, {"attention_mask": mask})
    assert plain.result("test").outputs["y"].task_values["embedding_cosine"] < 0.99


def test_time_major_ctc_scores_decode_per_batch_row():
    """An LSTM exported without batch_first gives [T, N, C] (ddddocr's captcha model: [20, 1, 8210]): with
    batch_axis 1 each batch row decodes along time, as with [N, T, C]."""
    import numpy as np

    from trtflow.metrics.builtin.ctc import CTC, ctc_greedy

    batch_first = np.zeros((2, 6, 4), np.float32)
    for row, labels in enumerate(([1, 1, 0, 2, 2, 3], [3, 0, 3, 0, 0, 1])):
        batch_first[row, np.arange(6), labels] = 1.0
    time_major = batch_first.transpose(1, 0, 2)
    assert ctc_greedy(batch_first) == [[1, 2, 3], [3, 3, 1]]
    assert ctc_greedy(time_major, batch_axis=1) == [[1, 2, 3], [3, 3, 1]]
    assert ctc_greedy(time_major) != [[1, 2, 3], [3, 3, 1]]  # read batch-first, the rows are time steps
    got = time_major.copy()
    got[:, 1] = time_major[:, 0]  # the second row now reads as the first
    metric = CTC(batch_axis=1)
    metric.add(time_major, got)
    assert metric.result()["text_exact"] == 0.5
