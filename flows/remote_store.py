"""An artifact store at an fsspec URL (`s3://bucket/prefix`, any fsspec file system), shared by workers on several
machines, with a local store as each machine's cache: stages read and write local files; results are published to
the URL for everyone and fetched from it (and verified) on first use. The cache is only a cache: a result in it is
served while the URL holds it too (one read of its manifest per lookup); one the URL lost (a bucket emptied or
recreated) is hashed in full and published again, or else not used (see `RemoteStore._confirm`).

Layout under the URL: `<stage>/<key>/manifest.json` (the commit point, written last) and the files under
`<stage>/<key>/<writer>/`, where `<writer>` is unique per publishing run. Concurrent writers of one key each upload
to their own `<writer>/`; the manifest is created only if absent (S3's conditional `If-None-Match: *`), so the first
writer wins, the others adopt its result, and a manifest always names one writer's complete files: never a mix.
On a server that ignores the condition, the last manifest written wins, still whole; each writer reads the
manifest back and adopts what is there.

Credentials and endpoints come from the usual places (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `~/.aws`, or
fsspec's `FSSPEC_S3_*` variables), or from a Prefect block (`store_credentials.py`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from trtflow import files, settings
from trtflow.artifact import CLAIM_BYTES
from trtflow.errors import StoreError
from trtflow.files import MANIFEST_BYTES, RECORD_BYTES
from trtflow.flows.digest import DigestCache
from trtflow.flows.keys import LastRun
from trtflow.flows.manifest import MANIFEST, Manifest
from trtflow.flows.store import (
    FOREIGN_PROBLEM,
    HOST,
    KEY_NAME,
    LAST,
    MARKER,
    MARKER_CONTENT,
    SHARED,
    LocalStore,
    Lookup,
    VerifyReport,
    VerifyRow,
    VerifyStatus,
    check_files,
    file_records,
    local_stamps,
    recorded_bytes,
)
from trtflow.flows.store_credentials import storage_options
from trtflow.paths import OutsidePath, under
from trtflow.pipelines.kinds import KINDS

QUARANTINE = ".quarantine"  # results whose files failed verification when fetched (see _quarantine)
WRITER_NAME = re.compile(r"[A-Za-z0-9_.]+-\d+-[0-9a-f]{8}")  # f"{HOST}-{pid}-{8 hex}", see publish


def cache_root(url: str) -> Path:
    """This machine's cache of the remote store: `$TRTFLOW_CACHE_DIR/<slug>`, else `~/.cache/trtflow/stores/`."""
    base = settings.CACHE_DIR.get() or \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trtflow" / "stores"
    slug = re.sub(r"[^A-Za-z0-9]+", "-", url.split("://", 1)[1]).strip("-")[:60]
    return base / f"{slug}-{hashlib.sha256(url.encode()).hexdigest()[:8]}"


class RemoteStore:
    def __init__(self, url: str, cache: Path | None = None):
        import fsspec

        self.location = url.rstrip("/")
        try:
            # no instance cache: fsspec would hand back a file system made for other credentials or endpoints
            self.fs, self.base = fsspec.core.url_to_fs(self.location, use_listings_cache=False,
                                                       skip_instance_cache=True, **storage_options(self.location))
        except ImportError as exc:  # a known protocol whose fsspec backend is not installed
            raise StoreError(f"cannot open the artifact store {url}: {exc}",
                             hint="pip install trtflow[s3] for s3:// URLs") from None
        except ValueError as exc:
            raise StoreError(f"cannot open the artifact store {url}: {exc}",
                             hint="give a directory or an fsspec URL such as s3://bucket/prefix") from None
        self.cache = LocalStore(cache or cache_root(self.location))
        self.root = self.cache.root  # local paths (digest cache, shared caches, what stages read) live here
        self.notes: list[str] = []  # what was refused from the store's shared files, for the console
        self.read_only = False

    def _remote(self, *parts: str) -> str:
        return "/".join([self.base.rstrip("/"), *parts])

    def _cat(self, path: str, limit: int) -> bytes:
        """The object at `path`, reading at most `limit` bytes (ValueError beyond: a 50 GB object where a manifest
        belongs would exhaust memory). FileNotFoundError and backend errors pass through."""
        data = self.fs.cat_file(path, start=0, end=limit + 1)
        if len(data) > limit:
            raise ValueError(f"more than {limit} bytes")
        return data

    def _cat_json(self, path: str, limit: int = MANIFEST_BYTES) -> Any:
        return json.loads(self._cat(path, limit))

    @property
    def digests(self) -> DigestCache:
        return self.cache.digests

    def _fail(self, doing: str, exc: BaseException) -> StoreError:
        return StoreError(f"artifact store {self.location}: {doing} failed: {type(exc).__name__}: {exc}",
                          hint="check the URL, the credentials (AWS_* variables or ~/.aws) and the endpoint")

    # --- the protocol -------------------------------------------------------------------------------------------

    def ensure_writable(self) -> None:
        self.cache.ensure_writable()
        probe = self._remote(f".probe-{uuid.uuid4().hex}")
        try:
            self.fs.pipe_file(probe, b"")
            self.fs.rm_file(probe)
        except PermissionError:
            self.read_only = True
            return
        except FileNotFoundError as exc:  # no such bucket
            raise self._fail("opening", exc) from None
        except Exception as exc:  # noqa: BLE001 - network and credential errors of any fsspec backend
            raise self._fail("opening", exc) from None
        try:
            if not self.fs.exists(self._remote(MARKER)):
                self.fs.pipe_file(self._remote(MARKER), json.dumps(MARKER_CONTENT).encode())
        except Exception as exc:  # noqa: BLE001
            raise self._fail("marking the store", exc) from None

    def path(self, stage: str, key: str) -> Path:
        return self.cache.path(stage, key)

    def lookup(self, stage: str, key: str) -> Lookup:
        """The published result of (stage, key), from this machine's cache when the URL holds it too (see
        `_confirm`: one read of its manifest there), else fetched from the URL and verified; else why not."""
        local = self.cache.lookup(stage, key)
        if local.manifest is not None:
            return self._confirm(stage, key, local.manifest, act=True)
        found = self._published(stage, key, local)
        return found if found.manifest is None else self._fetch(stage, key, found.manifest)

    def peek(self, stage: str, key: str) -> Lookup:
        """The manifest of a usable published result, without fetching its files (what `plan` needs); else why a
        result there is not used (one that was quarantined included). What `lookup` would do about this machine's
        cached copy is said (`Lookup.note`), not done."""
        local = self.cache.lookup(stage, key)
        if local.manifest is not None:
            return self._confirm(stage, key, local.manifest, act=False)
        return self._published(stage, key, local)

    def _confirm(self, stage: str, key: str, mine: Manifest, act: bool) -> Lookup:
        """This machine's cached result of (stage, key) is a cache of the URL's, never a result of its own: it is
        served when the manifest published at the URL records the same files (one small read, what any lookup in
        a shared store costs; nothing listed or downloaded). Otherwise (`act`: `lookup`; else `peek`, which only
        says what `lookup` would do):
        - another OK result of the key is published (a forced run elsewhere, or another machine's after the bucket
          was emptied): that one is fetched in place of the cached copy, as a writer that loses a race adopts the
          winner's;
        - a failed run's result, or an unusable manifest, is there: a miss (the stage runs, as on any machine);
        - nothing is there (a bucket recreated or emptied): the cached copy is hashed in full and published again
          through the usual conditional create (another machine's publication meanwhile is adopted); a copy that
          fails is discarded and the stage runs; a read-only store cannot publish it: a miss, saying why.
        A URL that cannot be read is a StoreError, as for any lookup there."""
        theirs, rejected = self._remote_manifest(stage, key)
        if theirs is not None and theirs.ok:
            if _same_files(mine, theirs):
                return Lookup(mine)
            if not act:
                return Lookup(theirs, note=f"{self.location} holds another result of this key than this machine's "
                                           f"cache: it will be fetched in place of the cached copy")
            found = self._fetch(stage, key, theirs)
            if found.manifest is None:
                return found
            note = (f"{self.location} holds another result of this key than this machine's cache (published "
                    f"elsewhere): fetched in place of the cached copy")
            self._note(f"{stage} {key[:8]}: {note}")
            return dataclasses.replace(found, note=note)
        if theirs is not None:
            return Lookup(None, f"the result stored at {self.location} is a failed run's; this machine's cache "
                                f"holds another one, which is not the store's: not used")
        if rejected:
            return Lookup(None, rejected)
        if self.read_only:
            return Lookup(None, f"not in the store at {self.location}: only this machine's cache holds it (the "
                                f"store is read-only: it cannot be published again)")
        if not act:
            return Lookup(mine, note=f"missing from {self.location}: this machine's cached copy will be verified "
                                     f"and published again")
        problem = check_files(self.path(stage, key), mine.files, rehash=True)
        if problem:
            with contextlib.suppress(OSError):  # (a cache that cannot be written: it is not served all the same)
                self.cache.drop(stage, key)
            why = (f"missing from {self.location}, and this machine's cached copy failed verification "
                   f"({problem}): discarded, not published")
            self._note(f"{stage} {key[:8]} was {why}")
            return Lookup(None, why)
        _, adopted = self._upload(stage, key, self.path(stage, key), mine, replace=False)
        if adopted is not None:
            note = f"missing from {self.location}: another run published it again meanwhile; that result is used"
            self._note(f"{stage} {key[:8]} was {note}")
            return Lookup(adopted, note=note)
        note = f"missing from {self.location}: published again from this machine's verified copy"
        self._note(f"{stage} {key[:8]} was {note}")
        return Lookup(mine, note=note)

    def _published(self, stage: str, key: str, local: Lookup) -> Lookup:
        """The OK manifest published at the URL; else why not (a quarantine record, then an unusable manifest,
        then what the local cache said)."""
        manifest, rejected = self._remote_manifest(stage, key)
        if manifest is None:
            return Lookup(None, self._quarantined(stage, key) or rejected or local.rejected)
        return Lookup(manifest if manifest.ok else None, local.rejected)

    def staging(self, stage: str, key: str) -> Path:
        if self.read_only:
            raise StoreError(f"stage '{stage}' must run but the artifact store at {self.location} is read-only; "
                             f"give a writable one with --store")
        return self.cache.staging(stage, key)

    def publish(self, stage: str, key: str, staging: Path, manifest: Manifest,
                replace: bool = False) -> tuple[Path, Manifest]:
        if not replace:
            theirs, _ = self._remote_manifest(stage, key)
            if theirs is not None and theirs.ok:
                adopted = self._fetch(stage, key, theirs).manifest  # (one that fails verification is quarantined:
                if adopted is not None:                             # ours takes its place)
                    self.cache.discard(staging)
                    return self.path(stage, key), adopted
        ours, adopted = self._upload(stage, key, staging, manifest.model_copy(update={"files": file_records(staging)}),
                                     replace)
        if adopted is not None:
            self.cache.discard(staging)
            return self.path(stage, key), adopted
        return self.cache.publish(stage, key, staging, ours, replace=True)

    def _upload(self, stage: str, key: str, source: Path, manifest: Manifest,
                replace: bool) -> tuple[Manifest, Manifest | None]:
        """Upload the files `manifest` records, from `source`, to a writer directory of this run's own, then the
        manifest naming it: created only if absent unless `replace`. Returns (our manifest, None) when ours is the
        one in place; else (ours, the one adopted): another writer's OK result, fetched into the cache (in place of
        a differing cached copy), our upload removed. A failed run's result, or one whose files fail verification,
        is replaced by ours, whole (as a local store replaces a result that is not OK)."""
        writer = f"{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        manifest = manifest.model_copy(update={"blobs": writer})
        data = json.dumps(manifest.to_json(), indent=2, sort_keys=True).encode()
        target = self._remote(stage, key, MANIFEST)
        try:
            for rel in manifest.files or {}:
                self.fs.put_file(str(source / rel), self._remote(stage, key, writer, rel))
            try:
                self.fs.pipe_file(target, data, **({} if replace else {"mode": "create"}))
            except OSError as exc:
                if not _precondition_failed(exc):
                    raise
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            self._remove_blobs(stage, key, writer)
            raise self._fail(f"publishing {stage}/{key[:12]}", exc) from None
        placed, _ = self._remote_manifest(stage, key)
        if placed is None or placed.blobs == writer:
            return manifest, None
        # another writer's manifest is the one in place
        adopted = self._adoptable(stage, key, placed)
        if adopted is None:  # a failed run's, or its files fail verification (and could not be quarantined): ours
            placed = self._replace_whole(stage, key, writer, target, data)  # replace it, whole
            if placed is not None and placed.blobs == writer:
                return manifest, None
            adopted = self._adoptable(stage, key, placed)
        self._remove_blobs(stage, key, writer)
        if adopted is not None:
            return manifest, adopted
        raise StoreError(f"artifact store {self.location}: {stage}/{key[:12]} was published by another "
                         f"run meanwhile and cannot be fetched; run again")

    def _adoptable(self, stage: str, key: str, placed: Manifest | None) -> Manifest | None:
        """Another writer's result in place, fetched into the cache, where it is OK and its files verify; else
        None."""
        return self._fetch(stage, key, placed).manifest if placed is not None and placed.ok else None

    def _replace_whole(self, stage: str, key: str, writer: str, target: str, data: bytes) -> Manifest | None:
        """Our manifest written over the one in place, which may not stay; the manifest in place after it."""
        try:
            self.fs.pipe_file(target, data)
        except Exception as exc:  # noqa: BLE001
            self._remove_blobs(stage, key, writer)
            raise self._fail(f"publishing {stage}/{key[:12]}", exc) from None
        return self._remote_manifest(stage, key)[0]

    def discard(self, staging: Path) -> None:
        self.cache.discard(staging)

    def pull_shared(self) -> dict[str, tuple[int, int]]:
        """The synced part of `shared/` (benchmark baselines, TensorRT timing caches, the versions released: small,
        and useful to every machine) fetched from the URL into the local cache; returns the local files' (size,
        mtime) after it, for `push_shared`. The engine cache is not synced: published build results already carry
        the engines. Anyone who can write to the bucket can list a key there: a key that would land outside the
        local `shared/` (`..`, an absolute path, a symlink on the way) or an object larger than its kind is
        refused, named in `notes`, never fetched. Best effort otherwise: a cache that cannot be fetched costs time,
        not correctness."""
        local = self.root / SHARED
        try:
            remote = self.fs.find(self._remote(SHARED), detail=True)
        except Exception:  # noqa: BLE001 - no shared files yet, or the backend failed: work from the local ones
            remote = {}
        prefix = self._remote(SHARED).rstrip("/") + "/"
        local.mkdir(parents=True, exist_ok=True)
        for path, info in remote.items():
            rel = path[len(prefix):] if path.startswith(prefix) else None
            limit = _synced(rel) if rel is not None else None
            if limit is None:
                continue
            size = info.get("size")
            if not isinstance(size, int) or size > limit:
                self._note(f"{self.location}: shared/{rel[:200]} is {size} bytes, more than the {limit} a file of "
                           f"its kind may have: not fetched")
                continue
            try:
                dest = under(local, rel, make_parents=True)
            except OutsidePath as exc:
                self._note(f"{self.location}: a shared file's key leaves the store and was not fetched ({exc})")
                continue
            if files.is_regular(dest) and dest.stat().st_size == size:
                continue  # (a baseline is rewritten whole; the same size is the same record in practice)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
            try:
                self.fs.get_file(path, str(tmp))
                if tmp.stat().st_size > limit:  # it grew after the listing
                    raise ValueError("too large")
                os.replace(tmp, dest)
            except Exception:  # noqa: BLE001
                tmp.unlink(missing_ok=True)
                continue
        return _snapshot(local)

    def push_shared(self, before: dict[str, tuple[int, int]]) -> None:
        """Send the synced files of `shared/` the stage wrote or changed to the URL (last writer wins per file:
        a baseline is per engine, a timing cache per TensorRT version). Claimed records are sent by `claim`."""
        for rel, stat in _snapshot(self.root / SHARED).items():
            if before.get(rel) != stat and not _claimed(rel):
                try:
                    self.fs.put_file(str(self.root / SHARED / rel), self._remote(SHARED, *rel.split("/")))
                except Exception:  # noqa: BLE001 - the next run on this machine still has it locally
                    continue

    def claim(self, rel: str, data: bytes) -> bytes | None:
        """Create `shared/<rel>` at the URL only if absent (S3's conditional `If-None-Match: *`): the first machine
        wins; the others get what it wrote. Then the local copy, as `pull_shared` would fetch it."""
        target = self._remote(SHARED, *rel.split("/"))
        try:
            try:
                self.fs.pipe_file(target, data, mode="create")
                placed = self._cat(target, CLAIM_BYTES)  # a server that ignores the condition: who won is read back
            except Exception as exc:  # noqa: BLE001
                if not _precondition_failed(exc):
                    raise
                placed = self._cat(target, CLAIM_BYTES)
        except ValueError as exc:
            raise StoreError(f"{target}: {exc}: not a record trtflow wrote", hint="remove it from the store") \
                from None
        except Exception as exc:  # noqa: BLE001 - network and credential errors of any fsspec backend
            raise self._fail(f"claiming shared/{rel}", exc) from None
        self.cache.claim(rel, placed)
        return None if placed == data else placed

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def clean_staging(self) -> list[Path]:
        return self.cache.clean_staging()

    def last(self, stage: str) -> LastRun | None:
        try:
            data = self._cat_json(self._remote(stage, LAST), RECORD_BYTES)
        except FileNotFoundError:
            return self.cache.last(stage)
        except Exception:  # noqa: BLE001 - unreadable: the explanation falls back to what this machine knows
            return self.cache.last(stage)
        return LastRun.parse(data)

    def mark_last(self, stage: str, record: LastRun) -> None:
        self.cache.mark_last(stage, record)
        if self.read_only:
            return
        try:
            self.fs.pipe_file(self._remote(stage, LAST), json.dumps(record.to_json(), indent=2).encode())
        except Exception:  # noqa: BLE001 - advisory (explains `plan`); the result itself is published already
            pass

    def verify(self, repair: bool = False) -> VerifyReport:
        """Every published result under the URL hashed (streamed) against its manifest; uploads no manifest names
        (a writer that lost a race, or died before its manifest) listed, and removed with `repair`; every
        manifest's inputs checked against the results they were read from. Then the local cache."""
        listing = self._listing()
        ours = listing.results()
        if MARKER not in listing.paths and not any(MANIFEST in listing.children[pair] for pair in ours):
            raise StoreError(f"{self.location} is not a trtflow artifact store (no {MARKER} and no trtflow "
                             f"manifest): nothing was checked or removed",
                             hint="give the store's URL: the pipeline's 'artifacts:'")
        report = VerifyReport(rows=[VerifyRow(f"{stage}/{key}", "", VerifyStatus.FOREIGN, FOREIGN_PROBLEM)
                                    for stage, key in listing.foreign(ours)])
        manifests: dict[tuple[str, str], Manifest] = {}
        for stage, key in ours:
            manifest = self._verify_result(stage, key, listing.subdirs[(stage, key)], repair, report)
            if manifest is not None:
                manifests[(stage, key)] = manifest
        report.rows += self._consistency(manifests)
        if self.cache.is_store():
            local = self.cache.verify(repair=repair)
            report.rows += [dataclasses.replace(r, stage=f"(cache) {r.stage}") for r in local.rows]
            report.bytes += local.bytes
        return report

    def _listing(self) -> _Listing:
        """Every object under the URL, in one listing."""
        try:
            self.fs.ls(self.base.split("/", 1)[0])  # the bucket (or top directory): missing or denied is an error
            entries = self.fs.find(self.base, withdirs=False)
        except Exception as exc:  # noqa: BLE001 - network and credential errors of any fsspec backend
            raise self._fail("listing", exc) from None
        return _Listing([e[len(self.base.rstrip("/")) + 1:] for e in entries])

    def _verify_result(self, stage: str, key: str, writers: set[str], repair: bool,
                       report: VerifyReport) -> Manifest | None:
        """One result's row (and one per upload its manifest does not name) added to `report`; with `repair`, a
        bad result's objects and the orphaned uploads are removed. Returns its manifest, when it has one."""
        problem, manifest = self._check_result(stage, key)
        if manifest is not None:
            report.bytes += recorded_bytes(manifest)
        report.rows.append(VerifyRow(stage, key, VerifyStatus.OK if problem is None else VerifyStatus.BAD, problem))
        for orphan in sorted(writers - {manifest.blobs if manifest else None}):
            if not WRITER_NAME.fullmatch(orphan):
                report.rows.append(VerifyRow(f"{stage}/{key}/{orphan}", "", VerifyStatus.FOREIGN, FOREIGN_PROBLEM))
                continue
            report.rows.append(VerifyRow(stage, f"{key}/{orphan}", VerifyStatus.STALE_STAGING,
                                         "files no manifest names (a run that lost the race or died)"))
            if repair:
                self._remove_blobs(stage, key, orphan)
        if problem and repair:  # only trtflow's own objects of this key: the manifest and writer directories
            for name in writers:
                if WRITER_NAME.fullmatch(name):
                    self._remove_blobs(stage, key, name)
            try:
                self.fs.rm_file(self._remote(stage, key, MANIFEST))
            except FileNotFoundError:
                pass
        return manifest

    def _check_result(self, stage: str, key: str) -> tuple[str | None, Manifest | None]:
        """(what is wrong with the published result, None when nothing; its manifest, when it has one)."""
        try:
            data = self._cat_json(self._remote(stage, key, MANIFEST))
        except FileNotFoundError:
            return "no manifest (an interrupted publish)", None
        except ValueError as exc:
            return f"its manifest is not JSON ({exc})", None
        manifest = _parse(data, key)
        if manifest is None:
            return "its manifest is not a trtflow manifest", None
        return self._check_remote_files(stage, key, manifest), manifest

    # --- helpers ------------------------------------------------------------------------------------------------

    def _remote_manifest(self, stage: str, key: str) -> tuple[Manifest | None, str]:
        """The manifest published at the URL (None: none, or one that is unusable, and why)."""
        try:
            data = self._cat_json(self._remote(stage, key, MANIFEST))
        except FileNotFoundError:
            return None, ""
        except ValueError as exc:
            return None, f"{self.location}/{stage}/{key}/{MANIFEST} is not JSON ({exc}); ignored"
        except Exception as exc:  # noqa: BLE001
            raise self._fail(f"reading {stage}/{key[:12]}", exc) from None
        manifest = _parse(data, key)
        return manifest, "" if manifest is not None else f"{self.location}/{stage}/{key}/{MANIFEST} is not a " \
                                                          f"trtflow manifest"

    def _fetch(self, stage: str, key: str, manifest: Manifest) -> Lookup:
        """Download a published result into the local cache, verified against its manifest (in place of another
        result of the key cached here: that one is not the store's); nothing when the cache holds its files."""
        cached = self.cache.lookup(stage, key).manifest
        if cached is not None and _same_files(cached, manifest):
            return Lookup(cached)
        staging = self.cache.staging(stage, key)
        try:
            for rel in manifest.files or {}:
                dest = staging / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(self._remote(stage, key, manifest.blobs, rel), str(dest))
        except FileNotFoundError as exc:
            self.cache.discard(staging)
            return Lookup(None, f"its stored result at {self.location} is incomplete ({exc})")
        except Exception as exc:  # noqa: BLE001
            self.cache.discard(staging)
            raise self._fail(f"fetching {stage}/{key[:12]}", exc) from None
        problem = check_files(staging, manifest.files, rehash=True)
        if problem:
            self.cache.discard(staging)
            self._quarantine(stage, key, manifest, problem)
            return Lookup(None, f"its stored result at {self.location} failed verification: {problem}; quarantined")
        # the files were just hashed against the manifest: only their times are this machine's own
        local = manifest.model_copy(update={"files": local_stamps(staging, manifest.files or {})})
        _, placed = self.cache.publish(stage, key, staging, local, replace=cached is not None)
        return Lookup(placed)

    def _quarantine(self, stage: str, key: str, manifest: Manifest, problem: str) -> None:
        """Take a published result whose files fail verification out of use, so that the stage runs again and its
        result is published in its place: the manifest and the writer's files move to `.quarantine/<stage>/<key>/
        <writer>/` with `reason.json` (what failed, where, when). Best effort: a run that cannot move it still
        recomputes the stage; `verify --repair` removes what is left."""
        import datetime

        where = (QUARANTINE, stage, key, manifest.blobs)
        at = datetime.datetime.now(datetime.timezone.utc).isoformat()
        reason = QuarantineRecord(problem=problem, host=HOST, at=at, manifest=manifest.to_json())
        try:
            self.fs.pipe_file(self._remote(*where, "reason.json"), reason.model_dump_json(indent=2).encode())
            current, _ = self._remote_manifest(stage, key)
            if current is not None and current.blobs == manifest.blobs:  # not a result published meanwhile
                self.fs.rm_file(self._remote(stage, key, MANIFEST))
            self.fs.mv(self._remote(stage, key, manifest.blobs), self._remote(*where, "files"), recursive=True)
        except Exception:  # noqa: BLE001 - any backend error: the stage runs again all the same
            pass

    def _quarantined(self, stage: str, key: str) -> str:
        """Why a result of this key was quarantined (why `plan` says the stage must run); empty when none was."""
        try:
            found = self.fs.glob(self._remote(QUARANTINE, stage, key, "*", "reason.json"))
            reason = QuarantineRecord.model_validate(self._cat_json(found[0], RECORD_BYTES)) if found else None
        except Exception:  # noqa: BLE001 - an unreadable quarantine record says nothing about the result
            return ""
        if reason is None:
            return ""
        return (f"its stored result at {self.location} failed verification on {reason.host} ({reason.problem}) "
                f"and was quarantined")

    def _check_remote_files(self, stage: str, key: str, manifest: Manifest) -> str | None:
        records = manifest.files
        if not records:
            return "its manifest records no files"
        for rel, rec in records.items():
            try:
                with self.fs.open(self._remote(stage, key, manifest.blobs, rel), "rb") as fh:
                    digest, size = files.digest_stream(fh)
            except FileNotFoundError:
                return f"{rel} is missing"
            if size != rec.size:
                return f"{rel} changed size ({rec.size} -> {size} bytes)"
            if digest != rec.sha256:
                return f"{rel} changed content (sha256 {rec.sha256[:12]} -> {digest[:12]})"
        return None

    @staticmethod
    def _consistency(manifests: dict[tuple[str, str], Manifest]) -> list[VerifyRow]:
        """A result whose inputs name a published result (…/<stage>/<key>/…) must have read what is published
        there: the digest it recorded is one of that result's outputs'."""
        rows = []
        for (stage, key), m in manifests.items():
            for slot, arts in m.inputs.items():
                for art in arts if isinstance(arts, list) else [arts]:
                    if not art.digest:
                        continue
                    parts = Path(art.path).parts
                    source = next(((parts[i], parts[i + 1]) for i in range(len(parts) - 1)
                                   if (parts[i], parts[i + 1]) in manifests), None)
                    if source is None:
                        continue
                    digests = {o.digest for o in manifests[source].outputs.values()}
                    if art.digest not in digests:
                        rows.append(VerifyRow(stage, key, VerifyStatus.BAD,
                                              f"input '{slot}' was read from {source[0]}/{source[1][:12]} with "
                                              f"digest {art.digest[:12]}, which that published result does "
                                              f"not hold (two runs published it differently)"))
        return rows

    def _remove_blobs(self, stage: str, key: str, writer: str) -> None:
        try:
            self.fs.rm(self._remote(stage, key, writer), recursive=True)
        except Exception:  # noqa: BLE001 - leftover uploads are listed and removed by `verify --repair`
            pass


class QuarantineRecord(BaseModel):
    """`reason.json` beside a quarantined result: what failed, on which host, when, and the manifest it had."""
    model_config = ConfigDict(extra="allow")

    problem: str | None = None
    host: str | None = None
    at: str | None = None
    manifest: dict[str, Any] = {}


class _Listing:
    """The objects under a store's URL (paths relative to it), grouped by the `<stage>/<key>` they lie under."""

    def __init__(self, paths: list[str]):
        self.paths = paths
        self.children: dict[tuple[str, str], set[str]] = {}  # the names directly under <stage>/<key>
        self.subdirs: dict[tuple[str, str], set[str]] = {}  # those of them that are directories
        for p in paths:
            parts = p.split("/")
            if len(parts) >= 2:
                self.children.setdefault((parts[0], parts[1]), set()).update(parts[2:3])
                self.subdirs.setdefault((parts[0], parts[1]), set()).update(parts[2:3] if len(parts) >= 4 else ())

    def results(self) -> list[tuple[str, str]]:
        """Key directories trtflow made: holding a manifest or a writer's files."""
        return [(stage, key) for stage, key in sorted(self.children) if not stage.startswith(".") and stage != SHARED
                and KEY_NAME.fullmatch(key)
                and (MANIFEST in self.children[(stage, key)] or any(map(WRITER_NAME.fullmatch,
                                                                        self.children[(stage, key)])))]

    def foreign(self, ours: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """What lies there that trtflow did not make (its own files, `last.json` and `shared/` aside)."""
        return [(stage, key) for stage, key in sorted(set(self.children) - set(ours))
                if not stage.startswith(".") and stage != SHARED and key != LAST]


def _synced_limits() -> dict[str, int]:
    """The parts of `shared/` a remote store keeps for every machine, as the kinds' rows declare them (`shared`:
    benchmark baselines, timing caches, the versions released so far): prefix -> how large a file there may be."""
    return {area.prefix: area.max_bytes for row in KINDS.values() for area in row.shared}


def _claimed(rel: str) -> bool:
    """A record created once by `claim` (a kind's row says which prefixes: the versions released), never sent by
    `push_shared`."""
    return any(area.claimed and rel.startswith(area.prefix) for row in KINDS.values() for area in row.shared)


def _synced(rel: str) -> int | None:
    """How large a file of `shared/` a remote store keeps may be; None for the rest (the engine cache)."""
    for prefix, limit in _synced_limits().items():
        if rel.startswith(prefix) and (prefix.endswith("/") or "/" not in rel):
            return limit
    return None


def _snapshot(local: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of the synced files of `shared/`: only those are walked (not the engine cache beside them)."""
    out = {}
    found = [p for prefix in _synced_limits()
             for p in ((local / prefix).rglob("*") if prefix.endswith("/") else local.glob(f"{prefix}*"))]
    for p in found:
        if files.is_regular(p) and not p.name.startswith("."):
            st = p.stat()
            out[p.relative_to(local).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def _parse(data: Any, key: str) -> Manifest | None:
    """A shared store's manifest of `key`: a trtflow manifest whose files lie in a writer directory of its own."""
    manifest = Manifest.parse(data, key)
    if manifest is None or not isinstance(manifest.blobs, str) or WRITER_NAME.fullmatch(manifest.blobs) is None:
        return None
    return manifest


def _same_files(a: Manifest, b: Manifest) -> bool:
    """Whether two manifests of one key record the same files, byte for byte (a result published again from a
    machine's cache names another writer, and that machine's file times)."""
    fa, fb = a.files or {}, b.files or {}
    return bool(fa) and fa.keys() == fb.keys() and all((fa[r].size, fa[r].sha256) == (fb[r].size, fb[r].sha256)
                                                       for r in fa)


def _precondition_failed(exc: BaseException) -> bool:
    """The conditional create lost: S3 answers 412 PreconditionFailed (s3fs raises FileExistsError or an OSError
    carrying it)."""
    return isinstance(exc, FileExistsError) or "PreconditionFailed" in str(exc) or "412" in str(exc)
