"""The store never serves what it did not verify: files deleted or changed inside a published result, metadata of
the wrong shape, staging left by dead runs (issue #11)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import stage_fns
from tests.test_runner import plan_of, run_all
from trtflow.flows import cli
from trtflow.flows.store import HOST

PIPE = """
version: 1
name: integrity
model: models/cls.onnx
stages:
  a: {kind: "tests.stage_fns:copy_model", outputs: {model: onnx}, inputs: {model: source}}
  build: {kind: "tests.stage_fns:engines", outputs: {engines: dir}, inputs: {model: a}}
  c: {kind: "tests.stage_fns:count_bytes", outputs: {report: json}, inputs: {model: a}}
"""


def published(store: Path, stage: str) -> Path:
    (directory,) = [d for d in (store / stage).iterdir() if d.is_dir() and not d.name.startswith(".")]
    return directory


@pytest.fixture
def pipe(write_yaml, workdir):
    path = write_yaml(PIPE)
    assert set(run_all(path).values()) == {"ran"}
    return path, workdir / ".trtflow"


def test_files_deleted_inside_a_directory_output_are_not_reused(pipe):
    path, store = pipe
    for plan in (published(store, "build") / "engines").rglob("engine.plan"):
        plan.unlink()
    assert plan_of(path)["build"] == ("run", "its stored result failed verification: "
                                          "engines/fp16/engine.plan is missing")
    stage_fns.CALLS.clear()
    assert run_all(path) == {"a": "reused", "build": "ran", "c": "reused"}
    assert len(list((published(store, "build") / "engines").rglob("engine.plan"))) == 2


def test_a_same_size_corruption_is_noticed(pipe):
    path, store = pipe
    model = published(store, "a") / "model.onnx"
    data = bytearray(model.read_bytes())
    data[100] ^= 0xFF
    model.write_bytes(bytes(data))  # same size, new mtime: re-hashed on reuse
    assert run_all(path) == {"a": "ran", "build": "reused", "c": "reused"}  # same output again: downstream keeps
    assert published(store, "a").joinpath("model.onnx").read_bytes()[100] != data[100]


def test_verify_finds_what_reuse_cannot_and_repair_drops_it(pipe, capsys):
    path, store = pipe
    model = published(store, "a") / "model.onnx"
    st = model.stat()
    data = bytearray(model.read_bytes())
    data[100] ^= 0xFF
    model.write_bytes(bytes(data))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back: only a full re-hash sees it
    assert cli.main(["verify", "--store", str(store)]) == 1
    out = capsys.readouterr().out
    assert "model.onnx changed content" in out and "2 results verified, 1 bad" in out.replace("\n", " ")
    assert cli.main(["verify", str(path), "--repair"]) == 0
    assert "1 removed" in capsys.readouterr().out
    assert run_all(path)["a"] == "ran"
    assert cli.main(["verify", "--store", str(store)]) == 0
    assert "3 results verified, 0 bad" in capsys.readouterr().out


@pytest.mark.parametrize("meta, content", [
    ("manifest", "[]"), ("manifest", "null"), ("manifest", '{"key": 5}'), ("manifest", '{"status": "ok"}'),
    ("manifest", '{"status": "ok", "key": "KEY", "outputs": {"model": "model.onnx"}}'),
    ("last", "[]"), ("last", '{"key": null}'), ("digests", "[]"), ("digests", '{"x": "y"}'),
])
def test_metadata_of_the_wrong_shape_is_treated_as_absent(pipe, meta, content):
    path, store = pipe
    directory = published(store, "a")
    target = {"manifest": directory / "manifest.json", "last": store / "a" / "last.json",
              "digests": store / "digests.json"}[meta]
    target.write_text(content.replace("KEY", directory.name))
    statuses = run_all(path)
    assert statuses["a"] == ("ran" if meta == "manifest" else "reused")
    assert set(run_all(path).values()) == {"reused"}


def test_staging_of_dead_runs_is_removed_and_a_live_ones_kept(pipe):
    path, store = pipe
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    stale = store / "build" / f".tmp-0123456789ab-{HOST}-{pid}-xyz"
    live = store / "build" / f".tmp-0123456789ab-{HOST}-{os.getpid()}-xyz"
    other_host = store / "build" / f".tmp-0123456789ab-elsewhere-{pid}-xyz"
    for d in (stale, live, other_host):
        (d / "engines").mkdir(parents=True)
    run_all(path)
    assert not stale.exists() and live.exists() and other_host.exists()


def test_published_results_record_every_file(pipe):
    _, store = pipe
    manifest = json.loads((published(store, "build") / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["engines/fp16/engine.plan", "engines/fp32/engine.plan", "summary.md"]
    assert all(len(r["sha256"]) == 64 and r["size"] > 0 for k, r in manifest["files"].items() if k != "summary.md")
