"""A local Prefect server kept running between `trtflow run`s, so a run does not pay Prefect's temporary server
(about 10 s per process) each time: started in the background on first use, reused while it answers, stopped by
`trtflow server stop`.

Used only when PREFECT_API_URL is not set (a server of your own always wins) and TRTFLOW_PREFECT_SERVER is not
`ephemeral` (Prefect's temporary server per run, as plain Prefect does). Its record, `prefect-server.json`, and its
log live in trtflow's state directory (see flows/machine.py); its database is Prefect's own (PREFECT_HOME).

trtflow signals only the process it can prove it started: the record holds its pid and its start time from /proc,
taken when it was started, and both must still match (a pid is reused by unrelated processes). A record without
that proof (older trtflow, edited by hand) is refused with one line, never acted on; without /proc nothing can be
proven, so runs use Prefect's temporary server there.
"""
from __future__ import annotations

import fcntl
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from trtflow import files, procfs, settings
from trtflow.errors import PrefectUnavailable, SpecError, TrtflowError
from trtflow.flows.machine import state_file
from trtflow.secrets import secret_key

START_TIMEOUT_S = 120  # Prefect's own 20 s run out on a busy two-core machine
MODE = settings.PREFECT_SERVER.name


class NotProven(TrtflowError):
    """The record names a live Prefect server on its port that trtflow cannot prove it started."""


class ServerRecord(BaseModel):
    """`prefect-server.json`: the background server trtflow started (written before it answers, so that a trtflow
    killed meanwhile leaves a server `trtflow server stop` knows)."""
    pid: int
    url: str
    log: str = ""
    started: float = 0.0  # time.time() when it was started
    started_at: str | None = None  # its process's start time (/proc/<pid>/stat); None: nothing can be proven
    database: str = "sqlite"  # what it keeps its state in, as said to the user (shown_database: no secret)
    cluster: str | None = None  # the PostgreSQL cluster trtflow started for it (`--database local`), stopped with it

    @property
    def port(self) -> str:
        return self.url.rsplit(":", 1)[-1].split("/")[0]


def _read() -> ServerRecord | None:
    try:
        return ServerRecord.model_validate(files.read_json(record_file(), files.RECORD_BYTES))
    except (OSError, ValueError, ValidationError):
        return None


def record_file() -> Path:
    return state_file().parent / "prefect-server.json"


def wanted() -> bool:
    from prefect.settings import PREFECT_API_URL

    return not PREFECT_API_URL.value() and settings.PREFECT_SERVER.get() != "ephemeral" and _provable()


def _provable() -> bool:
    return Path("/proc/self/stat").is_file()


@functools.cache
def _health_client() -> Any:
    """One HTTP client for every /health check of this process: each new one loads the CA bundle again (about 70 ms
    of CPU; a server's start is checked every 0.25 s, a run's server every 3 s). No connection is kept, so a server
    that is gone is a refused connection, never a stale one."""
    import httpx

    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def health(url: str, timeout: float) -> int:
    """The status of the server's /health; httpx's error when it does not answer (ConnectError: nobody listens)."""
    return _health_client().get(f"{url}/health", timeout=timeout).status_code


def healthy(url: str, timeout: float = 2.0) -> bool:
    import httpx

    try:
        return health(url, timeout) == 200
    except httpx.HTTPError:
        return False


def running() -> ServerRecord | None:
    """The background server's record, if that server is alive, is the process trtflow started, and answers.
    Raises NotProven for a record that names a Prefect server trtflow cannot prove it started."""
    rec = _read()
    if rec is None or not _proven(rec):
        return None
    return rec if healthy(rec.url) else None


def current() -> ServerRecord | None:
    """trtflow's record of its background server, if any (alive or not: see `alive`)."""
    return _read()


def recorded(url: str) -> ServerRecord | None:
    """trtflow's record of its background server at `url` (None: `url` is not, or no longer, trtflow's server)."""
    rec = _read()
    return rec if rec is not None and rec.url == url else None


def _started_at(pid: int) -> str | None:
    """The process's start time as the record keeps it (`procfs.started`)."""
    ticks = procfs.started(pid)
    return str(ticks) if ticks is not None else None


def _looks_like(rec: ServerRecord) -> bool:
    """The recorded pid runs a Prefect server command line on the recorded port (which proves nothing alone: any
    process may have it)."""
    try:
        cmdline = Path(f"/proc/{rec.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"prefect" in b" ".join(cmdline) and b"server" in cmdline and rec.port.encode() in cmdline


def alive(rec: ServerRecord) -> bool:
    """The recorded pid is still the server trtflow started: the start time recorded when trtflow started it, and
    a Prefect server command line on the recorded port (a stale record's pid may belong to any process by now).
    A record without a start time proves nothing: not alive."""
    return rec.started_at is not None and rec.started_at == _started_at(rec.pid) and _looks_like(rec)


def _proven(rec: ServerRecord) -> bool:
    """alive(rec); a record whose pid runs a Prefect server on its port without proof (no start time recorded,
    or another one) raises NotProven: it may be trtflow's, it may not, and it is neither reused nor signalled."""
    if alive(rec):
        return True
    if _looks_like(rec):
        why = "has no start time for it" if rec.started_at is None else "has another start time than that process"
        raise NotProven(f"trtflow's server record {record_file()} names pid {rec.pid}, a Prefect server on port "
                        f"{rec.port}, but {why}: trtflow cannot prove it started that process, so it neither uses nor "
                        f"signals it",
                        hint=f"if that server is yours, stop it yourself (kill {rec.pid}); if not, remove "
                             f"{record_file()}")
    return False


@contextmanager
def _locked() -> Iterator[None]:
    """One trtflow at a time decides whether to start the server (two first runs at once start one)."""
    path = record_file().with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure(on_start=None, database: str | None = None, host: str = "127.0.0.1", port: int | None = None) -> str:
    """The API URL of the background server, started first if it is not running. `on_start(url)` is called
    when this call starts it. `database`: `sqlite`, `local` or a PostgreSQL URL (default TRTFLOW_SERVER_DATABASE);
    `host`: the address it listens on (0.0.0.0: other machines too); `port`: its port (default: a free one). A
    server already running on another database is refused (stop it first)."""
    if not _provable():
        raise PrefectUnavailable(f"trtflow keeps a background Prefect server only where /proc tells which process it "
                                 f"started: set PREFECT_API_URL to a server of yours, or {MODE}=ephemeral for "
                                 f"Prefect's temporary one")
    database = database or settings.SERVER_DATABASE.get()
    with _locked():
        rec = _read()
        if rec is not None and _proven(rec):
            if database != "sqlite" and not _same_database(rec, database):
                raise TrtflowError(f"trtflow's background Prefect server at {rec.url} runs on {rec.database}, not "
                                   f"{shown_database(database)}", hint="`trtflow server stop` first")
            # the process trtflow started lives: a loaded machine (other runs, SQLite writes) may keep its answer
            # longer than a health check waits; it is waited for, never replaced by a second server beside it
            return _answering(rec)
        return _start(on_start, database, host, port or free_port())


def _same_database(rec: ServerRecord, database: str) -> bool:
    """The running server keeps its state in `database` (`local`: a cluster of trtflow's)."""
    return rec.cluster is not None if database == "local" else rec.database == shown_database(database)


def database_url(database: str, named: str = settings.SERVER_DATABASE.name) -> Any:
    """`database` as SQLAlchemy's URL; SpecError naming where it was given (`named`) for one it cannot read, the
    value not repeated (it may hold a password)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(database)
    except (ValueError, ArgumentError):
        url = None
    if url is not None and "@" not in (url.host or ""):  # a host with '@': a password's '@' left unescaped
        return url
    raise SpecError(f"{named}: the PostgreSQL URL given cannot be read (not repeated here: it may hold a "
                    f"password)", hint="write it as postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DATABASE: the port a "
                                      "number, an IPv6 host in brackets ([::1]), an '@' in the password as %40")


def shown_database(database: str) -> str:
    """How a database is said (and recorded): a URL without its password, wherever it sits (userinfo, or the value
    of a query key that names a secret)."""
    if database in ("sqlite", "local"):
        return database
    url = database_url(database)
    pairs = [(k, v) for k, given in url.query.items() for v in ((given,) if isinstance(given, str) else given)]
    query = "&".join(f"{k}={'***' if secret_key(k) else quote(v, safe='/:,')}" for k, v in pairs)
    shown = url.set(query={}).render_as_string(hide_password=True)
    return f"{shown}?{query}" if query else shown


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(on_start, database: str, host: str, port: int) -> str:
    url = f"http://127.0.0.1:{port}/api"
    shown = shown_database(database)  # (a URL it cannot read refused before anything starts)
    log = record_file().with_suffix(".log")
    env = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", **os.environ}  # unless the user sets it
    env.pop("PREFECT_API_URL", None)
    env["PREFECT_UI_API_URL"] = url  # else its UI calls Prefect's default address, not this server
    cluster = None
    if database == "local":
        from trtflow.flows import postgres

        cluster = postgres.cluster(record_file().parent / "postgres").start()
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = cluster.url
    elif database != "sqlite":
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", host,
                                 "--port", str(port)], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    # recorded before waiting for it: a trtflow killed now leaves a server `trtflow server stop` knows
    record = ServerRecord(pid=proc.pid, url=url, log=str(log), started=time.time(), started_at=_started_at(proc.pid),
                          database=shown + (f" ({cluster.directory})" if cluster else ""),
                          cluster=str(cluster.directory) if cluster else None)
    files.write_atomic(record_file(), record.model_dump_json().encode())  # runs read it while it is written
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while not healthy(url, timeout=1.0):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise PrefectUnavailable(f"could not start a Prefect server in the background (log: {log}; "
                                         f"last line: {tail[0]}): set PREFECT_API_URL to a server of yours, or "
                                         f"{MODE}=ephemeral for Prefect's temporary one")
            time.sleep(0.25)
    except BaseException:  # failed, or interrupted (SIGTERM, Ctrl-C) while it started: no orphan is left
        _kill(record)
        if cluster is not None:
            cluster.stop()
        record_file().unlink(missing_ok=True)
        raise
    if on_start:
        on_start(url)
    return url


def _answering(rec: ServerRecord) -> str:
    """`rec`'s URL once its server answers (it may be starting, or busy), within START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not healthy(rec.url, timeout=5.0):
        if time.monotonic() > deadline:
            raise PrefectUnavailable(f"trtflow's background Prefect server at {rec.url} (pid {rec.pid}) is running "
                                     f"but did not answer for {START_TIMEOUT_S} s (log: {rec.log}): run again when it "
                                     f"answers, or `trtflow server stop` and run again (the next run then starts a new "
                                     f"one)")
        if not alive(rec):  # it ended meanwhile
            raise PrefectUnavailable(f"trtflow's background Prefect server at {rec.url} (pid {rec.pid}) ended while "
                                     f"it was waited for (log: {rec.log}): run again (the next run starts a new one)")
        time.sleep(0.5)
    return rec.url


READY_TIMEOUT_S = 10.0  # Prefect's /ready opens a connection to its database


def database_down(rec: ServerRecord) -> PrefectUnavailable | None:
    """The running server `rec`'s database not answering, as one line (exit 3); None while it answers."""
    down = _unready(rec.url, rec)
    if down is None:
        return None
    return PrefectUnavailable(f"trtflow's Prefect server at {rec.url} (pid {rec.pid}) runs, but {down}",
                              hint=_restart(rec))


def answered_error(exc: BaseException) -> PrefectUnavailable | None:
    """A Prefect server's 5xx that reached the run (its client's retries spent) as a lost server's one line (exit 3),
    saying so when its database does not answer; None for anything else."""
    import httpx

    if not isinstance(exc, httpx.HTTPStatusError) or exc.response.status_code < 500:
        return None
    request = exc.request
    url = f"{request.url.scheme}://{request.url.netloc.decode()}/api"
    rec = recorded(url)
    said = (f"Prefect's server at {url} answered {exc.response.status_code} to {request.method} "
            f"{request.url.path.removeprefix('/api')}")
    down = _unready(url, rec)
    if down is not None:
        return PrefectUnavailable(f"{said}: {down}; `trtflow server status` checks it", hint=_restart(rec))
    log = f" (its log: {rec.log})" if rec is not None else ""
    return PrefectUnavailable(f"{said}{log}", hint="run again; if it answers so again, its log says why")


def _unready(url: str, rec: ServerRecord | None) -> str | None:
    """What Prefect's /ready at `url` says of its database when it cannot connect to it (503), or None (it can, the
    server does not answer at all, or has no /ready)."""
    import httpx

    try:
        if _health_client().get(f"{url}/ready", timeout=READY_TIMEOUT_S).status_code != 503:
            return None
    except httpx.HTTPError:
        return None
    if rec is not None and rec.cluster:
        from trtflow.flows import postgres

        return f"its database, PostgreSQL in {rec.cluster}, is down (log: {postgres.Cluster(Path(rec.cluster)).log})"
    return f"its database ({rec.database if rec is not None else 'unknown'}) does not answer"


def _restart(rec: ServerRecord | None) -> str:
    if rec is not None and rec.cluster:
        return "`trtflow server stop`, then `trtflow server start --database local` starts both again"
    return "start the database again, then run again"


def stop() -> ServerRecord | None:
    """Stop the background server (its whole process group); its record, or None when none was running (a stale
    record, whose pid is gone or another process's, is removed). A record naming a Prefect server trtflow cannot
    prove it started raises NotProven: nothing is signalled and the record stays."""
    with _locked():
        rec = _read()
        cluster = rec.cluster if rec is not None else None
        if rec is not None and _proven(rec):
            _kill(rec)
        else:
            rec = None
        if cluster:  # (also when its server is gone: the database is trtflow's all the same)
            from trtflow.flows import postgres

            postgres.cluster(Path(cluster)).stop()
        record_file().unlink(missing_ok=True)
        return rec


def _kill(rec: ServerRecord) -> None:
    """SIGTERM, then SIGKILL, to the process group trtflow started, each sent only while its leader is still that
    process (the recorded start time)."""
    pid = rec.pid
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        if rec.started_at is None or _started_at(pid) != rec.started_at:
            return
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
                if procfs.zombie(pid):
                    return
            except ProcessLookupError:
                return
            time.sleep(0.1)


