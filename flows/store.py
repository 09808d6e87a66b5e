"""The artifact store: one directory per (stage, key), published atomically, with a manifest written last.

`<root>/<stage>/<key>/manifest.json` + the stage's outputs. A directory without a complete manifest is never
a cache hit, and neither is one whose files differ from the manifest's record of them (every file: path, size,
sha256, mtime): on reuse each file's size and mtime are checked, and a file whose mtime moved is hashed again.
`verify` hashes everything. Staging directories carry their owner (host, pid); those of dead owners are removed
when the store is next used.

trtflow deletes only what carries its own marks: a store has a marker file at its root (`.trtflow-store`, written
when a run first opens it), results are `<stage>/<32 hex>/` directories, staging is `.tmp-*`/`.trash-*`; nothing
else under the root is touched, no symlink is followed, and every path a manifest names must stay inside its
result directory. `ArtifactStore` is the interface; `LocalStore` implements it for a directory, and
flows/remote_store.py's `RemoteStore` for an fsspec URL (with a `LocalStore` as each machine's cache).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import uuid
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Protocol

from trtflow import files, paths
from trtflow.artifact import CLAIM_BYTES, Claim
from trtflow.disk import disk_cause, disk_error
from trtflow.errors import StageError, StoreError, TrtflowError
from trtflow.files import MANIFEST_BYTES, RECORD_BYTES, is_regular
from trtflow.flows.digest import DigestCache
from trtflow.flows.keys import LastRun
from trtflow.flows.manifest import MANIFEST, FileRecord, Manifest
from trtflow.paths import safe_relpath

LAST = "last.json"
DIGESTS = "digests.json"
SHARED = "shared"  # <root>/shared/: caches stages share across keys (timing cache, benchmark baselines)
MARKER = ".trtflow-store"  # at the root of every store trtflow made: what `verify --repair` asks before removing
MARKER_CONTENT = {"trtflow": "artifact store", "format": 1}
GITIGNORE = ".gitignore"
KEY_NAME = re.compile(r"[0-9a-f]{32}")  # flows/keys.py's stage_key
HOST = socket.gethostname().replace("-", "_")[:32]


def umask() -> int:
    """The process's umask: read from /proc where Linux shows it (setting it to read it back, as elsewhere, would
    change it for a moment under every other thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _result_files(directory: Path) -> list[Path]:
    """Everything under `directory` that is not a directory (symlinks, FIFOs and devices included), but the
    manifest."""
    return sorted(p for p in directory.rglob("*") if (p.is_symlink() or not p.is_dir()) and p.name != MANIFEST)


def file_records(directory: Path, sha256: Callable[[Path], str] = files.sha256) -> dict[str, FileRecord]:
    """relative path -> size, sha256, mtime_ns and ctime_ns of every file under `directory` but the manifest."""
    out = {}
    for f in _result_files(directory):
        if not is_regular(f):  # a symlink would point outside the result, a FIFO block its reader
            raise StageError(f"the stage wrote {_what(f)}, {f.relative_to(directory).as_posix()}, among its "
                             f"outputs: write the file itself")
        st = f.stat()
        out[f.relative_to(directory).as_posix()] = FileRecord(size=st.st_size, sha256=sha256(f),
                                                              mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)
    return out


def _what(path: Path) -> str:
    return "a symlink" if path.is_symlink() else "a FIFO" if path.is_fifo() else "a special file"


def local_stamps(directory: Path, records: dict[str, FileRecord]) -> dict[str, FileRecord]:
    """`records` of files just verified by hash, with this machine's mtime and ctime of them."""
    out = {}
    for rel, rec in records.items():
        st = (directory / rel).stat()
        out[rel] = rec.model_copy(update={"mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns})
    return out


def check_files(directory: Path, records: dict[str, FileRecord] | None, rehash: bool = False,
                sha256: Callable[[Path], str] | None = None) -> str | None:
    """Why `directory` no longer holds what `records` says (None: it does). Without `rehash`, a file whose size,
    mtime and ctime are as recorded is taken as unchanged; any other is hashed (by `sha256`, which may remember
    what it hashed: a hard link made later moves ctime, not content). ctime is what catches a file written in
    place with its mtime set back: no user can set it."""
    if not records:
        return "its manifest records no files (written by an older trtflow)"
    extra = [rel for rel in (p.relative_to(directory).as_posix() for p in _result_files(directory))
             if rel not in records]
    if extra:  # nothing unrecorded is ever read: an engine dropped into a result is not the stage's
        return f"{extra[0]} is not one of its recorded files" + (f" (and {len(extra) - 1} more)" if extra[1:] else "")
    for rel, rec in records.items():
        f = directory / rel
        if not safe_relpath(rel):
            return f"its manifest's record of {rel} is malformed"
        try:
            st = f.lstat()
        except OSError:
            return f"{rel} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{rel} is {_what(f)}, not the file it was"
        if st.st_size != rec.size:
            return f"{rel} changed size ({rec.size} -> {st.st_size} bytes)"
        if not rehash and st.st_mtime_ns == rec.mtime_ns and st.st_ctime_ns == rec.ctime_ns:
            continue
        try:
            now = files.sha256(f, follow=False) if rehash or sha256 is None else sha256(f)
        except OSError as exc:
            return f"{rel} cannot be read ({exc.strerror or exc})"
        if now != rec.sha256:
            return f"{rel} changed content (sha256 {rec.sha256[:12]} -> {now[:12]})"
    return None


def recorded_bytes(manifest: Manifest) -> int:
    """The bytes of the files a manifest records (what verifying it hashes)."""
    return sum(r.size for r in (manifest.files or {}).values())


def remove_tree(path: Path) -> None:
    """Remove a directory trtflow made, even one whose directories were made read-only since (`chmod -R a-w` on a
    result to protect it left `.trash-*` behind when it was replaced). Symlinks are removed, never followed."""
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path) or os.path.islink(path):
        return
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    for parent, dirs, _ in os.walk(path):  # os.walk follows no symlink
        for d in [parent, *(os.path.join(parent, d) for d in dirs)]:
            with contextlib.suppress(OSError):
                if not os.path.islink(d):
                    os.chmod(d, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def read_json(path: Path, limit: int = RECORD_BYTES) -> tuple[Any, str | None]:
    """(data, None), or (None, why it cannot be used) for a file that is missing, not a regular file (a symlink
    included: trtflow writes none in its store), larger than `limit` or not JSON."""
    try:
        return files.read_json(path, limit, follow=False), None
    except FileNotFoundError:
        return None, None
    except files.NotAFile as exc:
        return None, f"{exc.strerror}; ignored"
    except (OSError, ValueError) as exc:
        return None, f"{path} is unreadable ({type(exc).__name__}); ignored"


def _owner_alive(name: str) -> bool:
    """Whether the run that made staging directory `name` (`.tmp-<key>-<host>-<pid>-<rand>`) may still be alive;
    a directory from another host, or of an unknown form, is assumed alive."""
    parts = name.split("-")
    if len(parts) < 5 or parts[-3] != HOST or not parts[-2].isdigit():
        return True
    try:
        os.kill(int(parts[-2]), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@dataclass(frozen=True)
class Lookup:
    """What a store holds for (stage, key): the manifest of a usable published result, or None and why a result
    that was there is not used (empty when there was none: then the record of the stage's last run explains).
    `note`: what the store did (or, from `peek`, will do) to serve the result, for the console (a remote store's
    cached copy published again to a bucket that had lost it); empty when it was simply there."""
    manifest: Manifest | None
    rejected: str = ""
    note: str = ""


class VerifyStatus(str, Enum):
    """What `verify` found at one place of the store."""
    OK = "ok"  # a result whose files are as its manifest records
    BAD = "bad"  # a result that is not (removed by --repair)
    FOREIGN = "foreign"  # not made by trtflow: listed, never removed
    STALE_STAGING = "stale staging"  # left by a run that is gone (removed by --repair, or by the next run)


@dataclass(frozen=True)
class VerifyRow:
    stage: str
    key: str
    status: VerifyStatus
    problem: str | None = None


@dataclass
class VerifyReport:
    rows: list[VerifyRow] = field(default_factory=list)
    bytes: int = 0  # hashed

    def having(self, status: VerifyStatus) -> list[VerifyRow]:
        return [r for r in self.rows if r.status is status]


FOREIGN_PROBLEM = "not made by trtflow: left alone"


class ArtifactStore(Protocol):
    root: Path  # local: where stages read and write, the digest cache and the shared caches live
    location: str  # what users gave: the directory, or the URL of a remote store
    notes: list[str]  # what the store refused to fetch from its shared files (a remote store's), for the console
    read_only: bool
    digests: DigestCache  # sha256 of local files by stamp (the source model, data files, results on reuse)

    def ensure_writable(self) -> None: ...
    def lookup(self, stage: str, key: str) -> Lookup: ...
    def peek(self, stage: str, key: str) -> Lookup: ...
    def staging(self, stage: str, key: str) -> Path: ...
    def publish(self, stage: str, key: str, staging: Path, manifest: Manifest,
                replace: bool = False) -> tuple[Path, Manifest]: ...
    def verify(self, repair: bool = False) -> VerifyReport: ...
    def discard(self, staging: Path) -> None: ...
    # the shared caches (benchmark baselines, timing caches) of a store several machines use: fetched before a
    # stage that uses them runs, what it changed sent back after (a local store is already shared)
    def pull_shared(self) -> dict[str, tuple[int, int]]: ...
    def push_shared(self, before: dict[str, tuple[int, int]]) -> None: ...
    # a record in `shared/` that is created once and never replaced (a release's version): None when this call
    # created it, else what is there already; the store's own atomic primitive decides, on every machine at once
    def claim(self, rel: str, data: bytes) -> bytes | None: ...
    def last(self, stage: str) -> LastRun | None: ...
    def mark_last(self, stage: str, record: LastRun) -> None: ...
    def path(self, stage: str, key: str) -> Path: ...


def claim_all(store: ArtifactStore, claims: list[Claim]) -> str | None:
    """Create the records a stage's result claims in the store's shared/: None when each is now the result's (or
    was already, for the same owner), else which one another run holds."""
    for claim in claims:
        theirs = store.claim(claim.path, claim.data)
        if theirs is not None and claim.held_by_another(theirs):
            return f"shared/{claim.path} was created by another run meanwhile"
    return None


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp's 0600 would hide it from teammates sharing the store
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _bookkeeping(name: str, link: bool) -> bool:
    """Whether an entry of a stage's folder is trtflow's own and no result: its `last.json`, and (never a symlink)
    staging, trash and `last.json`'s temporary files."""
    return name == LAST or (not link and name.startswith((".tmp-", ".trash-", f".{LAST}.")))


def _named(name: str, link: bool) -> str:
    """How `verify` names what it leaves alone: a symlink says so."""
    return name + (" (a symlink)" if link else "")


class LocalStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.location = str(self.root)
        self.notes: list[str] = []
        self.read_only = False
        self.full: TrtflowError | None = None  # why it is read-only when that is a full disk or quota
        self._digests: DigestCache | None = None

    @property
    def digests(self) -> DigestCache:
        """sha256 of files by their stamp, in `<root>/digests.json` (kept in memory only on a read-only store)."""
        if self._digests is None:
            writable = self.root.is_dir() and not self.read_only
            self._digests = DigestCache(self.root / DIGESTS if writable else None)
        return self._digests

    def ensure_writable(self) -> None:
        """Create the store if needed; a store that exists but cannot be written (CI reading a store someone
        else filled) is opened read-only: it serves what is published, and refuses only work that must run."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            # a full store still serves what it holds; a stage that must run is told it is full, not read-only
            self.full = disk_error(exc, self.root, "the artifact store") if exc.errno != errno.EROFS else None
            if not (self.root.is_dir() and os.access(self.root, os.R_OK | os.X_OK)):
                raise StoreError(f"cannot write the artifact store at {self.root}: {exc.strerror or exc}; "
                                 f"choose another with --store or the pipeline's 'artifacts:' key") from None
            self.read_only = True
            return
        try:
            if not (self.root / MARKER).is_file():
                write_json_atomic(self.root / MARKER, MARKER_CONTENT)
                if not (self.root / GITIGNORE).exists():  # a store inside a model repo is not its source
                    (self.root / GITIGNORE).write_text("# trtflow's artifact store: results, not source\n*\n")
        except OSError as exc:
            self.full = disk_error(exc, self.root, "the artifact store")
            if self.full is None:
                raise
            self.read_only = True
        self.clean_staging()

    def is_store(self) -> bool:
        """The root carries trtflow's marker, or (a store made before the marker) holds a trtflow manifest."""
        if (self.root / MARKER).is_file():
            return True
        return any(Manifest.parse(read_json(d / MANIFEST, MANIFEST_BYTES)[0], d.name) for _, d in self._walk()[0])

    def _walk(self) -> tuple[list[tuple[str, Path]], list[str]]:
        """What lies under the root: (stage, directory) of every result (`<stage>/<32 hex>/`, real directories:
        a symlinked stage or result is never followed), and the names of what trtflow did not make (left alone
        by `verify --repair`). trtflow's own files (`last.json`, `digests.json`, staging, the marker) are in neither."""
        results: list[tuple[str, Path]] = []
        foreign: list[str] = []
        for stage in sorted(self.root.iterdir()) if self.root.is_dir() else []:
            if stage.name.startswith(".") or stage.name in (SHARED, DIGESTS):
                continue
            if stage.is_symlink() or not stage.is_dir():
                foreign.append(_named(stage.name, stage.is_symlink()))
                continue
            for d in sorted(stage.iterdir()):
                link = d.is_symlink()
                if KEY_NAME.fullmatch(d.name) and d.is_dir() and not link:
                    results.append((stage.name, d))
                elif not _bookkeeping(d.name, link):
                    foreign.append(_named(f"{stage.name}/{d.name}", link))
        return results, foreign

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def lookup(self, stage: str, key: str) -> Lookup:
        """The manifest of a published OK result whose files are as recorded; otherwise none, and why when a
        result was there."""
        directory = self.path(stage, key)
        data, problem = read_json(directory / MANIFEST, MANIFEST_BYTES)
        if data is None:
            return Lookup(None, problem or "")
        manifest = Manifest.parse(data, key)
        if manifest is None:
            return Lookup(None, f"{directory / MANIFEST} is not a trtflow manifest; ignored")
        if not manifest.ok:
            return Lookup(None)
        problem = check_files(directory, manifest.files, sha256=self.digests.sha256)
        if problem:
            return Lookup(None, f"its stored result failed verification: {problem}")
        return Lookup(manifest)

    peek = lookup  # what `plan` asks: here as cheap as the lookup itself

    def staging(self, stage: str, key: str) -> Path:
        if self.full is not None:
            raise self.full
        if self.read_only:
            raise StoreError(f"stage '{stage}' must run but the artifact store at {self.root} is read-only; "
                             f"give a writable one with --store")
        parent = self.root / stage
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:12]}-{HOST}-{os.getpid()}-", dir=parent))
        staging.chmod(0o777 & ~umask())  # mkdtemp's 0700 would hide a shared store's results from teammates
        return staging

    def clean_staging(self) -> list[Path]:
        """Remove staging (and half-removed trash) left by runs that died; returns what was removed."""
        removed = []
        for d in self._staging_dirs():
            if d.name.startswith(".trash-") or not _owner_alive(d.name):
                remove_tree(d)
                removed.append(d)
        return removed

    def _staging_dirs(self) -> list[Path]:
        return [d for d in list(self.root.glob("*/.tmp-*")) + list(self.root.glob("*/.trash-*"))
                if d.is_dir() and not d.is_symlink() and not d.parent.is_symlink()]

    def publish(self, stage: str, key: str, staging: Path, manifest: Manifest,
                replace: bool = False) -> tuple[Path, Manifest]:
        """Move `staging` into place as the result of (stage, key); returns its directory and the manifest that
        is published there. An OK result already in place (a concurrent run that won) is kept, and its manifest
        returned, unless `replace` (a forced re-run: its result, whatever the verdict, is the one that counts)."""
        for f in staging.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if manifest.files is None:
            manifest = manifest.model_copy(update={"files": file_records(staging)})
        write_json_atomic(staging / MANIFEST, manifest.to_json())  # last: its presence means complete
        _fsync_dir(staging)
        target = self.path(stage, key)
        for attempt in range(3):
            if target.exists():  # a broken earlier publish, a concurrent run that won, or what a forced run replaces
                if not replace:
                    existing = self.lookup(stage, key).manifest
                    if existing is not None:
                        remove_tree(staging)
                        return target, existing
                self._drop(target)
            try:
                os.replace(staging, target)
                break
            except OSError as exc:  # another run published the key between the check and the rename
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or attempt == 2:
                    raise
        _fsync_dir(target.parent)
        return target, manifest

    def drop(self, stage: str, key: str) -> None:
        """Remove the published result of (stage, key) (a remote store's cached copy that failed verification)."""
        self._drop(self.path(stage, key))

    def _drop(self, directory: Path) -> None:
        """Remove a published directory: renamed first, so no reader sees it half-deleted."""
        trash = directory.with_name(f".trash-{directory.name[:12]}-{uuid.uuid4().hex[:8]}")
        try:
            os.replace(directory, trash)
        except FileNotFoundError:  # another run dropped it first
            return
        remove_tree(trash)

    def verify(self, repair: bool = False) -> VerifyReport:
        """Hash every file of every published result against its manifest. With `repair`, results that do not
        match (and staging left by dead runs) are removed, so the next run recomputes them. A directory that is
        not a store is refused before anything is read; what trtflow did not make is listed, never removed."""
        if not self.is_store():
            raise StoreError(f"{self.root} is not a trtflow artifact store (no {MARKER} and no trtflow manifest): "
                             f"nothing was checked or removed",
                             hint="give the store's directory: the pipeline's 'artifacts:', .trtflow by default")
        report = VerifyReport()
        results, foreign = self._walk()
        for stage, directory in results:
            data, problem = read_json(directory / MANIFEST, MANIFEST_BYTES)
            manifest = Manifest.parse(data, directory.name)
            if data is None:
                problem = problem or "no manifest (an interrupted publish)"
            elif manifest is None:
                problem = "its manifest is not a trtflow manifest"
            else:
                problem = check_files(directory, manifest.files, rehash=True)
                report.bytes += recorded_bytes(manifest)
            status = VerifyStatus.OK if problem is None else VerifyStatus.BAD
            report.rows.append(VerifyRow(stage, directory.name, status, problem))
            if problem and repair:
                self._drop(directory)
        report.rows += [VerifyRow(name, "", VerifyStatus.FOREIGN, FOREIGN_PROBLEM) for name in foreign]
        report.rows += [VerifyRow(d.parent.name, d.name, VerifyStatus.STALE_STAGING, "staging of a run that is gone")
                        for d in self._staging_dirs() if d.name.startswith(".tmp-") and not _owner_alive(d.name)]
        if repair:
            self.clean_staging()
        return report

    def discard(self, staging: Path) -> None:
        remove_tree(staging)

    def pull_shared(self) -> dict[str, tuple[int, int]]:
        return {}

    def push_shared(self, before: dict[str, tuple[int, int]]) -> None:
        pass

    def claim(self, rel: str, data: bytes) -> bytes | None:
        shared = self.root / SHARED
        try:
            shared.mkdir(parents=True, exist_ok=True)
            if paths.create_exclusive(shared, rel, data):
                return None
            return files.read_bounded(paths.under(shared, rel), CLAIM_BYTES, follow=False)
        except (paths.OutsidePath, files.NotAFile) as exc:
            raise StoreError(f"the artifact store's shared/{rel} cannot be written: {exc}",
                             hint="replace the symlink or file there by the directory or record trtflow made") \
                from None

    def last(self, stage: str) -> LastRun | None:
        return LastRun.parse(read_json(self.root / stage / LAST)[0])

    def mark_last(self, stage: str, record: LastRun) -> None:
        if self.read_only:
            return
        try:
            (self.root / stage).mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.root / stage / LAST, record.to_json())
        except OSError as exc:  # only the explanation `plan` gives: a full disk is said by what could not be written
            if disk_cause(exc) is None:
                raise
