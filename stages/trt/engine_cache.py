"""Engines kept per cell, so a build matrix rebuilds only the cells whose inputs changed (DVC's run cache, per
cell): a new FP16 block list rebuilds the FP16 engines, the FP32 and INT8 cells are taken from here.

    <root>/<cell key>/engine.plan   the engine
                      build.json    what building it gave (engines.Built)
                      build.log     TensorRT's log
                      sha256        the engine's digest, checked before every reuse

The cell key is the hash of everything the engine depends on: the model's digest (not its path), the profiles,
the target, the backend and its version, the builder options, and the GPUs and driver of this machine. An entry is
written to a temporary directory and renamed into place; an entry that fails its digest is ignored (and replaced
by the next build), never served.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from trtflow import files
from trtflow.stages.trt.engines import LOG, PLAN, Built, Cell

FORMAT = 1
DIGEST = "sha256"


def cell_key(cell: Cell, model_digest: str, machine: Any) -> str:
    spec = cell.model_dump(mode="json", exclude={"name", "model", "timing_cache", "variant"})
    blob = json.dumps({"format": FORMAT, "cell": spec, "model": model_digest, "machine": machine}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _place(src: Path, dst: Path) -> None:
    """A hard link where the file system allows it (engines are large), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


class EngineCache:
    def __init__(self, root: Path):
        self.root = root

    def take(self, key: str, cell_dir: Path) -> Built | None:
        """The cached build of `key`, its engine and log placed in `cell_dir` (made); None when there is none or
        it fails its digest."""
        entry = self.root / key
        try:
            if entry.is_symlink() or not (entry / PLAN).is_file() or (entry / PLAN).is_symlink():
                return None
            built = Built.read(entry)
            if built is None or not built.ok or (entry / DIGEST).read_text().strip() != files.sha256(entry / PLAN):
                self._drop(entry)
                return None
        except (OSError, ValueError):
            self._drop(entry)
            return None
        cell_dir.mkdir()
        _place(entry / PLAN, cell_dir / PLAN)
        if (entry / LOG).is_file():
            shutil.copyfile(entry / LOG, cell_dir / LOG)
        built.reused = key
        return built

    def _drop(self, entry: Path) -> None:
        """Remove an entry that cannot be trusted, so the next build of its cell replaces it."""
        if entry.is_symlink() or not entry.is_dir():
            return
        trash = entry.with_name(f".drop-{entry.name}-{os.getpid()}")
        try:
            os.replace(entry, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def keep(self, key: str, cell_dir: Path, built: Built) -> None:
        """Record a cell that built. Best effort: a cache that cannot be written costs a rebuild, nothing else."""
        if not built.ok or (self.root / key).exists():
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=self.root))
            _place(cell_dir / PLAN, tmp / PLAN)
            if (cell_dir / LOG).is_file():
                shutil.copyfile(cell_dir / LOG, tmp / LOG)
            built.write(tmp)
            (tmp / DIGEST).write_text(files.sha256(tmp / PLAN) + "\n")
            os.replace(tmp, self.root / key)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True) if "tmp" in locals() else None
