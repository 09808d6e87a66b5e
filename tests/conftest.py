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
