"""Trained models taken to INT8 and judged on their task (issue #24): PP-OCRv4's recognizer on real text lines (the
text it reads) and its detector on real scenes (the regions its map marks; all-MiniLM-L6-v2's sentences are in
test_task_embedding.py). Each run either passes on the task metric with most nodes still INT8 and only passing
candidates measured, or exits 1 naming the output, the metric and why; never exit 0 with a failing engine measured."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.assets import EXAMPLES, last_report, trtflow
from trtflow.stages.image import paddleocr

# ------------------------------------------------------------------------- trained models, judged on their task

def rec_input(path: Path) -> np.ndarray:
    return paddleocr.rec_resize_norm_img(str(path))[None]


def det_input(path: Path) -> np.ndarray:
    return paddleocr.det_norm_img(str(path))[None]


TASKS = {
    # model, images, preprocessing, input shape, output, its task metric (the metric's names)
    "rec": (EXAMPLES / "ppocr-rec" / "models" / "ch_PP-OCRv4_rec_infer.onnx", EXAMPLES / "ppocr-rec" / "data",
            rec_input, [1, 3, 48, 320], "softmax_11.tmp_0", "{ctc: {blank: 0}}", ("text_exact", "cer")),
    "det": (EXAMPLES / "ppocr-det" / "models" / "ch_PP-OCRv4_det_infer.onnx", EXAMPLES / "ppocr-det" / "data",
            det_input, [1, 3, 256, 256], "sigmoid_0.tmp_0", "{map_iou: {threshold: 0.3}}", ("iou",)),
}
TASK_PIPELINE = """
version: 1
name: {name}
model: {model}
stages:
  prepare: {{kind: prepare, target_opset: 17, input_shapes: {{x: {shape}}}}}
  int8:
    kind: calibrate
    data: {{tensors: "samples/*.npy", samples: 10}}
    holdout: 2
  build:
    kind: build
    profiles: {{one: {{x: {{min: {shape}, opt: {shape}, max: {shape}}}}}}}
  validate:
    kind: validate
    data: {{tensors: "samples/*.npy", samples: 12}}
    metrics: {{{output}: {metric}}}
    locate_samples: 1
    repair: true
    repair_rounds: 2
  benchmark: {{kind: benchmark, tool: builtin, duration: 0.3s, warmup: 0.05s}}
  release: {{kind: release, select: {{prefer: size}}}}
"""


@pytest.mark.parametrize("task", sorted(TASKS))
def test_an_int8_pipeline_on_a_trained_model_never_ships_what_fails_its_task(task, tmp_path, tensorrt_backend):
    """PP-OCRv4's recognizer on real text lines (judged by the text it reads) and its detector on real scenes
    (judged by the regions its map marks), each taken to INT8 with repair: the run either passes on the task metric
    with most nodes still INT8, with only passing engines benchmarked, or exits 1 naming the output, the metric
    and why. It never exits 0 with a failing engine measured."""
    model, images, prep, shape, output, metric, names = TASKS[task]
    (tmp_path / "samples").mkdir()
    for p in sorted(images.iterdir()):
        if p.suffix in (".png", ".jpg"):
            np.save(tmp_path / "samples" / f"{p.stem}.npy", prep(p))
    (tmp_path / "pipeline.yaml").write_text(TASK_PIPELINE.format(name=task, model=model, shape=shape,
                                                                 output=output, metric=metric))
    proc = trtflow("run", "pipeline.yaml", cwd=tmp_path, timeout=900)
    report = never_ships_a_failure(proc, tmp_path / ".trtflow", output, names)
    original = next(c for c in report["candidates"] if c["variant"] == "int8" and not c["name"].endswith("repaired"))
    assert any(n in original["accuracy"]["outputs"][output] for n in names), "judged on the task metric"


def never_ships_a_failure(proc: subprocess.CompletedProcess, store: Path, output: str, names: tuple[str, ...],
                          release: bool = True) -> dict:
    """However the run ended, nothing that failed validate was measured or released: it passed (after a repair,
    with most nodes still INT8), benchmark measured and release shipped only candidates validate shipped; or it
    exited 1 on one line naming the output and the task metric, with nothing benchmarked or released. Returns
    validate's report."""
    report = last_report(store, "validate")
    if proc.returncode == 0:
        assert report["passed"]
        rep = report["repair"]
        assert rep is None or rep["note"] or len(rep["nodes"]) <= 0.25 * rep["of"], "most nodes still INT8"
        bench = last_report(store, "benchmark")
        assert {c["candidate"] for c in bench["cells"]} <= set(report["shipped"])
        assert set(bench["not_measured"]) == set(report["not_shipped"])
        if release:
            released = last_report(store, "release")["targets"][0]
            assert released["chosen"]["name"] in report["shipped"], "the release ships only what validate passed"
            assert all(o["refused"].startswith("failed validation") for o in released["options"]
                       if o["name"] in report["not_shipped"])
    else:
        assert proc.returncode == 1, proc.stdout + proc.stderr
        error = next(line for line in proc.stdout.splitlines() + proc.stderr.splitlines()
                     if line.startswith("error: validate"))
        assert any(f"output '{output}': {n} " in error for n in names), error
        assert "repair" in error or "not viable" in error, error
        assert not (store / "benchmark" / "last.json").exists(), "nothing failing was measured"
        assert not (store / "release" / "last.json").exists(), "nothing failing was released"
        assert not report["passed"] and report["not_shipped"]
    return report
