"""Issue #67, Build 1: a no-op run ("nothing changed", answered from the record) is never wrong. Its witness is the
ledger the keys' readers wrote (trtflow/depends.py), so for every class of change a key can see, the record stops
holding whenever `plan` says a stage would run. Each change is made the way the review made it: a `${VARIABLE}` the
pipeline interpolates, a library upgraded in an import-path entry that is no `site-packages` (`pip install --target`
on PYTHONPATH), the user's code in a project under the Python installation's prefix (Docker's /usr/src/app), data
behind a symlinked folder, plus the model behind a link retargeted, code shadowing the user's in an earlier import-path
entry, and plain file content, new and deleted files.

Every command runs as the user runs it: a fresh process, without the script's folder on the import path (`-P`), and
with `sys.prefix` set to the folder holding the project (what /usr/src/app under /usr is)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.assets import PPOCR

PIPE = """
version: 1
name: witness
model: ${WITNESS_MODEL:-models/cls.onnx}
stages:
  a: {kind: "witness_stages:copy", outputs: {model: onnx}, params: {tag: "${WITNESS_TAG:-one}"}}
  fp16: {kind: precision, data: {tensors: "data/*/*/*.npy"}, holdout: 1, preflight: "off"}
"""

STAGES = '''
from pathlib import Path
from trtflow import StageResult

def copy(params, inputs, out_dir: Path) -> StageResult:
    (out_dir / "model.onnx").write_bytes(inputs["model"].path.read_bytes() + b"%s")
    return StageResult(outputs={"model": out_dir / "model.onnx"})
'''

# Run as the user's `trtflow`: the project's folder is the installation's prefix (item 3), then the command
COMMAND = """
import sys
sys.prefix = sys.base_prefix = sys.exec_prefix = {prefix!r}
from trtflow.flows.cli import main
sys.exit(main(["run", "pipeline.yaml"]))
"""
CHECK = """
import json, os, sys
sys.prefix = sys.base_prefix = sys.exec_prefix = {prefix!r}
from trtflow.flows import noop
noop.begin()
record = noop.Record.read(noop.record_path(["run", "pipeline.yaml"], os.getcwd()))
held = None if noop.holds(record.witness) else getattr(noop, "difference", lambda w: "moved")(record.witness)
from trtflow.flows.runner import Runner
from trtflow.pipelines.loader import load_pipeline
runs = [[i.name, i.reason] for i in Runner(load_pipeline("pipeline.yaml")).plan() if i.action != "reuse"]
print(json.dumps({{"changed": held, "runs": runs}}))
"""


@dataclass
class Project:
    root: Path  # the "installation prefix" holding the project
    work: Path  # the model repo: pipeline.yaml, the user's stages, models, data
    target: Path  # a `pip install --target` folder on PYTHONPATH
    env: dict[str, str]

    def python(self, script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-P", "-c", script.format(prefix=str(self.root))], cwd=self.work,
                              env=env or self.env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def record(self) -> None:
        """A run that reuses every stage, from nothing recorded: it writes the no-op record."""
        shutil.rmtree(self.root / "state" / "noop", ignore_errors=True)
        done = self.python(COMMAND)
        assert "0 ran" in done.stdout and "no flow run needed" in done.stdout, done.stdout + done.stderr

    def check(self, env: dict[str, str] | None = None) -> dict:
        """What the no-op's witness says (the first fact that moved, or None) and what `plan` would run."""
        return json.loads(self.python(CHECK, env).stdout.strip().splitlines()[-1])


def _npy(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.random.default_rng(seed).uniform(0, 1, (1, 3, 48, 192)).astype(np.float32))


def _onnx_variant(src: Path, dst: Path, doc: str) -> None:
    import onnx

    proto = onnx.load(str(src))
    proto.doc_string = doc
    onnx.save(proto, str(dst))


@pytest.fixture(scope="module")
def project(tmp_path_factory, prefect_api) -> Project:
    root = tmp_path_factory.mktemp("prefix")
    work, target = root / "src" / "app", root / "target"
    (work / "models" / "real").mkdir(parents=True)
    target.mkdir()
    shutil.copy(PPOCR, work / "models" / "real" / "a.onnx")
    _onnx_variant(PPOCR, work / "models" / "real" / "b.onnx", "another export")
    _onnx_variant(PPOCR, work / "models" / "other.onnx", "the other model")
    (work / "models" / "cls.onnx").symlink_to("real/a.onnx")
    (work / "pipeline.yaml").write_text(PIPE.lstrip())
    (work / "witness_stages.py").write_text(STAGES % b"one")
    for i in range(2):
        _npy(work / "data" / "real" / "x" / f"{i}.npy", i)
    _npy(root / "ext" / "deeper" / "0.npy", 7)  # reached only through the link data/sub
    (work / "data" / "sub").symlink_to(root / "ext")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WITNESS_")}
    env.update(PYTHONPATH=str(target), TRTFLOW_STATE_DIR=str(root / "state"), PREFECT_API_URL=prefect_api)
    p = Project(root, work, target, env)
    first = subprocess.run([sys.executable, "-P", "-c", COMMAND.format(prefix=str(root))], cwd=work, env=env,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0 and "2 ran" in first.stdout, first.stdout + first.stderr
    p.record()
    return p


@dataclass(frozen=True)
class Change:
    """One class of change: what it does to the project (and undoes), and whether a stage must then run."""
    name: str
    make: Callable[[Project, int], None]
    undo: Callable[[Project], None]
    runs: bool
    env: Callable[[Project, int], dict[str, str]] = lambda p, n: {}


def _write_code(p: Project, n: int) -> None:
    (p.work / "witness_stages.py").write_text(STAGES % f"edit{n}".encode())


def _shadow(p: Project, n: int) -> None:
    (p.target / "witness_stages.py").write_text(STAGES % f"shadow{n}".encode())


def _library(p: Project, n: int) -> None:
    meta = p.target / f"onnxruntime-99.{n}.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: onnxruntime\nVersion: 99.{n}.0\n")


def _clear_target(p: Project) -> None:
    for entry in p.target.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def _relink(p: Project, n: int) -> None:
    link = p.work / "models" / "cls.onnx"
    link.unlink()
    link.symlink_to("real/b.onnx")


def _link_back(p: Project) -> None:
    link = p.work / "models" / "cls.onnx"
    link.unlink()
    link.symlink_to("real/a.onnx")


def _model_content(p: Project, n: int) -> None:
    _onnx_variant(PPOCR, p.work / "models" / "real" / "a.onnx", f"exported again {n}")


def _data_content(p: Project, n: int) -> None:
    _npy(p.work / "data" / "real" / "x" / "1.npy", 100 + n)


def _data_deleted(p: Project, n: int) -> None:
    (p.work / "data" / "real" / "x" / "1.npy").rename(p.root / "1.npy.away")


def _data_back(p: Project) -> None:
    away = p.root / "1.npy.away"
    if away.exists():
        away.rename(p.work / "data" / "real" / "x" / "1.npy")
    _npy(p.work / "data" / "real" / "x" / "1.npy", 1)


CHANGES = [
    Change("a ${VARIABLE} naming the model", lambda p, n: None, lambda p: None, True,
           env=lambda p, n: {"WITNESS_MODEL": "models/other.onnx"}),
    Change("a ${VARIABLE} giving a parameter", lambda p, n: None, lambda p: None, True,
           env=lambda p, n: {"WITNESS_TAG": f"two{n}"}),
    Change("a variable the pipeline does not read", lambda p, n: None, lambda p: None, False,
           env=lambda p, n: {"WITNESS_UNUSED": str(n)}),
    Change("a library upgraded in a --target folder on PYTHONPATH", _library, _clear_target, True),
    Change("the user's function edited, under the installation prefix", _write_code,
           lambda p: (p.work / "witness_stages.py").write_text(STAGES % b"one"), True),
    Change("the user's module shadowed by an earlier import-path entry", _shadow, _clear_target, True),
    Change("a data file added behind a symlinked folder", lambda p, n: _npy(p.root / "ext" / "deeper" / f"e{n}.npy", n),
           lambda p: [f.unlink() for f in (p.root / "ext" / "deeper").glob("e*.npy")], True),
    Change("a data file's content", _data_content, _data_back, True),
    Change("a data file deleted", _data_deleted, _data_back, True),
    Change("the model's content", _model_content, lambda p: shutil.copy(PPOCR, p.work / "models" / "real" / "a.onnx"),
           True),
    Change("the model's link retargeted", _relink, _link_back, True),
]


def _apply(project: Project, changes: list[Change], n: int) -> dict:
    env = dict(project.env)
    for change in changes:
        change.make(project, n)
        env.update(change.env(project, n))
    try:
        return project.check(env)
    finally:
        for change in reversed(changes):
            change.undo(project)
        project.record()


def _sound(seen: dict, changes: list[Change]) -> None:
    what = ", ".join(c.name for c in changes)
    if seen["runs"]:  # plan says a stage would run: the record must not answer "nothing changed"
        assert seen["changed"] is not None, f"{what}: the no-op would answer while plan runs {seen['runs']}"
    assert bool(seen["runs"]) == any(c.runs for c in changes), (what, seen)


@pytest.mark.slow
@pytest.mark.parametrize("change", CHANGES, ids=[c.name for c in CHANGES])
def test_the_no_op_stands_aside_for_every_change_a_key_sees(project, change):
    seen = _apply(project, [change], 1)
    _sound(seen, [change])
    if not change.runs:  # what no key reads leaves the record standing
        assert seen["changed"] is None, seen
    assert project.check() == {"changed": None, "runs": []}, "undone and recorded again: the record holds"


@pytest.mark.slow
@settings(max_examples=6, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(changes=st.lists(st.sampled_from(CHANGES), min_size=1, max_size=3, unique_by=lambda c: c.name),
       n=st.integers(2, 1000))
def test_any_mix_of_changes_the_no_op_answers_only_when_plan_runs_nothing(project, changes, n):
    _sound(_apply(project, changes, n), changes)


@pytest.mark.slow
def test_a_variable_the_pipeline_reads_is_in_the_record(project):
    """The witness holds the value (or absence) of each variable interpolated, as read."""
    from trtflow.flows import noop

    record = next((project.root / "state" / "noop").glob("*.json"))
    variables = noop.Record.read(record).witness.variables
    assert variables == {"WITNESS_MODEL": None, "WITNESS_TAG": None}


def test_a_folder_tree_too_large_to_witness_takes_the_full_way(tmp_path, monkeypatch):
    """Fail closed: a reader that cannot name what it read leaves the ledger blind, and no witness is taken."""
    from trtflow import depends

    monkeypatch.setattr(depends, "MAX_FOLDERS", 3)
    for i in range(5):
        (tmp_path / "d" / str(i)).mkdir(parents=True)
    ledger = depends.Ledger()
    ledger.tree(tmp_path / "d")
    assert ledger.blind and not ledger.folders


def test_a_link_cycle_under_a_data_folder_is_walked_once(tmp_path):
    from trtflow import depends

    (tmp_path / "d" / "a").mkdir(parents=True)
    (tmp_path / "d" / "a" / "loop").symlink_to(tmp_path / "d")
    found = depends.reachable_folders(str(tmp_path / "d"))
    assert found is not None and str(tmp_path / "d" / "a") in found


def test_the_pipeline_reading_a_variable_twice_with_two_values_is_blind():
    from trtflow import depends

    ledger = depends.Ledger()
    ledger.variable("X", "1")
    ledger.variable("X", "1")
    assert not ledger.blind
    ledger.variable("X", "2")
    assert ledger.blind


def test_a_dangling_link_and_an_unreadable_folder_are_witnessed_or_blind(tmp_path, monkeypatch):
    """A link whose folder does not exist yet is in the witness (its target made later is a change); a folder that
    cannot be listed (as another user finds a 0700 folder; root lists every folder, so the refusal is simulated)
    leaves the ledger blind: nothing it holds can be witnessed."""
    import os

    from trtflow import depends

    (tmp_path / "d" / "closed").mkdir(parents=True)
    (tmp_path / "d" / "later").symlink_to(tmp_path / "not-yet")
    assert str(tmp_path / "d" / "later") in depends.reachable_folders(str(tmp_path / "d"))
    real = os.scandir

    def scandir(path):
        if str(path).endswith("closed"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)
    monkeypatch.setattr(depends.os, "scandir", scandir)
    assert depends.reachable_folders(str(tmp_path / "d")) is None
