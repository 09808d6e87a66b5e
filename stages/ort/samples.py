"""Model inputs for calibration, precision checks and validation: images through the parity stage's
preprocessing artifact, tensors saved to files, or seeded random data. Produced one sample at a time."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from trtflow.errors import StageError
from trtflow.stages.image import preprocess
from trtflow.stages.ort.runner import fit_to_input, random_input

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

    def split(self, holdout: int) -> tuple[range, range]:
        """(calibration, held out): files keep their last `holdout` (at most half) for holding out; random data
        gets `holdout` extra samples instead. The held-out range is empty when nothing can be held out."""
        n = self.count
        if self.from_files:
            h = min(holdout, n // 2)
            return range(0, n - h), range(n - h, n)
        self.count = n + holdout
        return range(0, n), range(n, n + holdout)

    def feeds(self, which: range) -> Iterator[Feeds]:
        for i in which:
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
        try:
            return {m.name: random_input(m, self.data.shapes, rng) for m in self.model_inputs}
        except ValueError as exc:
            raise StageError(f"{self.stage}: {exc}; give data.tensors instead") from None

    def _fit(self, m: Any, x: np.ndarray, source: Path) -> np.ndarray:
        fitted = fit_to_input(x, m)
        if fitted is None:
            raise StageError(f"{self.stage}: {source.name} gives shape {list(x.shape)}, which does not fit the "
                             f"model's input '{m.name}' {list(m.shape)}")
        return fitted
