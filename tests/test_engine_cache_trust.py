"""The build's caches in a store's shared/ (issue #37): a FIFO where an engine-cache entry's file or the timing
cache belongs never hangs a build (it is ignored and replaced), and an entry whose engine was replaced together with
the digest inside it is never served: the digest it must match is kept apart from it."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.test_store_integrity import within
from trtflow import files
from trtflow.artifact import Artifact, Inputs
from trtflow.pipelines.params.build import BuildStage
from trtflow.stages.build import stage as build
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


# --- engines stored once (issue #40): the build output and the cache entry are one file where the FS allows ------
def cached_plan(tmp_path: Path, cell: dict) -> Path:
    return tmp_path / "shared" / "engines" / cell["reused"] / "engine.plan"


def index_digest(tmp_path: Path, key: str) -> str:
    return (tmp_path / "shared" / "engines" / "index" / key).read_text().strip()


def test_an_engine_is_stored_once_by_the_build_output_and_the_cache(run, tmp_path):
    first, built = run()
    second, reused = run()
    (plan,) = built.outputs["engines"].glob("*/engine.plan")
    (taken,) = reused.outputs["engines"].glob("*/engine.plan")
    entry = cached_plan(tmp_path, second)
    assert plan.stat().st_ino == entry.stat().st_ino == taken.stat().st_ino  # one file, three names
    assert entry.stat().st_nlink == 3
    # the released/published names go away: the cache's name keeps the engine whole and it is served again
    for out in (built, reused):
        shutil.rmtree(out.outputs["engines"])
    assert files.sha256(entry) == index_digest(tmp_path, second["reused"]) == first["engine_sha256"]
    third, _ = run()
    assert third["reused"] == second["reused"]


def test_where_a_link_fails_the_engine_is_copied(run, tmp_path, monkeypatch):
    def no_link(*_, **__):
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    monkeypatch.setattr(files.os, "link", no_link)
    first, built = run()
    second, reused = run()
    (plan,) = built.outputs["engines"].glob("*/engine.plan")
    (taken,) = reused.outputs["engines"].glob("*/engine.plan")
    entry = cached_plan(tmp_path, second)
    assert len({plan.stat().st_ino, entry.stat().st_ino, taken.stat().st_ino}) == 3
    assert plan.read_bytes() == entry.read_bytes() == taken.read_bytes()
    assert second["engine_sha256"] == first["engine_sha256"] == files.sha256(taken)


@pytest.mark.slow
def test_a_placed_copy_removed_or_replaced_leaves_the_cache_whole_written_through_is_never_served(run, tmp_path):
    """A release placing the build's engine in a Triton repository with `files.place` shares its bytes with the cache:
    deleting the repository or replacing its file leaves the cache's engine as it was; bytes written into it
    in place (the one thing nothing in trtflow does) are caught by the cache's digest, never served."""
    first, built = run()
    (plan,) = built.outputs["engines"].glob("*/engine.plan")
    released = tmp_path / "repo" / "m" / "1" / "model.plan"
    released.parent.mkdir(parents=True)
    files.place(plan, released, files.ENGINE_BYTES)
    digest = first["engine_sha256"]
    shutil.rmtree(tmp_path / "repo")  # the released repository deleted
    again, _ = run()
    entry = cached_plan(tmp_path, again)
    assert files.sha256(entry) == digest
    released.parent.mkdir(parents=True)
    files.place(entry, released, files.ENGINE_BYTES)
    released.unlink()  # replaced, the way a new version of a file is written
    released.write_bytes(b"another engine")
    assert files.sha256(entry) == digest and run()[0]["reused"] == again["reused"]
    released.unlink()
    files.place(entry, released, files.ENGINE_BYTES)
    with open(released, "r+b") as fh:  # written in place through the released name
        fh.write(b"x")
    rebuilt, result = run()
    assert "reused" not in rebuilt and hashlib.sha256(plan_of(result)).hexdigest() == digest  # rebuilt, the same engine
    assert run()[0]["reused"] == again["reused"]  # and the entry replaced by it


def test_place_refuses_what_is_no_regular_file_and_an_existing_name(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(files.NotAFile):
        files.place(tmp_path / "fifo", tmp_path / "a", files.ENGINE_BYTES)
    assert not os.path.lexists(tmp_path / "a")
    (tmp_path / "target").write_bytes(b"engine")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(files.NotAFile):
        files.place(tmp_path / "link", tmp_path / "b", files.ENGINE_BYTES)
    assert not os.path.lexists(tmp_path / "b")
    (tmp_path / "c").write_bytes(b"other")
    with pytest.raises(FileExistsError):
        files.place(tmp_path / "target", tmp_path / "c", files.ENGINE_BYTES)
    assert (tmp_path / "c").read_bytes() == b"other"
