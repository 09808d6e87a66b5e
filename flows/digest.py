"""Content digests of artifacts, with a stat cache so unchanged multi-GB models are not re-hashed."""
from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from pathlib import Path

from trtflow import depends, external_data
from trtflow.disk import disk_cause
from trtflow.files import RECORD_BYTES, read_json, sha256, stamp


class DigestCache:
    """sha256 per file, remembered by its `stamp` in one JSON file."""

    def __init__(self, file: Path | None):
        self.file = file
        self._lock = threading.Lock()
        self._entries: dict[str, list] = {}
        self._dirty = False
        if file is not None:
            try:
                entries = read_json(file, RECORD_BYTES, follow=False)
            except (OSError, ValueError):
                entries = {}
            # an entry of another shape (a hand edit, another tool, an older trtflow) is dropped: it is only a cache
            self._entries = {k: v for k, v in entries.items() if isinstance(v, list) and len(v) == 5
                             and all(isinstance(x, int) for x in v[:4])} if isinstance(entries, dict) else {}

    def sha256(self, path: Path) -> str:
        depends.READ.file(path)  # as asked: the witness checks where a link leads too
        path = path.resolve()
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a device or a FIFO would be read for ever
            from trtflow.errors import SpecError
            raise SpecError(f"{path} is not a regular file", hint="name a file")
        now = stamp(st)
        with self._lock:
            hit = self._entries.get(str(path))
            if hit and hit[:4] == now:
                return hit[4]
        digest = sha256(path)
        with self._lock:
            self._entries[str(path)] = now + [digest]
            self._dirty = True
        return digest

    def artifact(self, path: Path, type_: str) -> str:
        """Digest of an artifact: a file, a directory (all files under it), or an ONNX model with its data."""
        if path.is_dir():
            depends.READ.tree(path)
            h = hashlib.sha256()
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                h.update(f"{f.relative_to(path).as_posix()}\0{self.sha256(f)}\n".encode())
            return h.hexdigest()
        own = self.sha256(path)
        if type_ == "onnx":
            return external_data.combined(own, [(f.name, self.sha256(f)) for f in self._external_files(path)])
        return own

    def _external_files(self, path: Path) -> list[Path]:
        path = path.resolve()
        now = stamp(path.stat())
        key = f"{path}#external-data"
        with self._lock:
            hit = self._entries.get(key)
        if hit and hit[:4] == now:  # the locations are the model's; what they point at is checked again
            return [external_data.checked(path, "?", n) for n in hit[4]]
        files = external_data.files_of(path)
        with self._lock:
            self._entries[key] = now + [[str(f.relative_to(path.parent)) for f in files]]
            self._dirty = True
        return files

    def save(self) -> None:
        if self.file is None or not self._dirty:
            return
        with self._lock:
            tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.tmp")
            try:
                tmp.write_text(json.dumps(self._entries))
                os.replace(tmp, self.file)
            except OSError as exc:  # only a cache: a full disk is said by what could not be written
                tmp.unlink(missing_ok=True)
                if disk_cause(exc) is None:
                    raise
                return
            self._dirty = False
