"""The parity stage on a trained model: PP-OCR's text-direction classifier, its preprocessing declared as the
example does, PaddleOCR's own function as the training reference, on real text lines (half upside down); and
RapidOCR's own classifier (the wheel the model comes from, unzipped by tests/wheels.py) reading the same lines."""
from __future__ import annotations

import copy
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests import wheels
from tests.assets import EXAMPLES, PPOCR, need
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.parity import ParityStage
from trtflow.stages.image import paddleocr
from trtflow.stages.parity import stage as parity
from trtflow.stages.parity.report import ParityReport

SPEC = yaml.safe_load((EXAMPLES / "ppocr-cls" / "pipeline.yaml").read_text())["stages"]["parity"]
LINES = sorted((EXAMPLES / "ppocr-cls" / "data").glob("*.png"))
TURNED = {p.name: int(p.stem.rsplit("-", 1)[1] == "180") for p in LINES}  # class 1 = 180 degrees
RAPIDOCR = "rapidocr-onnxruntime==1.4.4"  # ships the example's model; its ch_ppocr_cls is PaddleOCR's code


def _run(deploy: list, out: Path) -> dict:
    out.mkdir(parents=True)
    params = ParityStage.model_validate({**SPEC, "deploy": deploy})
    inputs = {"images": [Artifact(p, "file", p.name) for p in LINES], "model": Artifact(PPOCR, "onnx", "m")}
    try:
        parity.run(params, Inputs(inputs), out)
    except StageFailed as exc:
        return {**json.loads((out / "report.json").read_text()), "error": str(exc)}
    return json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def declared(tmp_path_factory) -> dict:
    """The parity report of the example's declaration."""
    return _run(SPEC["deploy"], tmp_path_factory.mktemp("declared") / "ok")


@pytest.fixture(scope="module")
def rapidocr():
    """RapidOCR's package as its users import it, from its wheel unzipped into the test cache (its own imports are
    the project's dependencies and the test extras)."""
    try:
        root = wheels.unpacked(RAPIDOCR)
    except RuntimeError as exc:
        need(f"{RAPIDOCR} from the package index ({str(exc).splitlines()[0]})")
    sys.path.insert(0, str(root))
    try:
        import rapidocr_onnxruntime
    finally:
        sys.path.remove(str(root))
    return rapidocr_onnxruntime


def test_example_declaration_passes_and_the_classifier_reads_the_lines(declared):
    assert len(LINES) == 8 and sorted(TURNED.values()) == [0] * 4 + [1] * 4
    report = declared
    assert report["verdict"] == "pass" and "error" not in report
    assert all(r["max_abs"] < 1e-6 for r in report["images"])  # the same operations as PaddleOCR's code
    model = report["model"]
    assert model["top1"] == 1.0
    # a trained model: it tells upright from upside-down lines, on both sides (random weights could not)
    assert {p["image"]: p["training"] for p in model["predictions"]} == TURNED
    assert {p["image"]: p["deploy"] for p in model["predictions"]} == TURNED
    assert min(p["deploy_score"] for p in model["predictions"]) > 0.9


def test_planted_pair_changes_predictions_and_the_fix_restores_them(tmp_path):
    """Written from memory, torchvision-style: RGB, and the /255 forgotten before normalize: {0.5, 0.5}."""
    planted = copy.deepcopy(SPEC["deploy"])
    planted[0] = {"read": "rgb"}
    del planted[2]  # scale: 1/255
    report = _run(planted, tmp_path / "planted")
    msg = report["error"]
    assert "\n" not in msg
    assert "likely causes: pixels not scaled to 0..1, then R and B swapped — fix: add scale: 1/255 and read: bgr" in msg
    assert "model top-1 agreement 50%" in msg
    d = report["diagnosis"]
    assert [c["fix"] for c in d["chain"]] == ["add scale: 1/255", "read: bgr"]
    assert d["declared"]["mean_abs"] > d["chain"][0]["mean_abs"] > d["chain"][1]["mean_abs"]
    # under the mistake the model reads the lines differently; after the fix it agrees on every one
    declared = {p["image"]: p["deploy"] for p in report["model"]["predictions"]}
    assert declared != TURNED and report["model"]["top1"] < 1.0
    after = d["after_fix"]
    assert after["passing"] == len(LINES) and after["model"]["top1"] == 1.0
    assert {p["image"]: p["deploy"] for p in after["model"]["predictions"]} == TURNED
    # the summary shows it, image by image
    text = ParityReport.model_validate(report).summary(None)
    assert "| image | training: class (score) | deploy as declared | after the fix |" in text
    assert "**differs**" in text and "model top-1 agreement 100%" in text
    fixed = yaml.safe_load(d["yaml"])["deploy"]
    assert _run(fixed, tmp_path / "fixed")["verdict"] == "pass"


def test_gray_read_with_the_model_names_the_diagnosed_fix(tmp_path):
    planted = copy.deepcopy(SPEC["deploy"])
    planted[0] = {"read": "gray"}
    with pytest.raises(StageError, match=r"1 channel\(s\) but the model's input 'x' wants 3 \(read: bgr fixes it\)"):
        _run(planted, tmp_path / "gray")


@pytest.mark.slow
def test_mirror_matches_rapidocr(rapidocr):
    """trtflow's copy of PaddleOCR's resize_norm_img against RapidOCR's own, array for array."""
    import cv2

    class Config:  # what TextClassifier.resize_norm_img reads of its instance
        cls_image_shape = [3, 48, 192]

    for path in LINES:
        img = cv2.imread(str(path))
        theirs = rapidocr.ch_ppocr_cls.TextClassifier.resize_norm_img(Config(), img)
        np.testing.assert_array_equal(paddleocr.cls_resize_norm_img(str(path)), theirs)


def test_rapidocr_reads_each_line_as_the_declared_preprocessing_does(rapidocr, declared):
    """RapidOCR's text-direction classifier as its users run it (its config, its preprocessing and batching, its ONNX
    Runtime session on the model in its wheel: the example's model, byte for byte) against the parity stage's
    declared `deploy:` steps on the same model: every line the same class, with the same score."""
    import cv2

    root = Path(rapidocr.__file__).parent
    config = yaml.safe_load((root / "config.yaml").read_text())["Cls"]
    config["model_path"] = str(root / config["model_path"])
    digest = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in (config["model_path"], PPOCR)]
    assert digest[0] == digest[1], "the example's model is the one RapidOCR ships"
    _, results, _ = rapidocr.ch_ppocr_cls.TextClassifier(config)([cv2.imread(str(p)) for p in LINES])
    theirs = {p.name: (config["label_list"].index(label), float(score)) for p, (label, score) in zip(LINES, results)}
    ours = {p["image"]: (p["deploy"], p["deploy_score"]) for p in declared["model"]["predictions"]}
    assert {k: c for k, (c, _) in theirs.items()} == {k: c for k, (c, _) in ours.items()} == TURNED
    for name, (_, score) in theirs.items():
        assert ours[name][1] == pytest.approx(score, rel=1e-5, abs=1e-6), name
