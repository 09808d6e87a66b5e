"""The Prefect server trtflow keeps in the background when PREFECT_API_URL is not set: started by the first
`trtflow run` that has work, reused by the next ones (no start-up cost), not needed by a fully cached run, and
stopped by `trtflow server stop`. A real server, started and stopped through the real CLI, killed by its PID if a
check fails half-way."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.processes import PIPE
from trtflow import procfs

CLI = [sys.executable, "-m", "trtflow.flows.cli"]
SLOW = """version: 1
name: slow
model: models/cls.onnx
stages:
  slow:
    kind: "tests.stage_fns:interval"
    outputs: {{report: json}}
    params: {{tag: {tag}, seconds: {seconds}, log: '{log}'}}
"""


def _isolated(tmp_path: Path) -> dict[str, str]:
    """The environment of a `trtflow` whose background server, Prefect database and state are the test's own (the
    suite's shared server is never paused or killed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "TRTFLOW_PREFECT_SERVER"}
    env.update({"PREFECT_HOME": str(tmp_path / "prefect-home"), "TRTFLOW_STATE_DIR": str(tmp_path / "state"),
                "PYTHONPATH": os.pathsep.join(sys.path)})
    return env


@pytest.mark.slow
def test_background_server_started_once_reused_and_stopped(workdir, tmp_path):
    (workdir / "pipeline.yaml").write_text(PIPE.format(name="bg"))
    env = _isolated(tmp_path)
    record = tmp_path / "state" / "prefect-server.json"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(CLI + list(args), env=env, cwd=workdir, capture_output=True, text=True, timeout=300)
    try:
        first = run("run", "pipeline.yaml")
        assert first.returncode == 0, first.stdout + first.stderr
        assert "started a Prefect server in the background" in first.stderr
        rec = json.loads(record.read_text())
        stat = Path(f"/proc/{rec['pid']}/stat").read_text().rsplit(")", 1)[1].split()
        assert rec["started_at"] == stat[19], "its start time (field 22, clock ticks since boot) proves it is ours"
        runs = httpx.post(f"{rec['url']}/flow_runs/filter", json={}, timeout=30).json()
        assert [r["state_type"] for r in runs] == ["COMPLETED"], "the run was recorded on that server"

        second = run("run", "pipeline.yaml", "--force")
        assert second.returncode == 0 and "started a Prefect server" not in second.stderr, second.stderr
        assert json.loads(record.read_text())["pid"] == rec["pid"], "the same server was reused"
        assert len(httpx.post(f"{rec['url']}/flow_runs/filter", json={}, timeout=30).json()) == 2

        cached = run("run", "pipeline.yaml")
        assert cached.returncode == 0 and "no flow run needed" in cached.stdout, cached.stdout
        # no flow run was started for it; its record (issue #54) is one Completed run named Cached, posted on the
        # side by a detached process
        deadline = time.monotonic() + 60
        while len(runs := httpx.post(f"{rec['url']}/flow_runs/filter", json={}, timeout=30).json()) < 3 \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(runs) == 3 and sorted(r["state_name"] for r in runs) == ["Cached", "Completed", "Completed"], runs

        assert run("server", "status").returncode == 0
        stopped = run("server", "stop")
        assert stopped.returncode == 0 and f"pid {rec['pid']}" in stopped.stdout
        assert not record.exists()
        # a zombie (exited, not yet reaped by this sandbox's init) counts as gone
        group = [p for p in Path("/proc").glob("[0-9]*") if _pgid(p) == rec["pid"] and not _zombie(p.name)]
        assert not group, "nothing of the server's process group is left"
        assert run("server", "status").returncode == 1

    finally:
        _kill_recorded(record)


@pytest.mark.slow
def test_a_paused_server_is_waited_for_and_a_killed_one_is_gone(workdir, tmp_path):
    """trtflow's background server stopped (SIGSTOP) in the middle of a run, longer than the three unanswered
    checks (about 18 s) that used to end the run with exit 3, then resumed: the run says once that it waits, goes
    on and exits 0, and the next run uses the same server (none was started beside it). The server killed in the
    middle of a run: exit 3 within seconds, one line that says its process is gone, the stage stopped with it."""
    env = _isolated(tmp_path)
    record = tmp_path / "state" / "prefect-server.json"
    logs = {"paused": tmp_path / "paused.txt", "killed": tmp_path / "killed.txt"}
    other = None

    def start(tag: str, seconds: int) -> tuple[subprocess.Popen, Path, Path]:
        (workdir / f"{tag}.yaml").write_text(SLOW.format(tag=tag, seconds=seconds, log=logs[tag]))
        stdout, stderr = tmp_path / f"{tag}.out", tmp_path / f"{tag}.err"  # files, read while the run goes on
        with open(stdout, "w") as out, open(stderr, "w") as err:
            proc = subprocess.Popen(CLI + ["run", f"{tag}.yaml"], env=env, cwd=workdir, stdout=out, stderr=err)
        started = time.monotonic()
        while not list((workdir / ".trtflow" / "slow").glob(".tmp-*")):  # the stage is running
            assert proc.poll() is None and time.monotonic() - started < 240, stderr.read_text()
            time.sleep(0.2)
        return proc, stdout, stderr

    try:
        proc, stdout, stderr = start("paused", 2)
        pid, url = (json.loads(record.read_text())[k] for k in ("pid", "url"))
        os.killpg(pid, signal.SIGSTOP)
        paused = time.monotonic()
        # a run starting meanwhile (here `trtflow server start`, which a run calls) waits for the same server
        other = subprocess.Popen(CLI + ["server", "start"], env=env, cwd=workdir, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        try:  # until the run says it waits, and past the old limit
            while "waiting for the Prefect server" not in stderr.read_text() or time.monotonic() - paused < 21:
                assert proc.poll() is None, stderr.read_text()
                assert time.monotonic() - paused < 120, ("never said it waits", stderr.read_text())
                time.sleep(0.5)
        finally:
            os.killpg(pid, signal.SIGCONT)
        proc.wait(timeout=300)
        assert proc.returncode == 0 and "done 1 stages (1 ran" in stdout.read_text(), stderr.read_text()
        said = [ln for ln in stderr.read_text().splitlines() if ln.strip()]
        assert len(said) == 2 and "started a Prefect server" in said[0], said  # nothing else, no error
        assert said[1].startswith("waiting for the Prefect server at http://127.0.0.1:"), said
        assert logs["paused"].exists(), "the stage ran to its end"
        said_other = other.communicate(timeout=120)[0]
        assert other.returncode == 0 and f"running at {url}" in said_other, said_other
        assert json.loads(record.read_text())["pid"] == pid, "no second server was started beside the paused one"

        proc, stdout, stderr = start("killed", 60)
        assert json.loads(record.read_text())["pid"] == pid, "the paused server was reused, none started beside it"
        os.killpg(pid, signal.SIGKILL)
        lost = time.monotonic()
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        lines = [ln for ln in stderr.read_text().splitlines() if ln.strip()]
        assert proc.returncode == 3 and len(lines) == 1, (proc.returncode, lines)
        assert "stopped answering during the run" in lines[0] and "its process is gone" in lines[0], lines
        assert "the next run starts a new one" in lines[0], lines
        assert time.monotonic() - lost < 30, "within seconds, not after Prefect's client retries for minutes"
        assert not logs["killed"].exists(), "the stage was stopped, not left running to its end"
    finally:
        _kill_recorded(record)
        if other is not None and other.poll() is None:
            other.kill()
            other.wait()


def _kill_recorded(record: Path) -> None:
    """Whatever a test left behind: the process group of the server its record names, if any."""
    if record.exists():
        try:
            os.killpg(json.loads(record.read_text())["pid"], signal.SIGKILL)
        except (ProcessLookupError, ValueError, KeyError):
            pass


def _pgid(proc: Path) -> int | None:
    try:
        return int(proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def _zombie(pid: int | str) -> bool:
    """A zombie, or gone."""
    found = procfs.stat(pid)
    return found is None or found.state == b"Z"


def test_a_stale_record_never_kills_another_process(tmp_path, monkeypatch):
    """`trtflow server stop` with a stale record killed whatever process had reused the pid. Only the process
    trtflow started (a Prefect server command line on the recorded port, the recorded start time) is stopped."""
    from trtflow.flows import server

    monkeypatch.setenv("TRTFLOW_STATE_DIR", str(tmp_path))
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        server.record_file().write_text(json.dumps({"pid": bystander.pid, "url": "http://127.0.0.1:4321/api",
                                                    "started_at": server._started_at(bystander.pid)}))
        assert server.running() is None
        assert server.stop() is None, "a record that is not trtflow's server is dropped, not acted on"
        assert bystander.poll() is None, "the process that reused the pid is alive"
        assert not server.record_file().exists()
    finally:
        bystander.kill()
        bystander.wait()


def _impostor(port: int) -> subprocess.Popen:
    """A real process that is not trtflow's server but whose command line holds `prefect`, `server` and the port
    (and leads its own process group, as trtflow's server does): what a record without proof may name."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "prefect", "server", "start",
                             "--port", str(port)], start_new_session=True)


@pytest.mark.slow
@pytest.mark.parametrize("proof", ["none", "another"])
def test_a_record_without_proof_is_refused_and_nothing_is_signalled(tmp_path, proof):
    """`trtflow server stop` SIGTERMed the process group of any process whose command line held `prefect`,
    `server` and the recorded port when the record had no start time (an older trtflow's, or edited by hand); with
    another start time it said no server was running and forgot the record. Now either is one line, exit 1, the
    process is left alone and the record stays; `server start` and `server status` refuse it the same way."""
    from trtflow.flows import server

    env = _isolated(tmp_path)
    record = tmp_path / "state" / "prefect-server.json"
    impostor = _impostor(4321)
    try:
        started_at = server._started_at(impostor.pid)
        assert started_at is not None
        rec = {"pid": impostor.pid, "url": "http://127.0.0.1:4321/api", "log": "", "started": time.time()}
        if proof == "another":
            rec["started_at"] = str(int(started_at) + 1)
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps(rec))
        for action in ("stop", "start", "status"):
            done = subprocess.run(CLI + ["server", action], env=env, capture_output=True, text=True, timeout=120)
            lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
            assert done.returncode == 1 and len(lines) == 1 and not done.stdout.strip(), (action, done)
            assert lines[0].startswith("error: trtflow's server record") and f"pid {impostor.pid}" in lines[0], lines
            assert f"kill {impostor.pid}" in lines[0] and str(record) in lines[0], lines
            assert "no start time" in lines[0] if proof == "none" else "another start time" in lines[0], lines
            time.sleep(0.5)  # a signal, had one been sent, has landed
            assert impostor.poll() is None, f"`server {action}` signalled a process trtflow did not start"
            assert json.loads(record.read_text()) == rec, f"`server {action}` changed or removed the record"
    finally:
        impostor.kill()
        impostor.wait()


def test_stop_signals_only_the_recorded_start_time(tmp_path, monkeypatch):
    """Between SIGTERM and SIGKILL the server's pid may be reused: each signal is sent only while the pid's start
    time is the recorded one."""
    from trtflow.flows import server

    monkeypatch.setenv("TRTFLOW_STATE_DIR", str(tmp_path))
    impostor = _impostor(4322)
    try:
        rec = server.ServerRecord(pid=impostor.pid, url="http://127.0.0.1:4322/api",
                                  started_at=str(int(server._started_at(impostor.pid)) + 1))
        server._kill(rec)
        time.sleep(0.5)
        assert impostor.poll() is None
        server._kill(rec.model_copy(update={"started_at": server._started_at(impostor.pid)}))
        assert impostor.wait(timeout=30) == -signal.SIGTERM, "the process it proves it started is stopped"
    finally:
        if impostor.poll() is None:
            impostor.kill()
            impostor.wait()
