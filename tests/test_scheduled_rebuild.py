"""Issue #50's scenario, end to end: a pipeline rebuilt on a schedule for months, right over time.

One machine ('nightly-box') of a fleet, as `docs/guides/fleet.md` sets it up: its watcher deployment made by `trtflow
init-deploy` and `prefect deploy` on the test run's real Prefect server, a process worker on its work queue, the
pipeline's store on S3 (moto's server). The deployment is run as its nightly schedule runs it (a flow run created
from the deployment), five times:

1. first run: prepare, build and release run; version 1 is released and announced;
2. and 3. nothing changed: every stage is reused, version 1 stays the latest, no release event;
4. the driver changed (a stand-in `nvidia-smi` reports another version: it moves the environment fingerprint as an
   upgrade would): the build runs again, its new engine ships as version 2 with the same serving contract, one
   event;
5. trtflow's code changed (the worker runs a copy of the package in which `stages/onnx/composition.py` was edited, its
   lock refreshed with `--rerun`): exactly the stages whose kind imports that module run again (release, here),
   and `plan` names the file.

No GPU here: the engines are TensorRT-RTX's, built on the CPU; no engine runs.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.assets import PPOCR
from tests.processes import _cli, _started, _until
from tests.test_new_kind import _copy_source
from tests.test_quickstart import NEW_DRIVER, OLD_DRIVER, _smi

KIND = "nightly"
MACHINE = "nightly-box"  # not test_deploy.py's machines: the test run's Prefect server holds both tests' deployments
PIPELINE = """version: 1
name: cls
model: models/cls.onnx
artifacts: s3://fleet/store
stages:
  prepare: {kind: prepare, preflight: off}
  build:
    kind: build
    profiles: {lines: {x: {min: [1, 3, 48, 48], opt: [8, 3, 48, 192], max: [32, 3, 48, 640]}}}
  release: {kind: release, select: {require: built, prefer: size}}
"""
EDITED = "stages/onnx/composition.py"  # a fix to the compute count by precision, which the release orders by


def _api(api: str, method: str, path: str, body: dict | None = None):
    """The Prefect server's answer; a 503 or a timeout (its SQLite database locked while workers write, on a busy
    machine: issue #53) is asked again, a few times."""
    for attempt in range(10):
        try:
            response = httpx.request(method.upper(), f"{api}{path}", json=body, timeout=60)
        except httpx.TimeoutException:
            if attempt == 9:
                raise
            continue
        if response.status_code != 503 or attempt == 9:
            response.raise_for_status()
            return response.json()
        time.sleep(0.5)


@pytest.mark.slow
def test_a_scheduled_pipeline_reuses_rebuilds_and_reruns_exactly_what_changed(tmp_path, prefect_api,
                                                                             tensorrt_backend):
    import s3fs

    from tests.test_shared_store import _moto_server
    with _moto_server(tmp_path) as s3:
        s3fs.S3FileSystem(key=s3["AWS_ACCESS_KEY_ID"], secret=s3["AWS_SECRET_ACCESS_KEY"],
                          endpoint_url=s3["AWS_ENDPOINT_URL"], skip_instance_cache=True).mkdir("fleet")
        _scenario(tmp_path, prefect_api, s3)


def _scenario(tmp: Path, api: str, s3: dict[str, str]) -> None:
    repos = tmp / "repos"
    (repos / "cls" / "models").mkdir(parents=True)
    shutil.copy(PPOCR, repos / "cls" / "models" / "cls.onnx")
    (repos / "cls" / "pipeline.yaml").write_text(PIPELINE)
    package = _copy_source(tmp / "package")  # the trtflow this machine runs (edited in step 5)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nif [ -n "$1" ]; then cat "{bin_dir}/smi.csv"; else cat "{bin_dir}/smi.txt"; fi\n')
    smi.chmod(0o755)
    _smi(bin_dir, OLD_DRIVER)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TRTFLOW_", "AWS_"))}
    env = {**base, **s3, "PREFECT_HOME": str(tmp / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO",
           "PATH": f"{bin_dir}{os.pathsep}{base.get('PATH', '')}", "PYTHONPATH": str(package),
           "TRTFLOW_MACHINE": MACHINE, "TRTFLOW_STATE_DIR": str(tmp / "state"),
           "TRTFLOW_CACHE_DIR": str(tmp / "cache"), "TRTFLOW_PREFECT_SERVER": "ephemeral",
           "TRTFLOW_MODELS": str(repos)}
    trtflow = [sys.executable, "-m", "trtflow.flows.cli"]
    prefect = [sys.executable, "-m", "prefect"]
    worker_log = tmp / "worker.log"
    logs = [worker_log]

    _api(api, "post", "/work_pools/", {"name": f"trtflow-{KIND}", "type": "process"})  # `prefect work-pool create`
    done = _cli(trtflow + ["init-deploy", "--gpu-kind", KIND], env, repos)
    assert done.returncode == 0, done.stdout + done.stderr
    done = _cli(prefect + ["--no-prompt", "deploy", "--all", "--prefect-file", f"prefect-{MACHINE}.yaml"], env, repos)
    assert done.returncode == 0, done.stdout + done.stderr
    (deployment,) = _api(api, "post", "/deployments/filter",
                         {"deployments": {"name": {"any_": [f"watch-{MACHINE}"]}}})

    made: list[str] = []
    why: list[str] = []

    def scheduled_run() -> str:
        """One run of the deployment, as its schedule makes it; the watcher's line for the pipeline."""
        made.append(f"scheduled-{len(made)}")  # a request asked again makes no second run
        run = _api(api, "post", f"/deployments/{deployment['id']}/create_flow_run", {"idempotency_key": made[-1]})

        def finished():
            state = _api(api, "get", f"/flow_runs/{run['id']}")
            return state if state["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None
        state = _until("the deployment's run to finish", finished, 300, logs, every=1)
        assert state["state_type"] == "COMPLETED", state["state"]

        def said() -> list[str]:  # the run's logs reach the server after its state may
            lines = [e["message"] for e in _api(api, "post", "/logs/filter",
                                                {"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200})]
            mine = [m.split(": ", 1)[1] for m in lines if m.startswith(str(repos / "cls" / "pipeline.yaml") + ": ")]
            return mine if any(m.startswith(("up to date", "ran ")) for m in mine) else []
        lines = _until("the watcher's lines for the pipeline", said, 30, logs, every=0.5)
        why[:] = [m for m in lines if " stale (" in m]  # the first stale stage and why (plan's reason)
        (line,) = [m for m in lines if m.startswith(("up to date", "ran "))]
        return line

    def releases() -> list[dict]:
        answer = _api(api, "post", "/events/filter", {"filter": {
            "event": {"name": ["trtflow.release.created"]},
            "resource": {"id": ["trtflow.release.cls.release.native"]}}, "limit": 50})
        return sorted((e["payload"] for e in answer["events"]), key=lambda p: p["version"])

    def latest() -> str:
        done = _cli(trtflow + ["output", "cls/pipeline.yaml", "release"], env, repos)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stderr.strip()

    with _started(prefect + ["worker", "start", "--pool", f"trtflow-{KIND}", "--work-queue", MACHINE, "--type",
                             "process", "--limit", "1"], {**env, "PREFECT_WORKER_QUERY_SECONDS": "1"}, worker_log,
                  tmp):
        # 1. the first run builds and releases version 1
        assert scheduled_run() == "ran prepare, build, release; reused nothing"
        first = _until("the release event of version 1", releases, 30, logs, every=0.5)
        assert [e["version"] for e in first] == [1]
        # 2. and 3. nothing changed: everything reused, version 1 stays the latest, nothing announced
        for _ in range(2):
            assert scheduled_run() == "up to date (3 stages)"
        assert latest() == "cls version 1 for target native: the latest released"

        # 4. the driver changed: the engine is rebuilt and ships as version 2 under the same contract
        _smi(bin_dir, NEW_DRIVER)
        assert scheduled_run() == "ran build, release; reused prepare"
        assert len(why) == 1 and why[0].startswith("build, release stale (environment changed: ") and \
            NEW_DRIVER in why[0], why
        second = _until("the release event of version 2", lambda: len(releases()) == 2 and releases(), 30, logs,
                        every=0.5)
        assert [e["version"] for e in second] == [1, 2], "runs 2 and 3 announced nothing"
        assert second[1]["previous_version"] == 1
        assert second[1]["contract_changes"] == [] and second[1]["engine_sha256"] != second[0]["engine_sha256"]

        # 5. trtflow's code changed: a fix to the compute count, its lock refreshed as a re-run
        from trtflow.flows import code_lock
        importers = {k for k, entry in code_lock.load().kinds.items() if EDITED in entry.files}
        assert importers & {"prepare", "build", "release"} == {"release"}, importers
        edited = package / "trtflow" / EDITED
        edited.write_text(edited.read_text() + "\n# a fix that changes what the count gives\n")
        done = _cli([sys.executable, "-m", "trtflow.flows.code_lock", "--rerun", EDITED], env, repos)
        assert done.returncode == 0 and done.stdout.strip().endswith(f"re-keys {', '.join(sorted(importers))}"), \
            done.stdout + done.stderr
        assert scheduled_run() == "ran release; reused prepare, build"
        assert why == [f"release stale (code changed ({EDITED}))"], why
        assert latest() == "cls version 2 for target native: the latest released"
        assert [e["version"] for e in releases()] == [1, 2], "the same engine: version 2 again, not announced"
