"""The artifact store: one directory per (stage, key), published atomically, with a manifest written last.

`<root>/<stage>/<key>/manifest.json` + the stage's outputs. A directory without a complete manifest is never
a cache hit. `ArtifactStore` is the interface; `LocalStore` the only implementation so far (a shared fsspec
store can implement the same methods).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Protocol

from trtflow.errors import StoreError

MANIFEST = "manifest.json"
LAST = "last.json"


class ArtifactStore(Protocol):
    root: Path

    def ensure_writable(self) -> None: ...
    def lookup(self, stage: str, key: str) -> dict[str, Any] | None: ...
    def staging(self, stage: str, key: str) -> Path: ...
    def publish(self, stage: str, key: str, staging: Path, manifest: dict[str, Any]) -> Path: ...
    def discard(self, staging: Path) -> None: ...
    def last(self, stage: str) -> dict[str, Any] | None: ...
    def mark_last(self, stage: str, record: dict[str, Any]) -> None: ...
    def path(self, stage: str, key: str) -> Path: ...


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
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class LocalStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    def ensure_writable(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StoreError(f"cannot write the artifact store at {self.root}: {exc.strerror or exc}; "
                             f"choose another with --store or the pipeline's 'artifacts:' key") from None

    def path(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def lookup(self, stage: str, key: str) -> dict[str, Any] | None:
        directory = self.path(stage, key)
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        if manifest.get("status") != "ok" or manifest.get("key") != key:
            return None
        for out in manifest.get("outputs", {}).values():
            target = directory / out["path"]
            if not target.exists():
                return None
            if target.is_file() and target.stat().st_size != out.get("size"):
                return None
        return manifest

    def staging(self, stage: str, key: str) -> Path:
        parent = self.root / stage
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".tmp-{key[:12]}-", dir=parent))

    def publish(self, stage: str, key: str, staging: Path, manifest: dict[str, Any]) -> Path:
        for f in staging.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        write_json_atomic(staging / MANIFEST, manifest)  # last: its presence means complete
        _fsync_dir(staging)
        target = self.path(stage, key)
        if target.exists():  # a broken earlier publish, or a concurrent run that won
            if self.lookup(stage, key) is not None:
                shutil.rmtree(staging, ignore_errors=True)
                return target
            trash = target.with_name(f".trash-{key[:12]}-{uuid.uuid4().hex[:8]}")
            os.replace(target, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(staging, target)
        _fsync_dir(target.parent)
        return target

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def last(self, stage: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.root / stage / LAST).read_text())
        except (OSError, ValueError):
            return None

    def mark_last(self, stage: str, record: dict[str, Any]) -> None:
        (self.root / stage).mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.root / stage / LAST, record)
