from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_MODEL = ROOT / "examples" / "ppocr-cls" / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A model repo: the real PP-OCR classifier as models/cls.onnx."""
    (tmp_path / "models").mkdir()
    shutil.copy(EXAMPLE_MODEL, tmp_path / "models" / "cls.onnx")
    return tmp_path


@pytest.fixture
def write_yaml(workdir: Path):
    def write(body: str, name: str = "pipeline.yaml") -> Path:
        path = workdir / name
        path.write_text(textwrap.dedent(body).lstrip())
        return path
    return write


def engine_bytes(model: Path, shapes: dict[str, list[int]] | None, out: Path) -> int:
    """Build `model` with the real build stage (TensorRT-RTX on the CPU here) and return the engine's size."""
    import json

    from pipelines.schema import BuildStage
    from stages import build
    from stages.base import Artifact

    profiles = {"p": {k: {"min": v, "opt": v, "max": v} for k, v in shapes.items()}} if shapes else {}
    out.mkdir(parents=True)
    result = build.run(BuildStage.model_validate({"kind": "build", "profiles": profiles}),
                       {"models": [Artifact(model, "onnx", "m", "variant")]}, out)
    cell = json.loads(result.outputs["report"].read_text())["cells"][0]
    assert cell["status"] == "ok" and cell["runtime"].startswith("tensorrt")
    return cell["engine_bytes"]
