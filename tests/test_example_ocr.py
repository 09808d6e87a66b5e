"""The text detector and recognizer examples as their README lines promise, each ending with its release served by
the real Triton (tests/test_example.py has the classifiers; apart, so two workers run them side by side)."""
from __future__ import annotations

import shutil
from pathlib import Path

from tests.assets import last_report, trtflow
from tests.test_example import ROOT, served_by_triton


def test_detector_example_released_and_served_by_triton(tmp_path: Path, triton):
    """The text detector example as its README line promises (INT8 judged by the regions it finds), ending with
    its release served by the real Triton: the only example whose profile is one fixed shape (max_batch_size 1)."""
    shutil.copytree(ROOT / "examples" / "ppocr-det", tmp_path / "ppocr-det", ignore=shutil.ignore_patterns(".trtflow"))
    shutil.copy(ROOT / "examples" / "trtflow.schema.json", tmp_path / "trtflow.schema.json")
    done = trtflow("run", "pipeline.yaml", cwd=tmp_path / "ppocr-det", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    release = last_report(tmp_path / "ppocr-det" / ".trtflow", "release")["targets"][0]
    assert release["chosen"]["name"] in last_report(tmp_path / "ppocr-det" / ".trtflow", "validate")["shipped"]
    assert release["contract"]["max_batch_size"] == 1
    served_by_triton(triton, tmp_path / "ppocr-det" / ".trtflow", tmp_path, "ppocr-det")


def test_recognizer_example_leaves_out_int8_that_misreads_and_serves_fp32(tmp_path: Path, triton):
    """The text recognizer example: its INT8 misreads lines even repaired, and is declared optional, so it is left
    out (said on the console, named in the card) and the FP32 engine is released and served by the real Triton."""
    shutil.copytree(ROOT / "examples" / "ppocr-rec", tmp_path / "ppocr-rec", ignore=shutil.ignore_patterns(".trtflow"))
    shutil.copy(ROOT / "examples" / "trtflow.schema.json", tmp_path / "trtflow.schema.json")
    done = trtflow("run", "pipeline.yaml", cwd=tmp_path / "ppocr-rec", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    store = tmp_path / "ppocr-rec" / ".trtflow"
    checked = last_report(store, "validate")
    assert list(checked["excluded"]) == ["int8"] and "left out optional variant int8" in done.stdout, done.stdout
    release = last_report(store, "release")["targets"][0]
    assert release["chosen"]["name"] in checked["shipped"]
    served_by_triton(triton, store, tmp_path, "ppocr-rec")
