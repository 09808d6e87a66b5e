"""Trained models taken to INT8 and judged on their task (issue #24): the PP-OCRv4 models' inputs as PaddleOCR makes
them, and what every run of such a pipeline must hold however it ends (`never_ships_a_failure`): the OCR examples'
runs (tests/test_example_ocr.py: INT8 repaired, judged by the text read and the regions found) and all-MiniLM-L6-v2's
(tests/test_task_embedding.py) are checked with it."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from tests.assets import EXAMPLES, last_report
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
def never_ships_a_failure(proc: subprocess.CompletedProcess, store: Path, output: str, names: tuple[str, ...],
                          release: bool = True) -> dict:
    """However the run ended, nothing that failed validate was measured or released: it passed (a repaired engine
    it ships keeps most nodes INT8), and benchmark measured and release shipped only candidates validate shipped; or
    it exited 1 on one line naming the output and the task metric, with nothing benchmarked or released. Returns
    validate's report."""
    report = last_report(store, "validate")
    if proc.returncode == 0:
        assert report["passed"]
        rep = report["repair"]
        shipped_repaired = [n for n in report["shipped"] if n.endswith("repaired")]
        assert rep is None or rep["note"] or not shipped_repaired or len(rep["nodes"]) <= 0.25 * rep["of"], \
            "a repaired engine shipped keeps most nodes INT8"
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


def card_shows_composition(store: Path) -> dict[str, dict]:
    """Issue #54: the last release's card shows every engine's compute by precision (its MACs' shares, as TensorRT
    builds the variant), as its report holds it; returns engine -> composition."""
    import json

    from trtflow.stages.onnx.records import Shares

    made = {}
    key = json.loads((store / "release" / "last.json").read_text())["key"]
    card = (store / "release" / key / "card" / "model-card.md").read_text()
    header = next(ln for ln in card.splitlines() if ln.startswith("| engine |"))
    column = [c.strip() for c in header.strip("|").split("|")].index("MACs by precision")
    for target in last_report(store, "release")["targets"]:
        for option in target["options"]:
            c = option["composition"]
            assert c["macs"] > 0 and abs(sum(c["mac_share"].values()) - 1) < 1e-9, (option["name"], c)
            row = next(ln for ln in card.splitlines() if ln.startswith("| " + option["name"].replace(".", "\\.")))
            assert row.strip("|").split("|")[column].strip() == Shares(**c["mac_share"]).text(), row
            made[option["name"]] = c
    return made
