"""A fleet on real parts (issue #53): one Prefect server on a real PostgreSQL (`trtflow server start --database`),
four process workers standing for four machines of two GPU kinds (two work pools), one S3 store on moto's server.

Each machine has its own name, stand-in `nvidia-smi` (its GPU and driver: the documented CSV query and banner, which
move the environment fingerprint exactly as a real GPU and driver would; no engine runs either way), state
directory, store cache and work queue, and deploys its watcher with `trtflow init-deploy --limits` and `prefect
deploy` as the fleet guide says. The pipelines' stages stand in for an engine build (its bytes depend on the GPU and
driver the fingerprint reads) and a release (the next version of the model for the machine's GPU kind, read from the
store's ledger and claimed before the result is published: tests/stage_fns.py `fake_engine`, `ship_version`).

Checked: the first builds, four machines at once, give each version to one engine; a driver change on one machine
rebuilds that machine's stale engines only, and the other three reuse; the GPU tag limit holds across two pipelines
run at once on one machine (from the task runs' start and end times in Prefect's API); a machine that dies in the
middle of a stage (every process of it killed) leaves nothing half-published, and its next run finishes the work.
Every wait is bounded; every process started is stopped."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.assets import PPOCR
from tests.processes import _api, _cli, _started, _until
from tests.test_server import _kill_recorded

ROOT = Path(__file__).resolve().parent.parent
TRTFLOW = [sys.executable, "-m", "trtflow.flows.cli"]
PREFECT = [sys.executable, "-m", "prefect"]
GPUS = {"m1": "NVIDIA RTX A4000", "m2": "NVIDIA RTX A4000", "m3": "NVIDIA L4", "m4": "NVIDIA L4"}
KINDS = {"NVIDIA RTX A4000": "nvidia-rtx-a4000", "NVIDIA L4": "nvidia-l4"}
OLD_DRIVER, NEW_DRIVER = "550.54.15", "560.35.03"
PIPELINE = """version: 1
name: {name}
model: models/cls.onnx
artifacts: s3://fleet/store
stages:
  engine:
    kind: "tests.stage_fns:fake_engine"
    outputs: {{engine: file}}
    env_dependent: true
    params: {{model: {name}, seconds: 2, marks: '{marks}'}}
  ship:
    kind: "tests.stage_fns:ship_version"
    inputs: {{engine: engine.engine}}
    outputs: {{release: json}}
    params: {{model: {name}, ledger: "s3://fleet/store/shared", marks: '{marks}'}}
"""
DONE = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


class Fleet:
    """The machines' environments, their stand-ins and what they record."""

    def __init__(self, tmp: Path, api: str, s3: dict[str, str]):
        self.tmp, self.api = tmp, api
        self.repos, self.marks = tmp / "repos", tmp / "marks"
        self.marks.mkdir()
        self.base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TRTFLOW_", "AWS_"))}
        self.s3 = s3
        self.env: dict[str, dict[str, str]] = {}
        for m, gpu in GPUS.items():
            self.add(m, gpu)
        self.logs = [tmp / f"{m}.log" for m in GPUS]
        self.deployments: dict[str, dict] = {}
        self.seen: dict[str, set[str]] = {m: set() for m in GPUS}  # flow runs already looked at, per machine
        self.running: dict[str, subprocess.Popen] = {}  # each machine's worker

    def add(self, m: str, gpu: str) -> None:
        """Machine `m`: its environment and its stand-in nvidia-smi (`gpu` on the old driver)."""
        tmp = self.tmp
        (tmp / m / "bin").mkdir(parents=True)
        self.smi(m, gpu, OLD_DRIVER)
        self.env[m] = {**self.base, **self.s3, "PREFECT_API_URL": self.api,
                       "PREFECT_HOME": str(tmp / m / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                       "PREFECT_LOGGING_LEVEL": "INFO", "PATH": f"{tmp / m / 'bin'}{os.pathsep}{self.base['PATH']}",
                       "PYTHONPATH": str(ROOT), "TRTFLOW_MACHINE": m, "TRTFLOW_STATE_DIR": str(tmp / m / "state"),
                       "TRTFLOW_CACHE_DIR": str(tmp / m / "cache"), "TRTFLOW_TEST_CALLS": str(tmp / m / "calls"),
                       "TRTFLOW_MODELS": str(self.repos)}

    def smi(self, m: str, gpu: str, driver: str) -> None:
        """Machine `m`'s stand-in nvidia-smi: `gpu` on `driver`."""
        bin_dir = self.tmp / m / "bin"
        (bin_dir / "smi.csv").write_text(f"{gpu}, 8.9, {driver}, 24564\n")
        (bin_dir / "smi.txt").write_text(f"| NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: 12.4 |\n")
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f'#!/bin/sh\nif [ -n "$1" ]; then cat {shlex.quote(str(bin_dir / "smi.csv"))}; '
                       f'else cat {shlex.quote(str(bin_dir / "smi.txt"))}; fi\n')
        smi.chmod(0o755)

    def calls(self, m: str) -> list[str]:
        path = self.tmp / m / "calls"
        return path.read_text().split() if path.exists() else []

    def clear_calls(self) -> None:
        for m in GPUS:
            (self.tmp / m / "calls").unlink(missing_ok=True)

    def runs_of(self, deployment: dict) -> list[dict]:
        return _api(self.api, "post", "/flow_runs/filter",
                    {"flow_runs": {"deployment_id": {"any_": [deployment["id"]]}}})

    def ended(self, deployment: dict, besides: set[str]) -> list[dict]:
        return [r for r in self.runs_of(deployment) if r["id"] not in besides and r["state_type"] in DONE]

    # --- the scenario's steps (tests/test_fleet.py _fleet) ------------------------------------------------------

    def deploy(self) -> None:
        """The fleet guide's steps: a work pool per GPU kind; on each machine check-env, `init-deploy --limits`,
        `prefect deploy`."""
        for kind in sorted(set(KINDS.values())):
            done = _cli(PREFECT + ["work-pool", "create", f"trtflow-{kind}", "--type", "process"], self.env["m1"],
                        self.tmp)
            assert done.returncode == 0, done.stdout + done.stderr
        for m in GPUS:
            done = _cli(TRTFLOW + ["check-env"], self.env[m], self.tmp)
            assert done.returncode == 0 and "recorded" in done.stdout, done.stdout + done.stderr
            done = _cli(TRTFLOW + ["init-deploy", "--limits"], self.env[m], self.repos)
            assert done.returncode == 0 and f"(GPU kind {KINDS[GPUS[m]]})" in done.stdout \
                and f"gpu:{m}:0" in done.stdout, done.stdout + done.stderr
            done = _cli(PREFECT + ["--no-prompt", "deploy", "--all", "--prefect-file", f"prefect-{m}.yaml"],
                        self.env[m], self.repos)
            assert done.returncode == 0, done.stdout + done.stderr
            (self.deployments[m],) = _api(self.api, "post", "/deployments/filter",
                                          {"deployments": {"name": {"any_": [f"watch-{m}"]}}})
            assert self.deployments[m]["work_queue_name"] == m

    def nightly_scheduled(self) -> None:
        """The server's scheduler made each watcher's nightly runs (SQLAlchemy 2.1 broke it: `Can't evaluate bulk
        DML`), looked at once the first builds are done, by when its loop has come round."""
        dep = self.deployments["m1"]
        assert dep["schedules"] and dep["schedules"][0]["schedule"]["cron"] == "0 3 * * *"

        def nightly():
            return [r for r in self.runs_of(dep) if r.get("auto_scheduled") and r["state_type"] == "SCHEDULED"]
        scheduled = _until("the scheduler's runs of the nightly cron", nightly, 90, self.logs)
        assert all(r["expected_start_time"][11:16] == "03:00" for r in scheduled), scheduled

    def start_worker(self, m: str, log: str = ""):
        return _started(PREFECT + ["worker", "start", "--pool", f"trtflow-{KINDS[GPUS[m]]}", "--work-queue", m,
                                   "--type", "process", "--limit", "1"],
                        {**self.env[m], "PREFECT_WORKER_QUERY_SECONDS": "1"}, self.tmp / f"{log or m}.log", self.tmp)

    def run_watchers(self, machines: list[str]) -> dict[str, dict]:
        for m in machines:
            done = _cli(PREFECT + ["deployment", "run", f"trtflow-watch/watch-{m}"], self.env[m], self.repos)
            assert done.returncode == 0, done.stdout + done.stderr
        return self.finish(machines)

    def finish(self, machines: list[str]) -> dict[str, dict]:
        """Each machine's next watcher run, once it ended Completed."""
        runs = {}
        for m in machines:
            (runs[m],) = _until(f"{m}'s watcher run to end", lambda m=m: self.ended(self.deployments[m], self.seen[m]),
                                300, self.logs, every=2)
            assert runs[m]["state_type"] == "COMPLETED", (m, json.dumps(runs[m]["state"], indent=1))
            self.seen[m].add(runs[m]["id"])
        return runs

    def first_builds(self, fs) -> None:
        """Four machines at once: per GPU kind each pipeline's engine is built and shipped as version 1."""
        self.run_watchers(list(GPUS))
        for kind_machines in (("m1", "m2"), ("m3", "m4")):
            built = [c for m in kind_machines for c in self.calls(m) if c == "fake_engine"]
            assert 2 <= len(built) <= 4, {m: self.calls(m) for m in GPUS}  # two pipelines; a race may build twice
        ledger = _ledger(fs)
        assert sorted(ledger) == [(p, k) for p in ("p1", "p2") for k in sorted(set(KINDS.values()))], ledger
        assert all(list(v) == [1] for v in ledger.values()), {str(k): v for k, v in ledger.items()}

    def new_driver_on_one_machine(self, fs) -> None:
        """A new driver on m1 only: its check-env's event starts its watcher, which rebuilds m1's engines and ships
        them as version 2, and then advances m1's record; the other three machines' watchers, run at the same time,
        find nothing stale and reuse."""
        self.clear_calls()
        self.smi("m1", GPUS["m1"], NEW_DRIVER)
        done = _cli(TRTFLOW + ["check-env"], self.env["m1"], self.tmp)
        assert done.returncode == 3 and "driver" in done.stdout, done.stdout + done.stderr
        self.run_watchers(["m2", "m3", "m4"])
        (run,) = _until("m1's triggered watcher run", lambda: self.ended(self.deployments["m1"], self.seen["m1"]),
                        300, self.logs, every=2)
        assert run["state_type"] == "COMPLETED" and (run.get("created_by") or {}).get("type") == "AUTOMATION", run
        assert run["parameters"]["machine"] == "m1" and "driver" in str(run["parameters"]["changed"])
        self.seen["m1"].add(run["id"])
        assert sorted(self.calls("m1")) == ["fake_engine", "fake_engine", "ship_version", "ship_version"]
        assert [self.calls(m) for m in ("m2", "m3", "m4")] == [[], [], []], "the other three reused"
        ledger = _ledger(fs)
        a4000 = KINDS[GPUS["m1"]]
        for p in ("p1", "p2"):
            assert sorted(ledger[p, a4000]) == [1, 2] and ledger[p, a4000][1]["owner"] != ledger[p, a4000][2]["owner"]
        done = _cli(TRTFLOW + ["check-env"], self.env["m1"], self.tmp)
        assert done.returncode == 0 and "unchanged" in done.stdout, "m1's record advanced after the rebuild"

    def two_pipelines_on_one_gpu(self) -> None:
        """Two pipelines at once on m2: their GPU stages take the machine's GPU one at a time (the tag limit
        `init-deploy --limits` made), as the task runs' start and end times in Prefect's API show."""
        self.clear_calls()
        both = [subprocess.Popen(TRTFLOW + ["run", f"repos/{p}/pipeline.yaml", "--force", "engine"],
                                 env=self.env["m2"], cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for p in ("p1", "p2")]
        outs = [p.communicate(timeout=300)[0] for p in both]
        assert [p.returncode for p in both] == [0, 0], outs
        assert self.calls("m2").count("fake_engine") == 2, self.calls("m2")
        tagged = _api(self.api, "post", "/task_runs/filter", {"task_runs": {"tags": {"all_": ["gpu:m2:0"]}}})
        spans = sorted((_stamp(t["start_time"]), _stamp(t["end_time"])) for t in tagged
                       if t["start_time"] and t["end_time"] and t["state_type"] == "COMPLETED"
                       and _stamp(t["start_time"]) > time.time() - 300)
        assert len(spans) >= 2, tagged
        assert all(_overlap(a, b) <= 0.05 for i, a in enumerate(spans) for b in spans[i + 1:]), spans

    def a_machine_dies(self, fs, workers: ExitStack) -> None:
        """m3 dies in the middle of its release stage, after a driver change: nothing half-published. After its
        restart (its worker started again, its cron's check-env) its next run finishes the work: check-env marks
        the dead watcher run crashed (else it would hold the machine's one watcher run at a time for the rest of the
        lease Prefect's engine renews for 300 s) and sends the change again (the record did not advance)."""
        self.clear_calls()
        for mark in self.marks.glob("m3.*"):  # (the first builds' marks)
            mark.unlink()
        (self.marks / "m3.ship-slow").touch()
        self.smi("m3", GPUS["m3"], NEW_DRIVER)
        done = _cli(TRTFLOW + ["check-env"], self.env["m3"], self.tmp)
        assert done.returncode == 3, done.stdout + done.stderr
        _until("m3's release stage to start", lambda: (self.marks / "m3.p1.ship").exists(), 300, self.logs, every=0.5)
        before = _ledger(fs)
        assert self.running["m3"].pid in _kill_machine("m3")
        (self.marks / "m3.ship-slow").unlink()
        assert _ledger(fs) == before, "no version was claimed by the stage that died"
        l4 = KINDS[GPUS["m3"]]
        assert sorted(before["p1", l4]) == [1]
        done = _cli(TRTFLOW + ["plan", "repos/p1/pipeline.yaml", "--json"], self.env["m3"], self.tmp)
        plan = {s["stage"]: s["action"] for s in json.loads(done.stdout)["stages"]}
        assert plan == {"engine": "reuse", "ship": "run"}, done.stdout  # the engine was published, the release not
        done = _cli(TRTFLOW + ["verify", "repos/p1/pipeline.yaml"], self.env["m3"], self.tmp)
        assert done.returncode == 0, done.stdout + done.stderr

        self.logs.append(self.tmp / "m3-again.log")
        workers.enter_context(self.start_worker("m3", "m3-again"))
        dead = {r["id"] for r in self.runs_of(self.deployments["m3"]) if r["state_type"] == "RUNNING"}
        assert len(dead) == 1, self.runs_of(self.deployments["m3"])
        done = _cli(TRTFLOW + ["check-env"], self.env["m3"], self.tmp)
        assert done.returncode == 3 and "marked watcher run '" in done.stdout and "crashed: its process (pid " \
            in done.stdout, done.stdout + done.stderr
        assert [r["state_type"] for r in self.runs_of(self.deployments["m3"]) if r["id"] in dead] == ["CRASHED"]
        self.seen["m3"] |= dead
        self.finish(["m3"])
        ledger = _ledger(fs)
        assert sorted(ledger["p1", l4]) == [1, 2] and sorted(ledger["p2", l4]) == [1, 2], ledger

    def no_deployment_no_record(self) -> None:
        """A machine whose change reaches no deployment (m5 has none): sent, not recorded, sent again by the next
        check."""
        self.add("m5", "NVIDIA L4")
        done = _cli(TRTFLOW + ["check-env"], self.env["m5"], self.tmp)
        assert done.returncode == 0 and "recorded" in done.stdout, done.stdout + done.stderr
        self.smi("m5", "NVIDIA L4", NEW_DRIVER)
        for _ in range(2):
            done = _cli(TRTFLOW + ["check-env"], self.env["m5"], self.tmp)
            assert done.returncode == 3 and "sent trtflow.environment.changed for machine m5" in done.stdout, \
                done.stdout + done.stderr


def _ledger(fs) -> dict[tuple[str, str], dict[int, dict]]:
    """(model, GPU kind) -> version -> its claim record, as the store's shared/ledger holds them."""
    out: dict[tuple[str, str], dict[int, dict]] = {}
    fs.invalidate_cache()  # (s3fs keeps listings: another machine wrote meanwhile)
    for path in fs.find("fleet/store/shared/ledger"):
        model, kind, name = path.split("/")[-3:]
        out.setdefault((model, kind), {})[int(name.removesuffix(".json"))] = json.loads(fs.cat(path))
    return out


def _published_releases(fs) -> list[dict]:
    """Every ship result published in the store (its release.json), whichever machine published it."""
    fs.invalidate_cache()
    return [json.loads(fs.cat(p)) for p in fs.find("fleet/store") if p.endswith("/ship/release.json")
            or (p.endswith("/release.json") and "/ship/" in p)]


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


def _stamp(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _kill_machine(m: str) -> list[int]:
    """Every process of machine `m` (its worker, its flow run, its stage and what that started) killed at once, as
    when the machine loses power: found by the TRTFLOW_MACHINE its environment holds."""
    mine = f"TRTFLOW_MACHINE={m}".encode()
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if mine in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
        except (OSError, ProcessLookupError):
            continue
    return killed


@pytest.fixture
def fleet_server(postgres, tmp_path):
    """A Prefect server of this test's own, started by trtflow on a fresh database of the test run's PostgreSQL
    (`--database URL`: its password is neither printed nor recorded; another database is refused while it runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "TRTFLOW_PREFECT_SERVER"}
    env.update({"PREFECT_HOME": str(tmp_path / "server-home"), "TRTFLOW_STATE_DIR": str(tmp_path / "server-state"),
                "PYTHONPATH": str(ROOT),
                # a dead machine's watcher run holds its one-run slot until this lease expires (Prefect's default:
                # 300 s; its least, 30 s): the fleet guide says so
                "PREFECT_SERVER_CONCURRENCY_INITIAL_DEPLOYMENT_LEASE_DURATION": "30"})
    url = postgres.database(f"fleet_{os.getpid()}_{int(time.time() * 1000) % 10**9}")
    url = url.replace("prefect@", "prefect:s3cret-pw@")  # trust authentication: any password is taken
    record = tmp_path / "server-state" / "prefect-server.json"
    try:
        done = _cli(TRTFLOW + ["server", "start", "--database", url], env, tmp_path)
        assert done.returncode == 0 and f"on postgresql+asyncpg://prefect:***@:{postgres.port}/" \
            in done.stdout, done.stdout + done.stderr
        assert "s3cret-pw" not in done.stdout + done.stderr + record.read_text(), "a URL's password is never said"
        other = _cli(TRTFLOW + ["server", "start", "--database", "local"], env, tmp_path)
        assert other.returncode == 1 and "runs on postgresql+asyncpg://prefect:***@" in other.stderr \
            and "`trtflow server stop` first" in other.stderr, other.stderr
        yield json.loads(record.read_text())["url"]
    finally:
        _cli(TRTFLOW + ["server", "stop"], env, tmp_path)
        _kill_recorded(record)


@pytest.mark.slow
def test_four_machines_two_gpu_kinds_one_fleet_on_postgresql(tmp_path, fleet_server):
    import s3fs

    from tests.test_shared_store import _moto_server

    with _moto_server(tmp_path) as s3:
        fs = s3fs.S3FileSystem(key=s3["AWS_ACCESS_KEY_ID"], secret=s3["AWS_SECRET_ACCESS_KEY"],
                               endpoint_url=s3["AWS_ENDPOINT_URL"], skip_instance_cache=True)
        fs.mkdir("fleet")
        _fleet(Fleet(tmp_path, fleet_server, s3), fs)


def _fleet(f: Fleet, fs) -> None:
    for name in ("p1", "p2"):
        (f.repos / name / "models").mkdir(parents=True)
        shutil.copy(PPOCR, f.repos / name / "models" / "cls.onnx")
        (f.repos / name / "pipeline.yaml").write_text(PIPELINE.format(name=name, marks=f.marks))
    f.deploy()
    with ExitStack() as workers:
        for m in GPUS:
            f.running[m] = workers.enter_context(f.start_worker(m))
        f.first_builds(fs)
        f.nightly_scheduled()
        f.new_driver_on_one_machine(fs)
        f.two_pipelines_on_one_gpu()
        f.a_machine_dies(fs, workers)
    f.no_deployment_no_record()
    # every version went to one engine: each published release's version is the ledger's record for its engine,
    # and no model and kind has one engine under two versions
    ledger = _ledger(fs)
    for release in _published_releases(fs):
        claims = [r for r in ledger.values() for v, r in r.items() if r["owner"] == release["owner"]]
        assert any(c["version"] == release["version"] for c in claims), (release, ledger)
    for (model, kind), versions in ledger.items():
        owners = [r["owner"] for r in versions.values()]
        assert len(owners) == len(set(owners)), (model, kind, versions)
