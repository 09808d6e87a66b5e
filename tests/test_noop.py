"""Issue #54: a `trtflow run` where nothing changed answers from its record (flows/noop.py) without importing
Prefect, pydantic, ONNX or numpy, and leaves a cached flow run in Prefect; whatever a key is computed from (the
model, the data, the pipeline's own code, the store, the environment) changing sends it the full way again."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

PIPE = """
version: 1
name: noopdemo
model: models/cls.onnx
stages:
  a: {kind: "mine:copy", outputs: {model: onnx}}
  b: {kind: "mine:count_bytes", outputs: {report: json}, inputs: {model: a}}
  fp16: {kind: precision, data: {tensors: "data/*.npy"}, holdout: 1, preflight: "off"}
"""

MINE = '''
from pathlib import Path
from trtflow import StageResult

def copy(params, inputs, out_dir: Path) -> StageResult:
    (out_dir / "model.onnx").write_bytes(inputs["model"].path.read_bytes() + b"{tag}")
    return StageResult(outputs={{"model": out_dir / "model.onnx"}})

def count_bytes(params, inputs, out_dir: Path) -> StageResult:
    (out_dir / "report.json").write_text('{{"bytes": %d}}' % inputs["model"].path.stat().st_size)
    return StageResult(outputs={{"report": out_dir / "report.json"}})
'''
HEAVY = ("prefect", "pydantic", "onnx", "numpy", "rich", "httpx", "yaml")
PROBE = ("import sys; from trtflow.flows.cli import main; code = main(sys.argv[1:]); "
         "print('loaded:', sorted({m.split('.')[0] for m in sys.modules} & set(%r))); sys.exit(code)" % (HEAVY,))


def _run(workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", PROBE, "run", "pipeline.yaml"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _cached_runs(url: str, name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    async def read():
        async with get_client() as client:
            return await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
    return [r for r in asyncio.run(read()) if r.state and r.state.name == "Cached" and "cached" in r.tags]


@pytest.mark.slow
def test_a_run_where_nothing_changed_answers_from_its_record_and_anything_a_key_reads_sends_it_the_full_way(
        workdir, tmp_path, prefect_api):
    (workdir / "pipeline.yaml").write_text(PIPE.lstrip())
    (workdir / "mine.py").write_text(MINE.format(tag="one"))
    (workdir / "data").mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        np.save(workdir / "data" / f"{i}.npy", rng.uniform(0, 1, (1, 3, 48, 192)).astype(np.float32))
    env = {**os.environ, "PREFECT_API_URL": prefect_api}

    first = _run(workdir, env)
    assert "3 stages (3 ran, 0 reused)" in first.stdout
    full = _run(workdir, env)  # every stage found in place: said without a flow run, and recorded
    assert "3 stages (0 ran, 3 reused)" in full.stdout and "no flow run needed" in full.stdout
    records = list((tmp_path / "trtflow-state" / "noop").glob("*.json"))
    assert len(records) == 1

    fast = _run(workdir, env)
    assert "3 stages (0 ran, 3 reused)" in fast.stdout and "nothing changed since the last run" in fast.stdout
    assert "loaded: []" in fast.stdout, fast.stdout  # none of the heavy imports
    said = [ln for ln in full.stdout.splitlines() if "reused" in ln and "stages" not in ln]
    assert len(said) == 3 and all(ln.split() == f.split() for ln, f in zip(said, fast.stdout.splitlines())), \
        (said, fast.stdout)

    from trtflow.flows.run_identity import run_identity
    name = run_identity(str(workdir / "pipeline.yaml"))[0]
    deadline = time.monotonic() + 60  # posted by a detached process: the answer did not wait for it
    while len(_cached_runs(prefect_api, name)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(_cached_runs(prefect_api, name)) == 2, "the full and the fast no-op run, each a Cached flow run"

    def changed(what: str, ran: int) -> None:
        again = _run(workdir, env)
        assert f"3 stages ({ran} ran" in again.stdout and "since the last run" not in again.stdout, (what, again.stdout)
        _run(workdir, env)  # the full way finds everything in place: recorded again
        assert "nothing changed since the last run" in _run(workdir, env).stdout, what

    np.save(workdir / "data" / "2.npy", rng.uniform(0, 1, (1, 3, 48, 192)).astype(np.float32))
    changed("a data file added", 1)  # precision's
    (workdir / "mine.py").write_text(MINE.format(tag="two"))  # the pipeline's own code
    changed("the pipeline's own function edited", 2)  # a and b (fp16 reads the model itself)
    model = workdir / "models" / "cls.onnx"
    import onnx
    proto = onnx.load(str(model))
    proto.doc_string = "another export"
    onnx.save(proto, str(model))  # the model itself
    changed("the model", 3)
    store = workdir / ".trtflow"
    report = store / "b" / json.loads((store / "b" / "last.json").read_text())["key"] / "report.json"
    report.write_text('{"bytes": 0}')  # a published file damaged: the full way finds it and runs the stage again
    again = _run(workdir, env)
    assert "since the last run" not in again.stdout and "1 ran" in again.stdout, again.stdout + again.stderr
    # the environment the keys read (a setting); an unrelated variable changes nothing
    _run(workdir, env)
    assert "since the last run" in _run(workdir, {**env, "UNRELATED_VARIABLE": "1"}).stdout
    assert "since the last run" not in _run(workdir, {**env, "TRTFLOW_SERVER_PATIENCE": "301"}).stdout


def test_a_no_op_is_posted_to_the_server_a_prefect_profile_names(tmp_path, monkeypatch):
    """`prefect config set PREFECT_API_URL=...` keeps the URL in the active profile, not in the environment: the
    no-op's poster (which does not import Prefect) reads it there, as Prefect would."""
    from trtflow.flows import noop

    for name in ("PREFECT_API_URL", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    monkeypatch.setenv("TRTFLOW_PREFECT_SERVER", "ephemeral")  # no background server to fall back on
    assert noop._api_url() is None
    (tmp_path / "profiles.toml").write_text('active = "fleet"\n[profiles.fleet]\n'
                                            'PREFECT_API_URL = "http://10.0.0.7:4200/api"\n[profiles.other]\n'
                                            'PREFECT_API_URL = "http://other:4200/api"\n')
    assert noop._api_url() == "http://10.0.0.7:4200/api"
    monkeypatch.setenv("PREFECT_PROFILE", "other")
    assert noop._api_url() == "http://other:4200/api"
    monkeypatch.setenv("PREFECT_API_URL", "http://from-env:4200/api")
    assert noop._api_url() == "http://from-env:4200/api"
    (tmp_path / "profiles.toml").write_text("active = [not toml")
    monkeypatch.delenv("PREFECT_API_URL")
    assert noop._api_url() is None
