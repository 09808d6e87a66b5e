"""FP32 reference outputs computed once (issue #71): a model's outputs on a feed are the same whichever stage or run
asks, so precision's check, calibrate's pre-flight and validate read them from the store's shared area instead of
running the FP32 model again. A re-run where one variant changed runs no FP32 pass. Validate keeps its candidates'
outputs on ONNX Runtime the same way (`of_file`): an FP32 candidate's are the reference's, and a variant that did
not change is not run again when another did.

    <root>/<key[:2]>/<key>.npz   the outputs in order and their names (numpy's .npz, no pickles)
    <root>/index/<key>           the .npz's sha256, checked before every read

The key is the hash of what the outputs depend on: the model's digest (the store's digest of the artifact, not its
path), the runtime (ONNX Runtime's version, its CPU provider, the graph as written), and each input's name, dtype,
shape and bytes. An entry is written whole and renamed into place after its index record; an entry that does not
match its record is dropped, never read. The area holds at most `TRTFLOW_REFERENCE_CACHE` bytes (2 GiB unless set,
0 keeps none): at a writer's first write, and whenever what it wrote since may have passed it, the area is scanned
and the least recently used entries beyond it removed. A reader that loses an entry to a concurrent removal
computes it again: the area saves time, it never decides a result.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from trtflow import files, settings
from trtflow.artifact import Artifact, Inputs
from trtflow.external_data import model_digest
from trtflow.pipelines.row import REFERENCE_CACHE
from trtflow.stages.ort.runner import feed_digest, run, session

FORMAT = 2  # 2: the outputs stored by position, their names beside them
AREA = "references"  # the folder of the store's shared/ (local to each machine: a remote store does not sync it)
INDEX = "index"
RECORD_BYTES = 128
NAMES = "names"  # the entry's array of output names (the outputs themselves are arr_0, arr_1, ... in their order)
ENTRY_BYTES = 8 << 30  # one sample's outputs: a detector's maps at a profile's max batch are hundreds of MB

Outputs = dict[str, np.ndarray]
Feed = dict[str, np.ndarray]


def _runtime() -> str:
    import onnxruntime as ort

    return f"onnxruntime {ort.__version__} CPUExecutionProvider as-written"


@dataclass
class References:
    """The FP32 outputs of the model whose store digest is `model`, kept under `root` (None: kept nowhere, every
    output computed). `computed` and `reused` count the feeds of each kind, for the stage's report."""
    root: Path | None
    model: str
    limit: int = field(default_factory=settings.REFERENCE_CACHE.get)
    computed: int = 0
    reused: int = 0
    _size: int | None = None  # the entries' bytes as this object last saw them, and what it wrote since

    @classmethod
    def of(cls, inputs: Inputs, model: Artifact) -> "References":
        """The references of `model` (one of the stage's inputs), kept in the store's shared area where the stage
        was given it (a stage run outside a store keeps none)."""
        shared = inputs.optional(REFERENCE_CACHE)
        return cls(shared.path / AREA if shared is not None else None, model.digest)

    def of_session(self, sess: object) -> Callable[[Feed], Outputs]:
        """The outputs on a feed of the model `sess` runs (the one whose digest this holds)."""
        return lambda feed: self.outputs(feed, lambda f: run(sess, f))

    def of_file(self, model_file: Path, role: str) -> Callable[[Feed], Outputs]:
        """The outputs on a feed of another model run as written (a candidate's emulation), kept in the same area
        under its own digest; its session made at the first feed not kept (`role`: trtflow/phases.py's passes)."""
        kept = References(self.root, model_digest(model_file) if self._enabled() else "", self.limit)
        made: list[object] = []

        def compute(feed: Feed) -> Outputs:
            if not made:
                made.append(session(model_file, role=role))
            return run(made[0], feed)

        return lambda feed: kept.outputs(feed, compute)

    def key(self, feed: Feed) -> str:
        blob = json.dumps({"format": FORMAT, "model": self.model, "runtime": _runtime(), "feed": feed_digest(feed)})
        return hashlib.sha256(blob.encode()).hexdigest()[:40]

    def outputs(self, feed: Feed, compute: Callable[[Feed], Outputs]) -> Outputs:
        """The model's outputs on `feed`: read where kept and whole, else `compute(feed)` (and kept)."""
        key = self.key(feed) if self._enabled() else None
        kept = self._read(key) if key is not None else None
        if kept is not None:
            self.reused += 1
            return kept
        out = compute(feed)
        self.computed += 1
        if key is not None:
            self._write(key, out)
        return out

    def _enabled(self) -> bool:
        return self.root is not None and self.limit > 0 and bool(self.model)

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.npz"

    def _read(self, key: str) -> Outputs | None:
        entry = self._entry(key)
        try:
            record = files.read_bounded(self.root / INDEX / key, RECORD_BYTES, follow=False).decode("ascii").strip()
            data = files.read_bounded(entry, ENTRY_BYTES, follow=False)
        except (OSError, UnicodeDecodeError):
            return None
        if not re.fullmatch(r"[0-9a-f]{64}", record) or hashlib.sha256(data).hexdigest() != record:
            self._drop(key)
            return None
        with contextlib.suppress(OSError):
            os.utime(entry)  # used: the last to go
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {str(name): npz[f"arr_{i}"] for i, name in enumerate(npz[NAMES])}

    def _write(self, key: str, outputs: Outputs) -> None:
        """Best effort: an area that cannot be written costs a recomputation, nothing else."""
        buffer = io.BytesIO()
        # the arrays by position and their names beside them: an output may be named as savez's own arguments are
        np.savez(buffer, *outputs.values(), **{NAMES: np.array(list(outputs), dtype=str)})
        data = buffer.getvalue()
        if len(data) > min(self.limit, ENTRY_BYTES):
            return
        try:
            for folder in (self.root / INDEX, self._entry(key).parent):
                folder.mkdir(parents=True, exist_ok=True)
                if folder.is_symlink():  # entries are written into the store, never where a link leads
                    return
            files.write_atomic(self.root / INDEX / key, (hashlib.sha256(data).hexdigest() + "\n").encode())
            files.write_atomic(self._entry(key), data)
        except OSError:
            return
        if self._size is None or self._size + len(data) > self.limit:
            self._evict()  # (a scan of the area: at the first write, and when what was written since may be over)
        else:
            self._size += len(data)

    def _drop(self, key: str) -> None:
        for path in (self._entry(key), self.root / INDEX / key):
            with contextlib.suppress(OSError):
                path.unlink()

    def _evict(self) -> None:
        """The least recently used entries removed until the area is within its limit."""
        entries = []
        for path in self.root.glob("??/*.npz"):
            with contextlib.suppress(OSError):
                st = path.lstat()
                entries.append((st.st_mtime_ns, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.limit:
                break
            self._drop(path.stem)
            total -= size
        self._size = total
