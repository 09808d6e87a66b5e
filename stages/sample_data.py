"""Model inputs for calibration, precision checks and validation: images through the parity stage's
preprocessing artifact, tensors saved to files, or seeded random data. Produced one sample at a time."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from stages import preprocess
from stages.base import Artifact, StageError
from stages.ort_compare import _NP, concrete_shape

Feeds = dict[str, np.ndarray]


class SampleSource:
    """`len()` samples, each a feed dict for the model's inputs; `split(n)` keeps the last n for holding out."""

    def __init__(self, data: Any, inputs: dict[str, Any], model_inputs: list[Any], stage: str):
        self.data, self.model_inputs, self.stage = data, model_inputs, stage
        self.files: list[Path] = []
        self.pre = None
        if data.images:
            if "preprocess" not in inputs:
                raise StageError(f"{stage}: data.images needs the parity stage's preprocessing: add a parity stage "
                                 f"before it (or inputs: {{preprocess: <parity stage>}}), or give data.tensors")
            self.pre = preprocess.load(inputs["preprocess"].path)
            self.files = [a.path for a in inputs["images"]][: data.samples]
        elif data.tensors:
            self.files = [a.path for a in inputs["tensors"]][: data.samples]
        self.from_files = bool(data.images or data.tensors)
        self.count = len(self.files) if self.from_files else data.samples
        self.label = ("images via preprocess " + self.pre.digest[:12] if self.pre else
                      "saved tensors" if data.tensors else f"random (seed {data.seed})")

    def __len__(self) -> int:
        return self.count

    def feeds(self, start: int = 0, stop: int | None = None) -> Iterator[Feeds]:
        stop = self.count if stop is None else stop
        for i in range(start, stop):
            yield self.sample(i)

    def sample(self, i: int) -> Feeds:
        first = self.model_inputs[0]
        if self.pre is not None:
            return {first.name: self._fit(first, self.pre(self.files[i]), self.files[i])}
        if self.from_files:
            f = self.files[i]
            data = np.load(f)
            if isinstance(data, np.lib.npyio.NpzFile):
                missing = [m.name for m in self.model_inputs if m.name not in data.files]
                if missing:
                    raise StageError(f"{self.stage}: {f.name} has no array for input(s) {', '.join(missing)}")
                return {m.name: self._fit(m, data[m.name], f) for m in self.model_inputs}
            if len(self.model_inputs) != 1:
                raise StageError(f"{self.stage}: the model has {len(self.model_inputs)} inputs; save .npz files "
                                 f"with one array per input name")
            return {first.name: self._fit(first, data, f)}
        rng = np.random.default_rng([self.data.seed, i])
        feeds = {}
        for m in self.model_inputs:
            shape = concrete_shape(m.name, list(m.shape), self.data.shapes)
            dtype = _NP.get(m.type, np.float32)
            feeds[m.name] = (rng.standard_normal(shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                             else rng.integers(0, 8, shape).astype(dtype))
        return feeds

    def _fit(self, m: Any, x: np.ndarray, source: Path) -> np.ndarray:
        want = list(m.shape)
        given = list(x.shape)
        while x.ndim < len(want):
            x = x[None]
        ok = x.ndim == len(want) and all(not isinstance(w, int) or w <= 0 or w == s for w, s in zip(want, x.shape))
        if not ok:
            raise StageError(f"{self.stage}: {source.name} gives shape {given}, which does not fit the "
                             f"model's input '{m.name}' {want}")
        return x.astype(_NP.get(m.type, np.float32))
