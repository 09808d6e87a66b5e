"""Deployments end to end, as a fleet runs them: a real Prefect server (SQLite) on loopback (the test run's, see
conftest.py), a process worker, the watcher deployed from the shipped prefect.yaml (`trtflow init-deploy`), its
nightly cron scheduled by the server's scheduler, triggered by the custom event that `trtflow check-env` sends after
a TensorRT change. The pipeline built under the old TensorRT is rebuilt; the one already built under the current
environment is reused.

The old TensorRT is a stand-in `tensorrt` package on PYTHONPATH that reports another version (no second TensorRT
installs here): it changes the fingerprint exactly as an upgrade would, which is what this test is about.
Every wait is bounded; every process started is stopped by its process group ID.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.assets import PPOCR

ROOT = Path(__file__).resolve().parent.parent
PIPE = """version: 1
name: {name}
model: models/cls.onnx
stages:
  engine: {{kind: "tests.stage_fns:copy_model", outputs: {{model: onnx}}, env_dependent: true}}
"""
KIND = "e2e"


@contextmanager
def _started(cmd: list[str], env: dict[str, str], log: Path, cwd: Path):
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue


def _until(what: str, predicate, timeout: float, logs: list[Path], every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")


def _cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_watcher_deployment_rebuilds_what_the_environment_change_made_stale(tmp_path, prefect_api):
    api = prefect_api
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env = {**base, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO",
           "PYTHONPATH": str(ROOT), "TRTFLOW_STATE_DIR": str(tmp_path / "state"),
           "TRTFLOW_TEST_CALLS": str(tmp_path / "calls.txt"), "TRTFLOW_GPU_KIND": KIND,
           "TRTFLOW_MODELS": str(tmp_path / "repos")}
    old_trt = tmp_path / "old-tensorrt"  # the machine before the upgrade
    (old_trt / "tensorrt").mkdir(parents=True)
    (old_trt / "tensorrt" / "__init__.py").write_text("__version__ = '10.0.1.6'\n")
    before = {**env, "PYTHONPATH": f"{old_trt}{os.pathsep}{ROOT}"}

    repos = tmp_path / "repos"
    for name in ("stale", "fresh"):
        (repos / name / "models").mkdir(parents=True)
        shutil.copy(PPOCR, repos / name / "models" / "cls.onnx")
        (repos / name / "pipeline.yaml").write_text(PIPE.format(name=name))
    trtflow = [sys.executable, "-m", "trtflow.flows.cli"]
    prefect = [sys.executable, "-m", "prefect"]
    logs = [Path(os.environ["PREFECT_HOME"]) / "server.log", tmp_path / "worker.log"]
    # before the upgrade: 'stale' is built, and this machine's environment is recorded
    done = _cli(trtflow + ["run", "repos/stale/pipeline.yaml"], before, tmp_path)
    assert done.returncode == 0, done.stderr
    done = _cli(trtflow + ["check-env"], before, tmp_path)
    assert done.returncode == 0 and "recorded" in done.stdout, done.stdout + done.stderr
    # after it: 'fresh' is built under the new environment
    done = _cli(trtflow + ["run", "repos/fresh/pipeline.yaml"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    fresh_manifest = next((repos / "fresh" / ".trtflow" / "engine").glob("*/manifest.json"))
    fresh_mtime = fresh_manifest.stat().st_mtime_ns
    (tmp_path / "calls.txt").unlink()

    # the shipped prefect.yaml, deployed as a fleet would
    assert _cli(trtflow + ["init-deploy", "-o", str(repos / "prefect.yaml")], env, tmp_path).returncode == 0
    done = _cli(prefect + ["work-pool", "create", f"trtflow-{KIND}", "--type", "process"], env, repos)
    assert done.returncode == 0, done.stdout + done.stderr
    done = _cli(prefect + ["--no-prompt", "deploy", "--all"], env, repos)
    assert done.returncode == 0, done.stdout + done.stderr
    deployment = _api(api, "post", "/deployments/filter", {"deployments": {"name": {"any_": [f"watch-{KIND}"]}}})
    (dep,) = deployment
    assert dep["schedules"] and dep["schedules"][0]["schedule"]["cron"] == "0 3 * * *"

    # the server's scheduler makes the nightly runs (SQLAlchemy 2.1 broke this: `Can't evaluate bulk DML`)
    def nightly():
        runs = _api(api, "post", "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [dep["id"]]}}})
        return [r for r in runs if r.get("auto_scheduled") and r["state_type"] == "SCHEDULED"]
    scheduled = _until("the scheduler's runs of the nightly cron", nightly, 90, logs)
    assert all(r["expected_start_time"][11:16] == "03:00" for r in scheduled), scheduled
    automations = _api(api, "post", "/automations/filter", {})
    assert any(a["trigger"].get("expect") == ["trtflow.environment.changed"] and
               a["trigger"].get("match", {}).get("trtflow.gpu-kind") == KIND for a in automations), automations

    worker_env = {**env, "PREFECT_WORKER_QUERY_SECONDS": "1"}
    with _started(prefect + ["worker", "start", "--pool", f"trtflow-{KIND}", "--type", "process",
                             "--limit", "1"], worker_env, logs[1], tmp_path):
        # the upgrade is noticed: the event is sent, the trigger starts the watcher, the worker runs it
        done = _cli(trtflow + ["check-env"], env, tmp_path)
        assert done.returncode == 3, done.stdout + done.stderr
        assert "tensorrt.version \"10.0.1.6\" ->" in done.stdout

        def finished():
            runs = _api(api, "post", "/flow_runs/filter",
                        {"flow_runs": {"deployment_id": {"any_": [dep["id"]]}}})
            return [r for r in runs if r["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
                    and not r.get("auto_scheduled")]  # the nightly cron's run, should the test run at 03:00
        (run,) = _until("the triggered watcher run to finish", finished, 300, logs, every=2)
        assert run["state_type"] == "COMPLETED", json.dumps(run["state"], indent=1)
        assert (run.get("created_by") or {}).get("type") == "AUTOMATION", "started by the event's trigger"

        def rebuilt():  # the event persister writes in batches
            found = _api(api, "post", "/events/filter", {"filter": {"event": {"prefix": ["trtflow.stage."]}}})
            return [e["resource"]["prefect.resource.id"] for e in found["events"]]
        assert _until("the watcher's event", rebuilt, 60, logs) == ["trtflow.stage.stale.engine"]

    calls = (tmp_path / "calls.txt").read_text().split()
    assert calls == ["copy_model"], "exactly one stage re-ran: the stale pipeline's"
    assert fresh_manifest.stat().st_mtime_ns == fresh_mtime, "the up-to-date pipeline was reused, not rebuilt"
    for name in ("stale", "fresh"):
        done = _cli(trtflow + ["plan", f"repos/{name}/pipeline.yaml", "--check"], env, tmp_path)
        assert done.returncode == 0, f"{name}: {done.stdout}"


def _api(api: str, method: str, path: str, body: dict):
    response = getattr(httpx, method)(f"{api}{path}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()
