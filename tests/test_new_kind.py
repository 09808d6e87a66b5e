"""Adding a stage kind is one params file, one stage folder and one line: shown on a copy of trtflow's source
with exactly those three changes, run as users run it (`trtflow run`, twice: the second run reuses the result)."""
from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest

from tests.test_shared_store import bucket, s3_server  # noqa: F401 - fixtures: moto's S3 server, a bucket

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"trtflow": "trtflow", "pipelines": "trtflow/pipelines", "flows": "trtflow/flows", "stages": "trtflow/stages"}

PARAMS = '''
from typing import Literal

from pydantic import Field

from trtflow.pipelines.row import Kind, Slot
from trtflow.pipelines.schema import StageBase


class CountStage(StageBase):
    kind: Literal["count"]
    op_types: list[str] = Field(default_factory=lambda: ["Conv"], description="the op types to count")


KIND = Kind("count", CountStage, slots={"model": Slot("onnx", prefer=("prepare",), source_ok=True)},
            outputs={"report": "json"})
'''

STAGE = '''
import json
from pathlib import Path

import onnx

from trtflow.artifact import Inputs, StageResult
from trtflow.pipelines.params.count import CountStage
from trtflow.stage_code import StageCode

VERSION = "1"


def run(params: CountStage, inputs: Inputs, out_dir: Path) -> StageResult:
    graph = onnx.load(str(inputs.one("model").path), load_external_data=False).graph
    counts = {op: sum(n.op_type == op for n in graph.node) for op in params.op_types}
    (out_dir / "report.json").write_text(json.dumps(counts))
    return StageResult(outputs={"report": out_dir / "report.json"}, summary=f"counted {counts}")


CODE = StageCode(run)
'''


def _copy_source(dst: Path) -> Path:
    for src, rel in PACKAGES.items():
        shutil.copytree(ROOT / src, dst / rel, ignore=shutil.ignore_patterns("__pycache__", "templates"))
    shutil.copytree(ROOT / "flows" / "templates", dst / "trtflow" / "flows" / "templates")
    return dst


def _changed(old: Path, new: Path) -> tuple[list[str], list[str]]:
    """Files added and files whose content differs, between two trees."""
    added, differ = [], []
    for path in sorted(new.rglob("*.py")):
        rel = path.relative_to(new)
        if not (old / rel).exists():
            added.append(str(rel))
        elif not filecmp.cmp(old / rel, path, shallow=False):
            differ.append(str(rel))
    return added, differ


def _counting(workdir: Path, pythonpath: Path) -> tuple[Path, Callable[..., subprocess.CompletedProcess]]:
    """A pipeline of one `count` stage, and the trtflow command run with `pythonpath` first (where the kind is)."""
    pipeline = workdir / "pipeline.yaml"
    pipeline.write_text("version: 1\nname: counted\nmodel: models/cls.onnx\nstages:\n"
                        "  convs: {kind: count, op_types: [Conv, Relu]}\n")
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}

    def trtflow(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trtflow.flows.cli", *args], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=600)

    return pipeline, trtflow


@pytest.mark.slow
def test_a_new_kind_is_two_files_and_one_line(tmp_path, workdir):
    pristine = _copy_source(tmp_path / "pristine")
    src = _copy_source(tmp_path / "src")
    (src / "trtflow/pipelines/params/count.py").write_text(textwrap.dedent(PARAMS).lstrip())
    (src / "trtflow/stages/count").mkdir()
    (src / "trtflow/stages/count/__init__.py").write_text('"""The toy count kind."""\n')
    (src / "trtflow/stages/count/stage.py").write_text(textwrap.dedent(STAGE).lstrip())
    kinds = src / "trtflow/pipelines/kinds.py"
    text = kinds.read_text()
    assert '    "release",\n)' in text
    kinds.write_text(text.replace('    "release",\n)', '    "release",\n    "count",\n)'))

    added, differ = _changed(pristine, src)
    assert added == ["trtflow/pipelines/params/count.py", "trtflow/stages/count/__init__.py",
                     "trtflow/stages/count/stage.py"] and differ == [
        "trtflow/pipelines/kinds.py"]
    diff = subprocess.run(["diff", str(pristine / "trtflow/pipelines/kinds.py"), str(kinds)], capture_output=True,
                          text=True).stdout
    assert [ln for ln in diff.splitlines() if ln[:1] in "<>"] == ['>     "count",']

    pipeline, trtflow = _counting(workdir, src)
    env = {**os.environ, "PYTHONPATH": str(src)}

    where = subprocess.run([sys.executable, "-c", "import trtflow.pipelines.kinds as k; print(k.__file__)"],
                           env=env, capture_output=True, text=True, cwd=workdir).stdout.strip()
    assert where == str(kinds), "the copy must be the trtflow that runs"

    schema = json.loads(trtflow("schema").stdout)
    assert "CountStage" in schema["$defs"]
    checked = trtflow("validate", str(pipeline))
    assert checked.returncode == 0 and "count" in checked.stdout, checked.stderr

    first = trtflow("run", str(pipeline))
    assert first.returncode == 0, first.stderr
    assert "(1 ran, 0 reused)" in first.stdout and "convs" in first.stdout, first.stdout
    reports = list((workdir / ".trtflow" / "convs").glob("*/report.json"))
    assert len(reports) == 1
    counts = json.loads(reports[0].read_text())
    assert counts["Conv"] > 10 and counts["Relu"] >= 0  # the PP-OCR classifier is a small CNN

    second = trtflow("run", str(pipeline))
    assert second.returncode == 0, second.stderr
    assert "reused" in second.stdout and "0 ran, 1 reused" in second.stdout

    changed = trtflow("plan", str(pipeline), "--set", "stages.convs.op_types=[Conv]")
    assert changed.returncode == 0 and "1 to run, 0 reused" in changed.stdout, changed.stdout


NOTE_PARAMS = '''
from typing import Literal

from trtflow.pipelines.row import Kind, SharedArea
from trtflow.pipelines.schema import StageBase


class NoteStage(StageBase):
    kind: Literal["note"]
    text: str = "hello"


KIND = Kind("note", NoteStage, slots={}, outputs={"note": "file"},
            shared_caches=lambda p: ("notes",),  # the store's shared/ folder, outside the key
            shared=(SharedArea("notes/", 1 << 16),))  # kept for every machine of a remote store
'''

NOTE_STAGE = '''
from pathlib import Path

from trtflow.artifact import Inputs, StageResult
from trtflow.events import Event, StageRan
from trtflow.pipelines.params.note import NoteStage
from trtflow.stage_code import StageCode

VERSION = "1"


def announce(ran: StageRan) -> list[Event]:
    return [Event("trtflow.note.written", f"trtflow.note.{ran.pipeline.parent.name}.{ran.stage}",
                  {"trtflow.stage": ran.stage}, {"text": ran.metrics.get("text"), "key": ran.key},
                  say=f"noted {ran.metrics.get('text')}")]


def run(params: NoteStage, inputs: Inputs, out_dir: Path) -> StageResult:
    (out_dir / "note.txt").write_text(params.text)
    shared = inputs.one("notes").path / "notes"
    shared.mkdir(exist_ok=True)
    (shared / "latest.txt").write_text(params.text)
    return StageResult(outputs={"note": out_dir / "note.txt"}, summary=params.text, metrics={"text": params.text})


CODE = StageCode(run, events=announce)  # what the flow announces after a stage of it ran
'''


@pytest.mark.slow
def test_a_new_kind_declares_its_events_in_its_stage_and_its_shared_folder_on_its_row(tmp_path, workdir, bucket, prefect_api):
    """A kind whose stage emits an event after it ran and writes a shared folder that a remote store keeps for
    every machine: still its params file (the row declares the folder), its stage module (exporting its events
    beside `run`) and one line; flows/ is not touched. Run as users run it, on an S3 store (moto) and the test run's Prefect server."""
    import time

    import httpx

    pristine = _copy_source(tmp_path / "pristine")
    src = _copy_source(tmp_path / "src")
    (src / "trtflow/pipelines/params/note.py").write_text(textwrap.dedent(NOTE_PARAMS).lstrip())
    (src / "trtflow/stages/note").mkdir()
    (src / "trtflow/stages/note/__init__.py").write_text('"""The toy note kind."""\n')
    (src / "trtflow/stages/note/stage.py").write_text(textwrap.dedent(NOTE_STAGE).lstrip())
    kinds = src / "trtflow/pipelines/kinds.py"
    kinds.write_text(kinds.read_text().replace('    "release",\n)', '    "release",\n    "note",\n)'))
    added, differ = _changed(pristine, src)
    assert added == ["trtflow/pipelines/params/note.py", "trtflow/stages/note/__init__.py",
                     "trtflow/stages/note/stage.py"]
    assert differ == ["trtflow/pipelines/kinds.py"]

    name, fs = bucket
    url = f"s3://{name}/team"
    (workdir / "pipeline.yaml").write_text(f"version: 1\nname: noted\nmodel: models/cls.onnx\nartifacts: {url}\n"
                                           "stages:\n  say: {kind: note, text: toy kind was here}\n")
    env = {**os.environ, "PYTHONPATH": str(src), "TRTFLOW_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "run", "pipeline.yaml"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = f"{name}/team/shared/notes/latest.txt"
    assert kept in fs.find(name), (done.stdout, fs.find(name))  # synced by the store
    assert fs.cat(kept) == b"toy kind was here"
    deadline, seen = time.monotonic() + 30, []
    while time.monotonic() < deadline and not seen:
        answer = httpx.post(f"{prefect_api}/events/filter", timeout=10, json={
            "filter": {"event": {"name": ["trtflow.note.written"]},
                       "resource": {"id": [f"trtflow.note.{workdir.name}.say"]}}, "limit": 5})
        answer.raise_for_status()
        seen = [e["payload"]["text"] for e in answer.json()["events"]]
        time.sleep(0.5)
    assert seen == ["toy kind was here"]


def test_flows_name_no_kind():
    """What the flow does for a kind is declared on the kind's row: no string in flows/ is a kind's name, apart
    from the CLI's own words that happen to be one (the command `trtflow validate`, in its module and in app.py's
    list of commands; reduce's check `build`)."""
    import ast

    from trtflow.pipelines.kinds import BUILT_IN

    words = {("cli/validate.py", "validate"), ("cli/app.py", "validate"), ("cli/reduce.py", "build")}
    found = []
    for path in sorted((ROOT / "flows").rglob("*.py")):
        rel = path.relative_to(ROOT / "flows").as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in BUILT_IN and (rel, node.value) not in words:
                found.append(f"flows/{rel}:{node.lineno}: {node.value!r}")
    assert found == []


# --- a kind from a package of yours: three files, installed, and nothing of trtflow's touched -------------------

PACKAGE_CONTRACT = '''
"""The count kind: its contract (parameters, slots, outputs, where its code is)."""
from typing import Literal

from pydantic import Field

from trtflow.pipelines.row import Kind, Slot
from trtflow.pipelines.schema import StageBase


class CountStage(StageBase):
    kind: Literal["count"]
    op_types: list[str] = Field(default_factory=lambda: ["Conv"], description="the op types to count")


KIND = Kind("count", CountStage, slots={"model": Slot("onnx", prefer=("prepare",), source_ok=True)},
            outputs={"report": "json"}, module="countkind.stage", libraries=("onnx",))
'''

PACKAGE_REPORT = '''
"""What the count kind writes, as later stages read it."""
from pydantic import BaseModel, ConfigDict


class CountReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    counts: dict[str, int]
    nodes: int
'''

PACKAGE_STAGE = '''
"""The count kind's work."""
import json
from pathlib import Path

import onnx

from countkind import CountStage
from countkind.report import CountReport
from trtflow import Inputs, StageResult
from trtflow.stage_code import StageCode

VERSION = "1"


def run(params: CountStage, inputs: Inputs, out_dir: Path) -> StageResult:
    graph = onnx.load(str(inputs.one("model").path), load_external_data=False).graph
    counts = {op: sum(n.op_type == op for n in graph.node) for op in params.op_types}
    report = {"counts": counts, "nodes": len(graph.node)} if "Bad" not in counts else {"counts": counts}
    (out_dir / "report.json").write_text(json.dumps(report))
    return StageResult(outputs={"report": out_dir / "report.json"}, summary=f"counted {counts}")


CODE = StageCode(run, report=CountReport)
'''

PACKAGING = '''
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "countkind"
version = "0.1"

[project.entry-points."trtflow.kinds"]
count = "countkind:KIND"

[tool.setuptools]
packages = ["countkind"]
'''


@pytest.mark.slow
def test_a_kind_from_a_package_of_yours_is_three_files_and_its_entry_point(tmp_path, workdir):
    """Issue #70: a kind is one contract. A package of the user's adds one with its contract (`__init__.py`: the
    parameters and the row), its stage module (`run` and CODE) and its report's class, and declares it as an
    entry point of `trtflow.kinds` in its own packaging; installed with pip beside the installed trtflow, whose
    source is not touched, it runs as a built-in kind does: keyed by its code, its report checked, reused."""
    package = tmp_path / "countkind-src"
    (package / "countkind").mkdir(parents=True)
    for name, text in (("__init__.py", PACKAGE_CONTRACT), ("stage.py", PACKAGE_STAGE), ("report.py", PACKAGE_REPORT)):
        (package / "countkind" / name).write_text(textwrap.dedent(text).lstrip())
    (package / "pyproject.toml").write_text(PACKAGING.lstrip())
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                                "--no-build-isolation", "--target", str(site), str(package)],
                               capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    assert sorted(p.name for p in (site / "countkind").glob("*.py")) == ["__init__.py", "report.py", "stage.py"]

    pipeline, trtflow = _counting(workdir, site)

    assert "CountStage" in json.loads(trtflow("schema").stdout)["$defs"]
    checked = trtflow("validate", str(pipeline))
    assert checked.returncode == 0 and "count" in checked.stdout, checked.stderr
    first = trtflow("run", str(pipeline))
    assert first.returncode == 0, first.stderr
    assert "(1 ran, 0 reused)" in first.stdout, first.stdout
    (report,) = (workdir / ".trtflow" / "convs").glob("*/report.json")
    assert json.loads(report.read_text())["counts"]["Conv"] > 10  # the PP-OCR classifier is a small CNN
    assert "0 ran, 1 reused" in trtflow("run", str(pipeline)).stdout

    stage = site / "countkind" / "stage.py"  # the installed package's code edited: its stages run again
    stage.write_text(stage.read_text() + "\n# a comment\n")
    planned = trtflow("plan", str(pipeline))
    assert "1 to run, 0 reused" in planned.stdout and "countkind/stage.py" in planned.stdout, planned.stdout

    bad = trtflow("run", str(pipeline), "--set", "stages.convs.op_types=[Bad]")  # a report its class refuses
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "wrote a report its kind's CountReport refuses (nodes: Field required)" in bad.stderr, bad.stderr

    without = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "validate", str(pipeline)], cwd=workdir,
                             capture_output=True, text=True, timeout=600)  # the package not installed
    assert without.returncode == 2 and "unknown stage kind 'count'" in without.stderr, without.stderr


def test_an_entry_point_that_is_no_kind_or_takes_a_built_in_name_is_one_line():
    from trtflow.errors import SpecError
    from trtflow.pipelines.kinds import BUILT_IN_KINDS, _checked

    with pytest.raises(SpecError, match=r"^w is a function, not a trtflow.pipelines.row.Kind$"):
        _checked(lambda: None, "count", "w")
    with pytest.raises(SpecError, match=r"its row is named 'validate'"):
        _checked(BUILT_IN_KINDS["validate"], "validate", "w")
    with pytest.raises(SpecError, match=r"give its row module='yourpackage.stage'"):
        _checked(type(BUILT_IN_KINDS["validate"])("count", BUILT_IN_KINDS["validate"].params, {}, {}), "count", "w")
