"""Prepare's checks run each model once per sample (issue #71): the opset conversion is checked against the model
before it, and the simplification against the converted model, whose outputs the first check already has. Counted
from ONNX Runtime's runs (trtflow/phases.py records each with its model's file name)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from trtflow import phases
from trtflow.artifact import Artifact, Inputs
from trtflow.pipelines.params.prepare import PrepareStage
from trtflow.stages.prepare import stage as prepare

MODEL = Path(__file__).resolve().parents[1] / "examples" / "ppocr-cls" / "models" / \
    "ch_ppocr_mobile_v2.0_cls_infer.onnx"


@pytest.mark.slow
def test_the_converted_model_runs_once_per_check_sample(tmp_path, monkeypatch):
    ledger = tmp_path / "passes.jsonl"
    monkeypatch.setenv("TRTFLOW_PHASES", str(ledger))
    params = PrepareStage.model_validate({"kind": "prepare", "target_opset": 17, "simplify": True,
                                          "input_shapes": {"x": [1, 3, 48, 192]}, "preflight": "off"})
    (tmp_path / "out").mkdir()
    result = prepare.run(params, Inputs({"model": Artifact(MODEL, "onnx", "m")}), tmp_path / "out")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    samples = report["conversion"]["check"]["samples"]
    assert samples >= 2 and report["simplification"]["check"]["samples"] == samples and result.outputs["model"]
    runs = Counter(entry["pass"] for entry in phases.recorded(ledger)[1])
    assert runs == {"original.onnx": samples, "converted.onnx": samples, "simplified.onnx": samples}, runs
