"""Under load: K `trtflow run`s of an example at once, against trtflow's one background Prefect server, on each
database Prefect's server can keep its state in: SQLite (its default) and PostgreSQL (a real cluster made for the
bench by flows/postgres.py, the server started on it with `trtflow server start --database URL`).

Per database, per mode and per K (default 1, 2, 4, 8, 16), K cold runs start together, each in its own copy of the
example's repository:
  own    each on its own store (.trtflow/ in its copy)
  local  all on one local store directory (--store)
  s3     all on one S3 store (moto's S3 server on loopback), each with its own cache directory, as K machines
and the table says per row: every exit code, the wall time of the K runs, their p95 run time against the single
run of the same database and mode, the server's requests and its errors while they ran (503s, which Prefect's
client retries, and other 5xx; the exceptions it logged are printed), how many runs said they were waiting for the
server, the server's p95 request latency, and peak RSS (the largest run's process tree, all runs' trees at the same
instant, the server's tree, the database's: PostgreSQL's server and its backends, as proportional set size since
they share its buffers; SQLite lives in the server).

Uvicorn's access log names each request and its status but not its duration: the server's process gets
bench/timed_server/ on its PYTHONPATH, whose sitecustomize times each HTTP request around Prefect's app (one line
per request in a file). The server is the bench's own per database (its own PREFECT_HOME and trtflow state
directory), started before the rows with its retryable errors logged (PREFECT_SERVER_LOGGING_LEVEL=INFO,
PREFECT_API_LOG_RETRYABLE_ERRORS=true); one discarded run warms the page cache first.

    python bench/load.py [--pipeline examples/ppocr-cls/pipeline.yaml] [--ks 1 2 4 8 16] [--modes own,local,s3]
                         [--databases sqlite,postgres]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from trtflow import procfs

ROOT = Path(__file__).resolve().parents[1]
MODES = ("own", "local", "s3")
DATABASES = ("sqlite", "postgres")
TIMED = ROOT / "bench" / "timed_server"
RUN_TIMEOUT_S = 1800
SAMPLE_S = 0.5
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
TIMING = re.compile(r"^([\d.]+) (\d{3}) ")  # bench/timed_server's line: <ms> <status> <method> <path>
EXCEPTION = re.compile(r"^[\w.]+(?:Error|Exception): .*")  # a traceback's last line
WAITING = "waiting for the Prefect server"


@dataclass
class ServerLoad:
    """What the server's timing lines and its log say about the requests of one row."""
    requests: int = 0
    retried: int = 0  # 503: an error Prefect's server calls retryable (SQLite busy or locked); its client retries
    failed: int = 0  # other 5xx
    latencies: list[float] = field(default_factory=list)  # ms per request
    causes: Counter = field(default_factory=Counter)  # the exceptions the server logged, by their last line

    @classmethod
    def of(cls, timing: str, log: str) -> ServerLoad:
        load = cls()
        for line in timing.splitlines():
            if m := TIMING.match(line):
                load.requests += 1
                load.latencies.append(float(m.group(1)))
                load.retried += m.group(2) == "503"
                load.failed += m.group(2).startswith("5") and m.group(2) != "503"
        for line in log.splitlines():
            if m := EXCEPTION.match(line):
                load.causes[m.group(0)[:120]] += 1
        return load

    @property
    def p95_ms(self) -> float:
        return percentile(self.latencies, 95) if self.latencies else 0.0


@dataclass
class Row:
    database: str
    mode: str
    k: int
    codes: list[int | str]
    wall: float
    seconds: list[float]
    server: ServerLoad
    waited: int
    peak_run_mb: float
    peak_all_mb: float
    peak_server_mb: float
    peak_database_mb: float | None  # None: the database lives in the server's process (SQLite)
    load: float  # the machine's 1-minute load average when the row ended
    failures: list[str] = field(default_factory=list)

    @property
    def p95(self) -> float:
        return percentile(self.seconds, 95)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, resident KB) of every process now (/proc)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        found = procfs.stat(entry)
        if found is None:  # gone meanwhile
            continue
        try:
            with open(f"/proc/{entry}/statm") as f:
                rss = int(f.read().split()[1]) * PAGE_KB
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry)] = (found.parent, rss)
    return table


def tree(root: int, table: dict[int, tuple[int, int]]) -> list[int]:
    """`root` and everything it started (the fork server and the stages under it; a database's backends), as they
    run now."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            found.append(pid)
            todo.extend(children.get(pid, []))
    return found


def tree_kb(root: int, table: dict[int, tuple[int, int]]) -> int:
    """Resident KB of `root`'s tree."""
    return sum(table[pid][1] for pid in tree(root, table))


def tree_pss_kb(root: int, table: dict[int, tuple[int, int]]) -> int:
    """Proportional set size in KB of `root`'s tree: PostgreSQL's backends share its buffers, which RSS would count
    once per backend."""
    total = 0
    for pid in tree(root, table):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(ln.split()[1]) for ln in f if ln.startswith("Pss:"))
        except (OSError, StopIteration, ValueError, IndexError):
            continue
    return total


@contextmanager
def moto_server(tmp: Path) -> Iterator[dict[str, str]]:
    """moto's S3 server on a free loopback port; yields the AWS_* variables that reach it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(tmp / "moto.log", "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"moto's S3 server did not start: see {tmp / 'moto.log'}") from None
                time.sleep(0.2)
        yield env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


class Bench:
    def __init__(self, pipeline: Path, tmp: Path, database: str):
        self.example = pipeline.parent
        self.pipeline_name = pipeline.name
        self.database = database
        self.tmp = tmp
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "AWS_", "TRTFLOW_"))}
        env.update({"PREFECT_HOME": str(tmp / "prefect-home"), "TRTFLOW_STATE_DIR": str(tmp / "state"),
                    "TRTFLOW_PREFECT_SERVER": "background", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "TRTFLOW_CACHE_DIR": str(tmp / "cache")})
        self.env = env
        self.s3_env: dict[str, str] = {}
        self.server_pid = 0
        self.server_log = Path()
        self.timing = tmp / "server-timing.txt"
        self.cluster = None  # flows/postgres.Cluster, for postgres

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trtflow.flows.cli", *args], env=env or self.env,
                              capture_output=True, text=True, check=False)

    def start_server(self) -> str:
        database = "sqlite"
        if self.database == "postgres":
            from trtflow.flows import postgres

            folder = self.tmp / "postgres"
            self.cluster = postgres.cluster(folder).start()
            database = self.cluster.url
        # its retryable errors logged, and each request timed (bench/timed_server)
        env = {**self.env, "PREFECT_SERVER_LOGGING_LEVEL": "INFO", "PREFECT_API_LOG_RETRYABLE_ERRORS": "true",
               "TRTFLOW_BENCH_TIMING": str(self.timing),
               "PYTHONPATH": os.pathsep.join([str(TIMED), *filter(None, [os.environ.get("PYTHONPATH")])])}
        done = self.cli("server", "start", "--database", database, env=env)
        if done.returncode:
            raise SystemExit(f"could not start the bench's Prefect server: {done.stderr.strip()}")
        rec = json.loads((self.tmp / "state" / "prefect-server.json").read_text())
        self.server_pid, self.server_log = rec["pid"], Path(rec["log"])
        return rec["url"]

    def stop_server(self) -> None:
        self.cli("server", "stop")
        if self.cluster is not None:
            self.cluster.stop()

    def database_pid(self) -> int | None:
        """PostgreSQL's server process (its backends are its children), else None."""
        if self.cluster is None:
            return None
        try:
            return int((self.cluster.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def repo(self, where: Path) -> Path:
        shutil.copytree(self.example, where, ignore=shutil.ignore_patterns(".trtflow"))
        return where

    def row(self, mode: str, k: int) -> Row:
        base = self.tmp / f"{mode}-{k}"
        base.mkdir()
        cmds, envs = [], []
        for i in range(k):
            repo = self.repo(base / f"repo{i}")
            cmd = [sys.executable, "-m", "trtflow.flows.cli", "run", str(repo / self.pipeline_name)]
            env = dict(self.env)
            if mode == "local":
                cmd += ["--store", str(base / "store")]
            elif mode == "s3":
                cmd += ["--store", f"s3://trtflow-load/{self.database}/{k}"]  # (each database its own: cold)
                env.update(self.s3_env)
                env["TRTFLOW_CACHE_DIR"] = str(base / f"machine{i}")
            cmds.append((cmd, repo))
            envs.append(env)
        log_from = self.server_log.stat().st_size
        timing_from = self.timing.stat().st_size if self.timing.exists() else 0
        database = self.database_pid()
        started = time.monotonic()
        procs = []
        for (cmd, repo), env in zip(cmds, envs):
            with open(repo / "run.out", "wb") as out, open(repo / "run.err", "wb") as err:
                procs.append(subprocess.Popen(cmd, cwd=repo, env=env, stdout=out, stderr=err,
                                              start_new_session=True))
        ended: dict[int, float] = {}
        timed_out: set[int] = set()
        peak_run = peak_all = peak_server = peak_database = 0
        while len(ended) < k:
            table = _processes()
            trees = [tree_kb(p.pid, table) for i, p in enumerate(procs) if i not in ended]
            peak_run = max([peak_run, *trees])
            peak_all = max(peak_all, sum(trees))
            peak_server = max(peak_server, tree_kb(self.server_pid, table))
            if database is not None:
                peak_database = max(peak_database, tree_pss_kb(database, table))
            for i, p in enumerate(procs):
                if i not in ended and p.poll() is not None:
                    ended[i] = time.monotonic() - started
                elif i not in ended and time.monotonic() - started > RUN_TIMEOUT_S:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                    ended[i] = time.monotonic() - started
                    timed_out.add(i)
            time.sleep(SAMPLE_S)
        wall = max(ended.values())
        server = ServerLoad.of(_tail(self.timing, timing_from), _tail(self.server_log, log_from))
        codes: list[int | str] = []
        failures, waited = [], 0
        for i, p in enumerate(procs):
            code: int | str = "timeout" if i in timed_out else p.returncode
            codes.append(code)
            err_text = (cmds[i][1] / "run.err").read_text(errors="replace")
            waited += WAITING in err_text
            if code != 0:
                last = [ln for ln in err_text.splitlines() if ln.strip()][-1:] or ["(nothing on stderr)"]
                failures.append(f"{self.database} {mode} K={k} run {i}: exit {code}: {last[0]} ({cmds[i][1]})")
        return Row(self.database, mode, k, codes, wall, [ended[i] for i in range(k)], server, waited,
                   peak_run / 1024, peak_all / 1024, peak_server / 1024,
                   peak_database / 1024 if database is not None else None, os.getloadavg()[0], failures)


def _tail(path: Path, start: int) -> str:
    """What `path` holds from byte `start` on ('' when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def table(rows: list[Row]) -> str:
    single = {(r.database, r.mode): r.p95 for r in rows if r.k == 1}
    lines = [("| database | mode | K | exit codes | wall s | p95 run s | p95 / single | server requests | "
              "503 retried / other 5xx | runs that waited | server p95 ms | peak RSS MB: largest run / all runs / "
              "server / database (PSS) | load (1 min) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        codes = ", ".join(str(c) for c in r.codes) if len(set(r.codes)) > 1 else f"{r.codes[0]} x{r.k}"
        ratio = f"{r.p95 / single[r.database, r.mode]:.2f}" if (r.database, r.mode) in single else ""
        db = "in server" if r.peak_database_mb is None else f"{r.peak_database_mb:.0f}"
        lines.append(f"| {r.database} | {r.mode} | {r.k} | {codes} | {r.wall:.1f} | {r.p95:.1f} | {ratio} | "
                     f"{r.server.requests} | {r.server.retried} / {r.server.failed} | {r.waited} | "
                     f"{r.server.p95_ms:.0f} | {r.peak_run_mb:.0f} / {r.peak_all_mb:.0f} / {r.peak_server_mb:.0f} / "
                     f"{db} | {r.load:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", type=Path, default=ROOT / "examples" / "ppocr-cls" / "pipeline.yaml")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    ap.add_argument("--databases", default=",".join(DATABASES), help="comma-separated, of: " + ", ".join(DATABASES))
    ap.add_argument("--keep", action="store_true", help="keep the runs' directories (their logs) afterwards")
    args = ap.parse_args()
    modes, databases = _listed(ap, "--modes", args.modes, MODES), _listed(ap, "--databases", args.databases, DATABASES)
    ks = sorted(set(args.ks) | {1})  # the single run is what p95 is compared with
    top = Path(tempfile.mkdtemp(prefix="trtflow-load-"))
    top.chmod(0o755)  # run as root, PostgreSQL's server is another user, who must reach its folder
    rows: list[Row] = []
    try:
        with moto_server(top) if "s3" in modes else _nothing() as s3_env:
            if s3_env:
                import boto3

                boto3.client("s3", endpoint_url=s3_env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                             aws_access_key_id="testing", aws_secret_access_key="testing"
                             ).create_bucket(Bucket="trtflow-load")
            for database in databases:
                (top / database).mkdir()
                rows += _database_rows(Bench(args.pipeline.resolve(), top / database, database), s3_env, modes, ks)
    finally:
        if args.keep or any(r.failures for r in rows):
            print(f"runs kept in {top}")
        else:
            shutil.rmtree(top, ignore_errors=True)
    print()
    print(table(rows))
    failed = [r for r in rows if r.failures]
    print()
    print(f"first failure: {failed[0].database} {failed[0].mode} K={failed[0].k}: {failed[0].failures[0]}" if failed
          else "no run failed")


def _listed(ap: argparse.ArgumentParser, flag: str, value: str, known: tuple[str, ...]) -> list[str]:
    chosen = [m.strip() for m in value.split(",") if m.strip()]
    if unknown := sorted(set(chosen) - set(known)):
        ap.error(f"{flag}: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    return chosen


def _database_rows(bench: Bench, s3_env: dict[str, str], modes: list[str], ks: list[int]) -> list[Row]:
    """Every mode's rows on one database's server (started here, stopped at the end)."""
    bench.s3_env = s3_env
    rows = []
    try:
        url = bench.start_server()
        print(f"{bench.database}: server {url} (pid {bench.server_pid}); cpus {os.cpu_count()}; load average "
              f"before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        bench.row("own", 1)  # warm-up, discarded: the page cache, Python's bytecode
        shutil.rmtree(bench.tmp / "own-1")
        for mode in modes:
            for k in ks:
                row = bench.row(mode, k)
                rows.append(row)
                print(f"{bench.database} {mode} K={k}: exit {row.codes}, wall {row.wall:.1f} s, p95 {row.p95:.1f} s, "
                      f"server {row.server.requests} requests (p95 {row.server.p95_ms:.0f} ms), "
                      f"{row.server.retried} 503 (retried), {row.server.failed} other 5xx; load average "
                      f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
                for failure in row.failures:
                    print(f"  {failure}", flush=True)
                for cause, n in row.server.causes.most_common():
                    print(f"  server logged {n}x: {cause}", flush=True)
    finally:
        bench.stop_server()
    return rows


@contextmanager
def _nothing() -> Iterator[dict[str, str]]:
    yield {}


if __name__ == "__main__":
    main()
