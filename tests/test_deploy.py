"""Deployments end to end, as a fleet runs them: a real Prefect server (SQLite) on loopback (the test run's, see
conftest.py), process workers standing for machines (each its own name, work queue, environment record and cache of
a shared S3 store on moto's server), each machine's watcher deployed from the prefect.yaml `trtflow init-deploy`
writes for it, its nightly cron scheduled by the server's scheduler, triggered by the custom event that
`trtflow check-env` sends after a TensorRT change on that machine.

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
from contextlib import ExitStack, contextmanager
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


def test_a_change_on_one_machine_rebuilds_on_that_machine_and_advances_its_record(tmp_path, prefect_api):
    """Two machines of one GPU kind (two process workers, each with its own name, environment record and cache of
    one S3 store on moto's server) each deploy their watcher with `trtflow init-deploy`. TensorRT changes on
    'alpha' only: its check-env sends the event, the trigger starts alpha's deployment, alpha's worker rebuilds
    the pipeline built under the old TensorRT, and alpha's record advances after it; 'beta' runs nothing. A third
    machine with no deployment keeps its change pending: the next check-env sends it again."""
    from tests.test_shared_store import _moto_server

    api = prefect_api
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TRTFLOW_", "AWS_"))}
    import s3fs
    with _moto_server(tmp_path) as s3:
        s3fs.S3FileSystem(key=s3["AWS_ACCESS_KEY_ID"], secret=s3["AWS_SECRET_ACCESS_KEY"],
                          endpoint_url=s3["AWS_ENDPOINT_URL"], skip_instance_cache=True).mkdir("fleet")
        _two_machines(tmp_path, api, {**base, **s3})


def _two_machines(tmp_path: Path, api: str, base: dict[str, str]) -> None:
    repos = tmp_path / "repos"
    (repos / "stale" / "models").mkdir(parents=True)
    shutil.copy(PPOCR, repos / "stale" / "models" / "cls.onnx")
    (repos / "stale" / "pipeline.yaml").write_text(PIPE.format(name="stale") + "artifacts: s3://fleet/store\n")
    old_trt = tmp_path / "old-tensorrt"  # a machine before the upgrade
    (old_trt / "tensorrt").mkdir(parents=True)
    (old_trt / "tensorrt" / "__init__.py").write_text("__version__ = '10.0.1.6'\n")

    def machine(name: str, upgraded: bool) -> dict[str, str]:
        (tmp_path / name).mkdir(exist_ok=True)
        return {**base, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api,
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO",
                "PYTHONPATH": str(ROOT) if upgraded else f"{old_trt}{os.pathsep}{ROOT}",
                "TRTFLOW_MACHINE": name, "TRTFLOW_STATE_DIR": str(tmp_path / name / "state"),
                "TRTFLOW_CACHE_DIR": str(tmp_path / name / "cache"), "TRTFLOW_PREFECT_SERVER": "ephemeral",
                "TRTFLOW_TEST_CALLS": str(tmp_path / name / "calls.txt"), "TRTFLOW_MODELS": str(repos)}
    old = {m: machine(m, upgraded=False) for m in ("alpha", "beta", "gamma")}
    trtflow = [sys.executable, "-m", "trtflow.flows.cli"]
    prefect = [sys.executable, "-m", "prefect"]
    logs = [Path(os.environ["PREFECT_HOME"]) / "server.log", tmp_path / "alpha.log", tmp_path / "beta.log"]

    # before the upgrade: the pipeline is built (published to the shared store) and each machine recorded
    done = _cli(trtflow + ["run", "repos/stale/pipeline.yaml"], old["alpha"], tmp_path)
    assert done.returncode == 0, done.stderr
    for m in ("alpha", "beta", "gamma"):
        done = _cli(trtflow + ["check-env"], old[m], tmp_path)
        assert done.returncode == 0 and "recorded" in done.stdout, done.stdout + done.stderr
    (tmp_path / "alpha" / "calls.txt").unlink()

    # each machine deploys its own watcher, labelled as its check-env labels its events
    done = _cli(prefect + ["work-pool", "create", f"trtflow-{KIND}", "--type", "process"], old["alpha"], repos)
    assert done.returncode == 0, done.stdout + done.stderr
    deployments = {}
    for m in ("alpha", "beta"):
        done = _cli(trtflow + ["init-deploy", "--gpu-kind", KIND], old[m], repos)
        assert done.returncode == 0, done.stdout + done.stderr
        done = _cli(prefect + ["--no-prompt", "deploy", "--all", "--prefect-file", f"prefect-{m}.yaml"], old[m],
                    repos)
        assert done.returncode == 0, done.stdout + done.stderr
        (deployments[m],) = _api(api, "post", "/deployments/filter",
                                 {"deployments": {"name": {"any_": [f"watch-{m}"]}}})
        assert deployments[m]["work_queue_name"] == m
    dep = deployments["alpha"]
    assert dep["schedules"] and dep["schedules"][0]["schedule"]["cron"] == "0 3 * * *"

    # the server's scheduler makes the nightly runs (SQLAlchemy 2.1 broke this: `Can't evaluate bulk DML`)
    def nightly():
        runs = _api(api, "post", "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [dep["id"]]}}})
        return [r for r in runs if r.get("auto_scheduled") and r["state_type"] == "SCHEDULED"]
    scheduled = _until("the scheduler's runs of the nightly cron", nightly, 90, logs)
    assert all(r["expected_start_time"][11:16] == "03:00" for r in scheduled), scheduled

    def triggered(m: str):
        runs = _api(api, "post", "/flow_runs/filter",
                    {"flow_runs": {"deployment_id": {"any_": [deployments[m]["id"]]}}})
        return [r for r in runs if not r.get("auto_scheduled")]  # the nightly cron's, should the test run at 03:00

    new_alpha = machine("alpha", upgraded=True)
    workers = {"alpha": new_alpha, "beta": old["beta"]}  # TensorRT changed on alpha only
    with ExitStack() as running:
        for m, env in workers.items():
            running.enter_context(_started(prefect + ["worker", "start", "--pool", f"trtflow-{KIND}", "--work-queue",
                                                      m, "--type", "process", "--limit", "1"],
                                           {**env, "PREFECT_WORKER_QUERY_SECONDS": "1"}, tmp_path / f"{m}.log",
                                           tmp_path))
        done = _cli(trtflow + ["check-env"], new_alpha, tmp_path)
        assert done.returncode == 3 and "tensorrt.version \"10.0.1.6\" ->" in done.stdout, done.stdout + done.stderr
        done = _cli(trtflow + ["check-env"], old["beta"], tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr

        def finished():
            return [r for r in triggered("alpha") if r["state_type"] in ("COMPLETED", "FAILED", "CRASHED",
                                                                          "CANCELLED")]
        (run,) = _until("alpha's triggered watcher run to finish", finished, 300, logs, every=2)
        assert run["state_type"] == "COMPLETED", json.dumps(run["state"], indent=1)
        assert (run.get("created_by") or {}).get("type") == "AUTOMATION", "started by the event's trigger"
        assert run["parameters"]["machine"] == "alpha" and "tensorrt.version" in str(run["parameters"]["changed"])
        worker_log = (tmp_path / "alpha.log").read_text(errors="replace")
        assert run["id"] in worker_log, "alpha's worker ran it"
        assert run["id"] not in (tmp_path / "beta.log").read_text(errors="replace")

    assert (tmp_path / "alpha" / "calls.txt").read_text().split() == ["copy_model"], "alpha rebuilt the stage"
    assert not (tmp_path / "beta" / "calls.txt").exists() and triggered("beta") == [], "beta ran nothing"
    done = _cli(trtflow + ["check-env"], new_alpha, tmp_path)
    assert done.returncode == 0 and "unchanged" in done.stdout, "alpha's record advanced after the rebuild"
    done = _cli(trtflow + ["plan", "repos/stale/pipeline.yaml", "--check"], new_alpha, tmp_path)
    assert done.returncode == 0, done.stdout

    # a machine whose change reaches no deployment: sent, not recorded, sent again by the next check
    new_gamma = machine("gamma", upgraded=True)
    for _ in range(2):
        done = _cli(trtflow + ["check-env"], new_gamma, tmp_path)
        assert done.returncode == 3 and "sent trtflow.environment.changed for machine gamma" in done.stdout, \
            done.stdout + done.stderr


def _api(api: str, method: str, path: str, body: dict):
    response = getattr(httpx, method)(f"{api}{path}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()
