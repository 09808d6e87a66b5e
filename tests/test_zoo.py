"""The fast part of the zoo (bench/zoo.py runs all of it): real architectures exported from PyTorch, each through
prepare -> fp16 -> int8 (entropy, percentile, minmax) -> build as a trtflow pipeline, with no stage failing."""
from __future__ import annotations

import importlib.util
import os

import pytest

from tests.assets import ROOT

# exported in well under 15 s each; each family breaks a converter in its own way
FAST = ["yolo_head", "transformer_encoder", "lstm", "if_model", "fp16_mixed"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    before = {k: os.environ.get(k) for k in ("TRTFLOW_ZOO", "TRTFLOW_ZOO_SAMPLES")}
    os.environ["TRTFLOW_ZOO"] = str(root)  # read when the bench modules load
    os.environ["TRTFLOW_ZOO_SAMPLES"] = "8"  # the bench calibrates on 32; CI keeps it fast
    try:
        yield _load("zoo_models"), _load("zoo")
    finally:
        for k, v in before.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.mark.tensorrt
@pytest.mark.parametrize("name", FAST)
def test_through_every_stage(zoo, name, tmp_path):
    models, bench = zoo
    models.MODELS.mkdir(parents=True, exist_ok=True)
    models.DATA.mkdir(parents=True, exist_ok=True)
    facts = {**models.BUILDERS[name](), "samples": models.SAMPLES}
    row = bench.run_model(name, facts, tmp_path)
    assert row["errors"] == {}, row["errors"]
    assert row["trial_build"] == "ok"
    cosine, _ = row["fp16"]
    assert cosine > 0.99, f"FP16 pre-flight cosine {cosine}"
    for method in bench.METHODS:
        assert row[f"int8_{method}"][0] > 0.5, (method, row[f"int8_{method}"])
    assert all(size for size in row["engines"].values()), row["engines"]
    assert set(row["engines"]) == {"prepare", "fp16", "int8_entropy", "int8_percentile", "int8_minmax"}
