"""Engines kept per cell, so a build matrix rebuilds only the cells whose inputs changed (DVC's run cache, per
cell): a new FP16 block list rebuilds the FP16 engines, the FP32 and INT8 cells are taken from here.

    <root>/<cell key>/engine.plan   the engine
                      build.json    what building it gave (records.Built)
                      build.log     TensorRT's log
    <root>/index/<cell key>         the engine's sha256 as its builder reported it, checked before every reuse

The cell key is the hash of everything the engine depends on: the model's digest (not its path), the profiles,
the target, the backend and its version, the builder options, and the GPUs and driver of this machine. An entry is
written to a temporary directory and renamed into place, after its index record; an entry that is not a directory
of regular files, has no record or whose engine does not match it is ignored (and replaced by the next build),
never served.

The digest is kept apart from the entry it protects (a digest inside the entry is replaced with the engine): it
comes from the builder (`Built.engine_sha256`, published in the build result that used the engine), is recorded
outside the entries, and is compared with the engine as placed in the build's output, streamed. Whoever can also
rewrite the index can substitute an engine: the store trusts its writers; the cache only never serves an entry
that contradicts its record.

An engine is stored once where the file system allows: the entry's `engine.plan` and the build output's are hard
links of one file (`files.place`). Nothing writes an engine in place (a builder writes a new file, a release places
its own), so removing or replacing either name leaves the other whole; bytes written into one through any name
fail the digest check of the entry, which is then dropped and rebuilt, never served.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from trtflow import files
from trtflow.stages.trt.engines import LOG, PLAN
from trtflow.stages.trt.records import Built, Cell, Gpu

FORMAT = 1
INDEX = "index"  # <root>/index/<key>: the digest the entry <root>/<key> must match (keys are hex: no entry is named so)
RECORD_BYTES = 256  # an index record: 64 hex digits


def cell_key(cell: Cell, model_digest: str, machine: list[Gpu]) -> str:
    """The key of `cell` built from the model of `model_digest` on a machine with the GPUs `machine`."""
    whole = {"piece", "model_profiles"} if cell.piece is None else set()  # a whole model's key as before pieces
    spec = cell.model_dump(mode="json", exclude={"name", "model", "timing_cache", "variant", "chain"} | whole)
    gpus = [g.model_dump(mode="json") for g in machine] or None
    blob = json.dumps({"format": FORMAT, "cell": spec, "model": model_digest, "machine": gpus}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _copy_log(src: Path, dst: Path) -> None:
    """TensorRT's log, where there is one that is a regular file (it only explains the engine)."""
    try:
        files.copy_regular(src, dst, files.ENGINE_LOG_BYTES, follow=False)
    except OSError:
        dst.unlink(missing_ok=True)


def _regular_files_only(entry: Path) -> bool:
    return not entry.is_symlink() and entry.is_dir() and all(files.is_regular(p) for p in entry.iterdir())


class EngineCache:
    def __init__(self, root: Path):
        self.root = root
        self.index = root / INDEX

    def take(self, key: str, cell_dir: Path) -> Built | None:
        """The cached build of `key`, its engine and log placed in `cell_dir` (made); None when there is none or
        it fails its digest."""
        entry = self.root / key
        if not os.path.lexists(entry):
            return None
        try:
            built = self._trusted(key, entry)
        except (OSError, ValueError):
            built = None
        if built is None:
            self._drop(entry)
            return None
        cell_dir.mkdir()
        try:
            files.place(entry / PLAN, cell_dir / PLAN, files.ENGINE_BYTES)
            placed = files.sha256(cell_dir / PLAN, follow=False)
        except OSError:
            placed = None
        if placed != built.engine_sha256:
            shutil.rmtree(cell_dir)
            self._drop(entry)
            return None
        _copy_log(entry / LOG, cell_dir / LOG)
        built.reused = key
        return built

    def _trusted(self, key: str, entry: Path) -> Built | None:
        """The entry's record, with the digest its engine must have from the index; None for an entry that cannot
        be trusted."""
        if not _regular_files_only(entry):  # a FIFO would block its reader, a symlink lead anywhere
            return None
        expected = self._recorded(key)
        built = Built.read(entry) if expected else None
        if built is None or not built.ok:
            return None
        built.engine_sha256 = expected
        return built

    def _recorded(self, key: str) -> str | None:
        try:
            text = files.read_bounded(self.index / key, RECORD_BYTES, follow=False).decode("ascii").strip()
        except FileNotFoundError:
            return None
        return text if re.fullmatch(r"[0-9a-f]{64}", text) else None

    def _drop(self, entry: Path) -> None:
        """Remove an entry that cannot be trusted, so the next build of its cell replaces it."""
        if entry.is_symlink() or not entry.is_dir():  # a symlink, FIFO or file in its place
            with contextlib.suppress(OSError):
                entry.unlink()
            return
        trash = entry.with_name(f".drop-{entry.name}-{os.getpid()}")
        try:
            os.replace(entry, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def keep(self, key: str, cell_dir: Path, built: Built) -> None:
        """Record a cell that built. Best effort: a cache that cannot be written costs a rebuild, nothing else."""
        if not built.ok or not built.engine_sha256 or os.path.lexists(self.root / key):
            return
        tmp = None
        try:
            self.index.mkdir(parents=True, exist_ok=True)
            if self.index.is_symlink():  # records are written into the store, never where a link leads
                return
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
            files.place(cell_dir / PLAN, tmp / PLAN, files.ENGINE_BYTES)
            if files.sha256(tmp / PLAN, follow=False) != built.engine_sha256:
                raise ValueError("the engine changed since it was built")
            _copy_log(cell_dir / LOG, tmp / LOG)
            built.write(tmp)
            # the record first, so an entry is never seen without one; a writer racing this one for the same key
            # may leave a record that does not match the entry that won: that entry is then rebuilt once
            files.write_atomic(self.index / key, (built.engine_sha256 + "\n").encode())
            os.replace(tmp, self.root / key)
        except (OSError, ValueError):
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
