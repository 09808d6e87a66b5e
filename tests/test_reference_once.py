"""Issue #71 Build 2: the FP32 reference is computed once. PP-OCR's trained direction classifier on real text
lines, made FP16 and INT8 and validated; then the INT8 variant's calibration method changed: calibrate and validate
run again and read every FP32 output from the store (stages/ort/references.py), running the FP32 model not once,
and validate runs the changed variant only.
The passes are counted by ONNX Runtime's own runs (trtflow/phases.py records each, with its role), not by the
cache."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.assets import trtflow
from trtflow import phases
from trtflow.stages.ort.runner import CANDIDATE, FP32

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ppocr-cls"

PIPELINE = """
version: 1
name: reference-once
model: model.onnx
stages:
  prepare: {kind: prepare, target_opset: 17, input_shapes: {x: [1, 3, 48, 192]}}
  fp16: {kind: precision, to: fp16, data: {tensors: "lines/*.npy"}, holdout: 4}
  int8: {kind: calibrate, data: {tensors: "lines/*.npy"}, holdout: 4}
  validate:
    kind: validate
    data: {tensors: "lines/*.npy"}
    tolerances: {"*": {top1: 0.5}}
"""


def _lines(folder: Path) -> None:
    """Each text line as PaddleOCR's classifier reads it: 48 pixels high, at most 192 wide, normalized, padded."""
    folder.mkdir()
    for png in sorted((EXAMPLE / "data").glob("*.png")):
        image = cv2.imread(str(png))
        width = min(192, int(np.ceil(48 * image.shape[1] / image.shape[0])))
        x = cv2.resize(image, (width, 48)).astype(np.float32) / 255
        x = ((x - 0.5) / 0.5).transpose(2, 0, 1)
        padded = np.zeros((3, 48, 192), np.float32)
        padded[:, :, :width] = x
        np.save(folder / f"{png.stem}.npy", padded[None])


def _passes(ledger: Path, stage: str | None = None) -> dict[str, int]:
    """Passes per role, of every stage's process or of `stage`'s."""
    return dict(Counter(e["pass"] for e in phases.recorded(ledger)[1]
                        if stage in (None, e["process"].removeprefix("trtflow-"))))


def _keys(store: Path) -> dict[str, str]:
    return {stage: json.loads((store / stage / "last.json").read_text())["key"]
            for stage in ("prepare", "fp16", "int8", "validate")}


@pytest.mark.slow
def test_a_rerun_where_one_variant_changed_runs_the_fp32_model_not_once(tmp_path, monkeypatch):
    work = tmp_path / "repo"
    work.mkdir()
    shutil.copy(next((EXAMPLE / "models").glob("*.onnx")), work / "model.onnx")
    _lines(work / "lines")
    (work / "pipeline.yaml").write_text(PIPELINE)
    store = work / ".trtflow"

    monkeypatch.setenv("TRTFLOW_PHASES", str(tmp_path / "first.jsonl"))
    first = trtflow("run", "pipeline.yaml", cwd=work, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    before = _keys(store)
    computed = _passes(tmp_path / "first.jsonl")
    assert computed.get(FP32, 0) >= 8, computed  # each stage's reference, computed once: the count can fail

    monkeypatch.setenv("TRTFLOW_PHASES", str(tmp_path / "second.jsonl"))
    second = trtflow("run", "pipeline.yaml", "--set", "stages.int8.method=minmax", cwd=work, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    after = _keys(store)
    assert [s for s in before if before[s] != after[s]] == ["int8", "validate"]  # they ran again, the rest reused
    again = _passes(tmp_path / "second.jsonl")
    assert again.get(FP32, 0) == 0, again
    assert sum(again.values()) > 0, again  # the INT8 variant was calibrated and compared: passes were recorded
    # validate ran the changed INT8 variant only: the FP16 variant's outputs were kept from the first run
    both, one = _passes(tmp_path / "first.jsonl", "validate"), _passes(tmp_path / "second.jsonl", "validate")
    assert one[CANDIDATE] * 2 == both[CANDIDATE], (both, one)

    # the area turned off: the same change runs the FP32 model again (what the store saved is real)
    monkeypatch.setenv("TRTFLOW_PHASES", str(tmp_path / "third.jsonl"))
    monkeypatch.setenv("TRTFLOW_REFERENCE_CACHE", "0")
    third = trtflow("run", "pipeline.yaml", "--set", "stages.int8.method=entropy", cwd=work, timeout=900)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert _passes(tmp_path / "third.jsonl").get(FP32, 0) >= 4
