"""The database trtflow starts is nobody else's (issue #67): no TCP listener, its socket in a folder only the server's
user (and root) can reach, Prefect's role no superuser; nothing it writes follows a link planted where it goes; no
secret in a database URL is ever said or recorded, and a URL that cannot be read is one line, exit 2."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import reachable_tmp
from tests.test_server import _isolated, _kill_recorded
from trtflow.flows import postgres as pg
from trtflow.flows.server import shown_database

CLI = [sys.executable, "-m", "trtflow.flows.cli"]
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="another user is made only by root")


def _another_user() -> tuple[int, int]:
    """A uid and gid that are neither root nor the cluster's server user (nobody's, unless nobody runs it)."""
    server = pwd.getpwnam(pg.server_user()).pw_uid
    uid = next(u for u in (65534, 65533) if u != server)
    return uid, uid


def _fetch(url: str, *statements: str) -> list[tuple]:
    """The last of `statements`' rows, each run and committed through the URL Prefect's server is given."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    async def ask() -> list[tuple]:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                for sql in statements[:-1]:
                    await conn.execute(text(sql))
                rows = [tuple(r) for r in (await conn.execute(text(statements[-1]))).all()]
                await conn.commit()
                return rows
        finally:
            await engine.dispose()
    return asyncio.run(ask())


def _tcp_listeners(pid: int) -> list[str]:
    """The local addresses process `pid` listens on by TCP (its sockets' inodes in /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    return [fields[1] for table in ("/proc/net/tcp", "/proc/net/tcp6")
            for fields in (line.split() for line in Path(table).read_text().splitlines()[1:])
            if fields[3] == "0A" and fields[9] in inodes]  # 0A: LISTEN


@pytest.mark.slow
def test_the_cluster_listens_on_no_tcp_port_and_its_folders_are_closed_to_others(postgres):
    pid = int((postgres.data / "postmaster.pid").read_text().split()[0])
    assert _tcp_listeners(pid) == [], "no TCP listener, loopback included"
    assert (postgres.run / f".s.PGSQL.{postgres.port}").is_socket()
    server_uid = pwd.getpwnam(postgres.user).pw_uid if postgres.user else os.geteuid()
    for folder in (postgres.data, postgres.run):
        st = folder.lstat()
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, server_uid), folder
    assert stat.S_IMODE(postgres.directory.lstat().st_mode) & 0o007 == 0, "others cannot even enter"
    assert _fetch(postgres.url, "select 1") == [(1,)], "this user (root too) reaches it"


def _as_another_user(fn):
    """fn()'s result (or the exception it raised) in a child process forked and turned into `_another_user()`
    (the interpreter may live where that user cannot go: no exec)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    uid, gid = _another_user()

    def target() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        try:
            child.send(fn())
        except Exception as exc:  # noqa: BLE001 - returned for the test to inspect
            child.send(exc)
    proc = ctx.Process(target=target)
    proc.start()
    result = parent.recv()
    proc.join()
    return result


@pytest.mark.slow
@AS_ROOT
def test_another_user_cannot_reach_the_database_trtflow_started(postgres):
    lines = (postgres.data / "postmaster.pid").read_text().splitlines()  # its pid, data, start, port, socket dir
    path = f"{lines[4]}/.s.PGSQL.{lines[3]}"

    def reach() -> str:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(path)
            except OSError as exc:
                return type(exc).__name__
        return "connected"

    # up front: the other user reaches the folder the cluster is in (a world-traversable temporary one, not the
    # checkout's), so that the refusals below are the cluster's own folders', not a closed folder above them
    above = _as_another_user(lambda: os.listdir(postgres.directory.parent))
    assert isinstance(above, list), f"the other user cannot reach {postgres.directory.parent}: {above!r}"
    # (no TCP listener to try: the test above)
    assert _as_another_user(reach) == "PermissionError"
    assert isinstance(_as_another_user(lambda: list(postgres.directory.iterdir())), PermissionError)


def test_prefects_role_owns_its_database_and_is_no_superuser(postgres):
    roles = _fetch(postgres.url, "select rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls "
                                 "from pg_roles where rolname = current_user")
    assert roles == [(False, False, False, False, False)], roles
    owner = _fetch(postgres.url, "select pg_get_userbyid(datdba), current_user from pg_database "
                                 "where datname = current_database()")
    assert owner == [("prefect", "prefect")]
    made = postgres.database("security_probe")
    assert _fetch(made, "select pg_get_userbyid(datdba) from pg_database where datname = current_database()") == \
        [("prefect",)]
    # a trusted extension, made by the database's owner as Prefect's migrations make it
    assert _fetch(made, "create extension pg_trgm", "select extname from pg_extension where extname = 'pg_trgm'") \
        == [("pg_trgm",)]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["port", "run", "data", "."])  # port: an earlier trtflow's record
def test_a_link_planted_where_the_cluster_writes_is_never_followed(where):
    folder = reachable_tmp("trtflow-test-link-")
    directory = folder / "pg"
    target = folder / "target"  # dangling: whatever follows the link creates it
    try:
        (directory / where).parent.mkdir(parents=True, exist_ok=True)
        (directory / where).symlink_to(target)
        cluster = None
        try:
            cluster = pg.cluster(directory)  # where the programs are looked for inside it, this refuses already
            cluster.start()
        except pg.PostgresError as exc:
            assert "symlink" in str(exc) and "\n" not in str(exc), str(exc)
        finally:
            if cluster is not None:
                cluster.stop()
        assert not target.exists() and not target.is_symlink(), f"{where}: written through the link"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@AS_ROOT
def test_a_cluster_folder_of_another_owner_is_refused_with_nothing_written_in_it():
    """An earlier trtflow run as root gave the cluster's folder to the server's user, who could then plant a link
    anywhere root writes in it."""
    folder = reachable_tmp("trtflow-test-owner-")
    directory = folder / "pg"
    try:
        directory.mkdir()
        os.chown(directory, *_another_user())
        with pytest.raises(pg.PostgresError, match="belongs to .* not to you") as raised:
            pg.cluster(directory).start()
        assert "\n" not in str(raised.value) and "move" in raised.value.hint
        assert list(directory.iterdir()) == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("url, secrets", [
    ("postgresql+asyncpg://prefect:pw1@db:5432/prefect", ["pw1"]),
    ("postgresql+asyncpg://prefect@db/prefect?password=pw2&application_name=trtflow", ["pw2"]),
    ("postgresql+asyncpg://prefect@db/prefect?sslpassword=pw3&sslkey=/k/pw4.key&token=pw5&Passwd=pw6&pwd=pw7",
     ["pw3", "pw4", "pw5", "pw6", "pw7"]),
    ("postgresql+asyncpg://prefect:pw8@db/prefect?password=pw9&password=pw10&secret=pw11", ["pw8", "pw9", "pw10", "pw11"]),
])
def test_no_secret_in_a_database_url_is_said(url, secrets):
    shown = shown_database(url)
    assert not [s for s in secrets if s in shown], shown
    assert shown.startswith("postgresql+asyncpg://prefect") and "/prefect" in shown, shown
    assert "application_name=trtflow" in shown or "application_name" not in url


@pytest.mark.slow
def test_a_query_password_is_neither_printed_nor_recorded_by_server_start_and_status(postgres, tmp_path):
    env = _isolated(tmp_path)
    url = postgres.database(f"secret_{os.getpid()}") + "&password=s3cret-query-pw"
    record = tmp_path / "state" / "prefect-server.json"
    try:
        started = subprocess.run(CLI + ["server", "start", "--database", url], env=env, capture_output=True,
                                 text=True, timeout=300)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "password=***" in started.stdout, started.stdout
        status = subprocess.run(CLI + ["server", "status"], env=env, capture_output=True, text=True, timeout=120)
        assert status.returncode == 0 and "password=***" in status.stdout, status.stdout + status.stderr
        said = started.stdout + started.stderr + status.stdout + status.stderr + record.read_text()
        said += Path(json.loads(record.read_text())["log"]).read_text(errors="replace")
        assert "s3cret-query-pw" not in said
    finally:
        subprocess.run(CLI + ["server", "stop"], env=env, capture_output=True, timeout=120)
        _kill_recorded(record)


@pytest.mark.parametrize("url", ["postgresql+asyncpg://[::1", "postgresql+asyncpg://prefect:pw-xyz@db:notaport/x",
                                 "postgresql+asyncpg://prefect:p@w-xyz@db/x", "postgresql://prefect:pw-xyz@db/x"])
def test_a_database_url_that_cannot_be_read_is_one_line_exit_2_naming_the_option(url, tmp_path):
    done = subprocess.run(CLI + ["server", "start", "--database", url], env=_isolated(tmp_path),
                          capture_output=True, text=True, timeout=120)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "--database" in lines[0], (done.returncode, done.stderr)
    assert "pw-xyz" not in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "state" / "prefect-server.json").exists()


def test_a_bad_database_variable_is_refused_without_repeating_its_value(monkeypatch):
    """A URL in TRTFLOW_SERVER_DATABASE that is not one trtflow takes may still hold a password: the error names
    the variable and what it takes, never the value."""
    from trtflow import settings
    from trtflow.errors import SpecError

    monkeypatch.setenv("TRTFLOW_SERVER_DATABASE", "postgresql://prefect:hunter2 secret@db/prefect")
    with pytest.raises(SpecError) as exc:
        settings.SERVER_DATABASE.get()
    assert "hunter2" not in str(exc.value) and "TRTFLOW_SERVER_DATABASE" in str(exc.value)
