"""Fixtures shared by the tests; paths of the real models and photos are in tests/assets.py."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.assets import PPOCR
from trtflow.stages.trt.env import detect_tensorrt

TENSORRT = detect_tensorrt()


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "tensorrt: needs a TensorRT flavour (pip install tensorrt-rtx-cu13)")


def pytest_runtest_setup(item) -> None:
    if item.get_closest_marker("tensorrt") and TENSORRT is None:
        pytest.skip("needs a TensorRT flavour (pip install tensorrt-rtx-cu13)")


@pytest.fixture(autouse=True)
def _stage_calls(tmp_path: Path, monkeypatch) -> None:
    """Where tests.stage_fns records its calls (stages run in child processes). trtflow's machine state (the
    environment record, the background Prefect server's record) goes to the test's own directory, and `trtflow
    run` in child processes uses Prefect's temporary server: no test leaves a server running
    (tests/test_server.py covers the background server)."""
    monkeypatch.setenv("TRTFLOW_TEST_CALLS", str(tmp_path / "stage-calls.txt"))
    monkeypatch.setenv("TRTFLOW_STATE_DIR", str(tmp_path / "trtflow-state"))
    monkeypatch.setenv("TRTFLOW_PREFECT_SERVER", "ephemeral")


@pytest.fixture
def tensorrt_available() -> bool:
    return TENSORRT is not None


@pytest.fixture
def tensorrt_backend() -> dict[str, str]:
    """The installed flavour as `detect_tensorrt()` describes it (module, flavour, version)."""
    if TENSORRT is None:
        pytest.skip("needs a TensorRT flavour (pip install tensorrt-rtx-cu13)")
    return TENSORRT


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A model repo: the real PP-OCR classifier as models/cls.onnx."""
    (tmp_path / "models").mkdir()
    shutil.copy(PPOCR, tmp_path / "models" / "cls.onnx")
    return tmp_path


@pytest.fixture
def write_yaml(workdir: Path):
    def write(body: str, name: str = "pipeline.yaml") -> Path:
        path = workdir / name
        path.write_text(textwrap.dedent(body).lstrip())
        return path
    return write


@pytest.fixture
def engine_size():
    """Build a model with the real build stage (TensorRT-RTX on the CPU here); returns the engine's size."""
    from trtflow.artifact import Artifact
    from trtflow.pipelines.schema import BuildStage
    from trtflow.stages import build

    def size(model: Path, shapes: dict[str, list[int]] | None, out: Path) -> int:
        profiles = {"p": {k: {"min": v, "opt": v, "max": v} for k, v in shapes.items()}} if shapes else {}
        out.mkdir(parents=True)
        result = build.run(BuildStage.model_validate({"kind": "build", "profiles": profiles}),
                           {"models": [Artifact(model, "onnx", "m", "variant")]}, out)
        cell = json.loads(result.outputs["report"].read_text())["cells"][0]
        assert cell["status"] == "ok" and cell["runtime"].startswith("tensorrt")
        return cell["engine_bytes"]
    return size
