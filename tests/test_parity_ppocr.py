"""The parity stage on a trained model: PP-OCR's text-direction classifier, its preprocessing declared as the
example does, PaddleOCR's own function as the training reference, on real text lines (half upside down)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.assets import EXAMPLES, PPOCR
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.parity import ParityStage
from trtflow.stages import parity
from trtflow.stages.image import paddleocr
from trtflow.stages.reports.parity import ParityReport

SPEC = yaml.safe_load((EXAMPLES / "ppocr-cls" / "pipeline.yaml").read_text())["stages"]["parity"]
LINES = sorted((EXAMPLES / "ppocr-cls" / "data").glob("*.png"))
TURNED = {p.name: int(p.stem.rsplit("-", 1)[1] == "180") for p in LINES}  # class 1 = 180 degrees


def _run(deploy: list, out: Path) -> dict:
    out.mkdir(parents=True)
    params = ParityStage.model_validate({**SPEC, "deploy": deploy})
    inputs = {"images": [Artifact(p, "file", p.name) for p in LINES], "model": Artifact(PPOCR, "onnx", "m")}
    try:
        parity.run(params, Inputs(inputs), out)
    except StageFailed as exc:
        return {**json.loads((out / "report.json").read_text()), "error": str(exc)}
    return json.loads((out / "report.json").read_text())


def test_example_declaration_passes_and_the_classifier_reads_the_lines(tmp_path):
    assert len(LINES) == 8 and sorted(TURNED.values()) == [0] * 4 + [1] * 4
    report = _run(SPEC["deploy"], tmp_path / "ok")
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


def test_mirror_matches_rapidocr_where_installed():
    """trtflow's copy of PaddleOCR's resize_norm_img against RapidOCR's own (the wheel the model comes from)."""
    text_cls = pytest.importorskip("rapidocr_onnxruntime.ch_ppocr_cls.text_cls")
    import cv2

    class Config:  # what TextClassifier.resize_norm_img reads of its instance
        cls_image_shape = [3, 48, 192]

    for path in LINES:
        img = cv2.imread(str(path))
        theirs = text_cls.TextClassifier.resize_norm_img(Config(), img)
        np.testing.assert_array_equal(paddleocr.cls_resize_norm_img(str(path)), theirs)
