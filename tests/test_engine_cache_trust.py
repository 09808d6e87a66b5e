"""The build's caches in a store's shared/ (issue #37): a FIFO where an engine-cache entry's file or the timing
cache belongs never hangs a build (it is ignored and replaced), and an entry whose engine was replaced together with
the digest inside it is never served: the digest it must match is kept apart from it."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.test_store_integrity import within
from trtflow.artifact import Artifact, Inputs
from trtflow.pipelines.params.build import BuildStage
from trtflow.stages import build
from trtflow.stages.trt import building

pytestmark = pytest.mark.tensorrt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Artifact:
    """One Relu: it builds in a fraction of a second on the CPU."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return Artifact(path, "onnx", hashlib.sha256(path.read_bytes()).hexdigest(), "prepare")


@pytest.fixture
def run(tmp_path, tiny):
    """The build stage on the tiny model with both shared caches in tmp_path/shared: (its one cell, the result)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    runs = iter(range(100))

    def run_once():
        out = tmp_path / f"out{next(runs)}"
        out.mkdir()
        cache = Artifact(shared, "shared-cache", "")
        result = build.run(BuildStage.model_validate({"kind": "build"}),
                           Inputs({"models": [tiny], "engine_cache": cache, "timing_cache": cache}), out)
        (cell,) = json.loads(result.outputs["report"].read_text())["cells"]
        return cell, result
    return run_once


@pytest.fixture
def entry(run, tmp_path) -> Path:
    """The engine cache's entry of the tiny model's cell, as a second run took it."""
    first, _ = run()
    second, _ = run()
    assert "reused" not in first and second["reused"]
    return tmp_path / "shared" / "engines" / second["reused"]


def plan_of(result) -> bytes:
    (plan,) = result.outputs["engines"].glob("*/engine.plan")
    return plan.read_bytes()


@pytest.mark.parametrize("name", ["sha256", "build.json"])
def test_a_fifo_in_an_engine_cache_entry_is_not_read_and_the_entry_not_served(run, entry, name):
    (entry / name).unlink(missing_ok=True)
    os.mkfifo(entry / name)
    with within(20):
        cell, result = run()
    assert cell["status"] == "ok" and "reused" not in cell  # built again, not taken from the entry
    again, _ = run()  # the bad entry was replaced by the rebuilt one
    assert again["reused"] == entry.name and all(p.is_file() and not p.is_symlink() for p in entry.iterdir())


def test_an_engine_replaced_with_its_digest_in_the_entry_is_not_served(run, entry):
    substitute = b"not the engine that was built"
    digest = hashlib.sha256(substitute).hexdigest()
    (entry / "engine.plan").unlink()  # a hard link to a published engine: replace it, never write through it
    (entry / "engine.plan").write_bytes(substitute)
    (entry / "sha256").write_text(digest + "\n")  # the digest the entry used to carry, replaced with the engine
    record = json.loads((entry / "build.json").read_text())
    (entry / "build.json").write_text(json.dumps({**record, "engine_sha256": digest, "engine_bytes": 29}))
    cell, result = run()
    assert "reused" not in cell and plan_of(result) != substitute
    assert cell["engine_sha256"] == hashlib.sha256(plan_of(result)).hexdigest()  # the build result records it
    again, reused = run()  # the rebuilt engine replaced the entry, and is served with its digest
    assert again["reused"] == entry.name and plan_of(reused) == plan_of(result)
    assert again["engine_sha256"] == cell["engine_sha256"]


def test_a_fifo_in_place_of_the_timing_cache_is_ignored_and_replaced(run, tmp_path, tensorrt_backend, monkeypatch):
    """The worker read the timing cache with read_bytes(): blocked until the cell's time limit (an hour)."""
    monkeypatch.setattr(building, "CELL_TIMEOUT_S", 60)  # the old worker was killed at it: the cell failed
    cache = tmp_path / "shared" / f"timing-{tensorrt_backend.flavour}-{tensorrt_backend.version}.cache"
    os.mkfifo(cache)
    cell, result = run()
    assert cell["status"] == "ok"
    (warning,) = result.warnings
    assert "the timing cache was not read" in warning and "is a FIFO" in warning and "built without it" in warning
    (log,) = result.outputs["engines"].glob("*/build.log")
    assert "the timing cache was not read" in log.read_text()
    assert cache.is_file() and cache.stat().st_size > 0  # this build's timing cache took its place
    again, result = run()
    assert again["reused"] and not result.warnings
