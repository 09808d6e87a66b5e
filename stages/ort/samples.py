"""Model inputs for calibration, precision checks and validation: images through the parity stage's
preprocessing artifact, tensors saved to files, or seeded random data. Produced one sample at a time."""
from __future__ import annotations

import copy
import re
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import onnx

from trtflow import phases
from trtflow.artifact import Inputs
from trtflow.errors import StageError
from trtflow.pipelines.schema import SampleData
from trtflow.stages.image import preprocess
from trtflow.stages.image.headers import check_images
from trtflow.stages.onnx.graph import index_bounds, inputs_upstream_of
from trtflow.stages.ort.runner import fit_to_input, random_input, session_shapes
from trtflow.stages.ort.shaping import Target
from trtflow.text import did_you_mean, first_line

Feeds = dict[str, np.ndarray]


class SampleSource:
    """`len()` samples, each a feed dict for the model's inputs; `split(n)` keeps the last n for holding out.

    Random values follow `data.ranges`; integer inputs that index a table (an embedding's Gather) stay within
    it unless a range says otherwise. `key` is where the data block sits in the YAML (for messages)."""

    def __init__(self, data: SampleData, inputs: Inputs, model_inputs: list[Any], stage: str,
                 model: onnx.ModelProto | None = None, key: str = "data"):
        self.data, self.model_inputs, self.stage, self.model, self.key = data, model_inputs, stage, model, key
        known = {m.name for m in model_inputs}
        for section in ("ranges", "pad"):
            for name in getattr(data, section):
                if name not in known:
                    raise StageError(f"{stage}: {key}.{section}: the model has no input '{name}'"
                                     f"{did_you_mean(name, sorted(known))}")
        self.ranges = {**(index_bounds(model) if model is not None else {}),
                       **{k: (v[0], v[1]) for k, v in data.ranges.items()}}
        self.files: list[Path] = []
        self.pre = None
        if data.images:
            if "preprocess" not in inputs:
                raise StageError(f"{stage}: data.images needs the parity stage's preprocessing: add a parity stage "
                                 f"before it (or inputs: {{preprocess: <parity stage>}}), or give data.tensors")
            self.pre = preprocess.load(inputs.one("preprocess").path)
            self.files = [a.path for a in inputs.many("images")][: data.samples]
            check_images(self.files, f"{stage}: {key}.images")
        elif data.tensors:
            self.files = [a.path for a in inputs.many("tensors")][: data.samples]
        self.from_files = bool(data.images or data.tensors)
        self.count = len(self.files) if self.from_files else data.samples
        self.label = ("images via preprocess " + self.pre.digest[:12] if self.pre else
                      "saved tensors" if data.tensors else f"random (seed {data.seed})")
        self.target: Target | None = None  # files made into one profile shape (`at`)
        self.rows = 0  # the batch rows a file gives (known once `at` has read one)

    def __len__(self) -> int:
        return self.count

    def at(self, shapes: dict[str, list[int]]) -> "SampleSource":
        """These samples at one profile shape (input -> shape): random data drawn at it; files made into it
        (`shaping.py`: dimensions cut, padded or repeated, batches filled with more files; images through the
        declared preprocessing set for that size, where its steps fix the size). `made()` says how."""
        other = copy.copy(self)
        if not self.from_files:
            other.data = self.data.model_copy(update={"shapes": {**self.data.shapes, **shapes}})
            return other
        other.target = Target.of(shapes, self.model_inputs, self.data.pad)
        if self.pre is not None:
            other.pre = self._sized_preprocessing(other.target)
        if not self.rows and self.count:
            first = self._file_sample(0)
            self.rows = next(iter(first.values())).shape[0] if other.target.batched else 1
        other.rows = self.rows
        other.count = -(-self.count // other.target.files_per_sample(self.rows)) if self.count else 0
        return other

    def made(self) -> str:
        """How these samples were made: the data, and what `at` did to it."""
        return self.label if self.target is None else f"{self.label}: {self.target.notes.text()}"

    def _sized_preprocessing(self, target: Target) -> Any:
        """The preprocessing giving images of the target's height and width (itself where it already does)."""
        first = self.model_inputs[0]
        want = target.shapes.get(first.name)
        if want is None or len(want) < 3:
            return self.pre
        h, w = (want[-2], want[-1]) if self.pre.layout == "chw" else (want[-3], want[-2])
        if self.pre.output_size() == (h, w):
            return self.pre
        resized = self.pre.resized(h, w)
        if resized is None:
            target.notes.say(f"the preprocessing does not fix the image size: each preprocessed image padded with "
                             f"{self.data.pad.get(first.name, 0):g} or cropped to {h}x{w}")
            return self.pre
        pre, changed = resized
        target.notes.say(f"the preprocessing set for {h}x{w} ({', '.join(changed)})")
        return pre

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

    def files_of(self, i: int) -> list[Path]:
        """The files sample `i` is made of, in batch order (none for random data)."""
        if not self.from_files:
            return []
        if self.target is None:
            return [self.files[i]]
        per = self.target.files_per_sample(self.rows)
        return [self.files[(i * per + j) % len(self.files)] for j in range(per)]

    def sample(self, i: int) -> Feeds:
        if self.target is None:
            return self._file_sample(i) if self.from_files else self._random_sample(i)
        n = len(self.files)
        per = self.target.files_per_sample(self.rows)
        images = {self.model_inputs[0].name: float(self.data.pad.get(self.model_inputs[0].name, 0))} \
            if self.pre is not None else None
        feeds = []
        for j in range(per):
            try:
                feeds.append(self.target.fit(self._file_sample((i * per + j) % n), images))
            except ValueError as exc:
                raise StageError(f"{self.stage}: {self.files[(i * per + j) % n].name}: {exc}") from None
        return self.target.batch(feeds, n)

    def _file_sample(self, i: int) -> Feeds:
        first = self.model_inputs[0]
        if self.pre is not None:
            with phases.phase(phases.IMAGES):
                image = self.pre(self.files[i])
            return {first.name: self._fit(first, image, self.files[i])}
        if self.from_files:
            f = self.files[i]
            data = self._load(f, lambda: np.load(f, allow_pickle=False))
            if isinstance(data, np.lib.npyio.NpzFile):
                missing = [m.name for m in self.model_inputs if m.name not in data.files]
                if missing:
                    raise StageError(f"{self.stage}: {f.name} has no array for input(s) {', '.join(missing)}")
                return {m.name: self._fit(m, self._load(f, lambda name=m.name: data[name]), f)
                        for m in self.model_inputs}
            if len(self.model_inputs) != 1:
                raise StageError(f"{self.stage}: the model has {len(self.model_inputs)} inputs; save .npz files "
                                 f"with one array per input name")
            return {first.name: self._fit(first, data, f)}
        raise AssertionError("random data has no files")

    def _random_sample(self, i: int) -> Feeds:
        rng = np.random.default_rng([self.data.seed, i])
        try:
            shapes = session_shapes(self.model_inputs, self.data.shapes)
            return {m.name: random_input(m, shapes, rng, self.ranges.get(m.name)) for m in self.model_inputs}
        except ValueError as exc:
            raise StageError(f"{self.stage}: {exc}; give {self.key}.tensors instead") from None

    def check_reference(self, reference: Callable[[Feeds], dict[str, np.ndarray]]) -> None:
        """The reference's outputs on the first sample (`reference`: a feed -> its outputs, computed or read): inputs
        it cannot run on are named, with the fix."""
        if len(self):
            feed = self.sample(0)
            try:
                reference(feed)
            except StageError:  # the memory budget's refusal (memory.py): one line naming the shape already
                raise
            except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own exception types
                raise self.failure(exc) from None

    def failure(self, exc: BaseException) -> StageError:
        """A StageError for the reference model failing on these samples, naming the inputs that reach the
        failing node and how to give their realistic values."""
        node = re.search(r"Name:'([^']+)'", str(exc))
        suspects = inputs_upstream_of(self.model, node.group(1)) if node and self.model is not None else []
        floats = {m.name for m in self.model_inputs if "float" in m.type}
        suspects = suspects or [m.name for m in self.model_inputs]
        suspects = [s for s in suspects if s not in floats] or suspects  # integer and control inputs first
        where = f" (inputs {', '.join(suspects)} reach node '{node.group(1)}')" if node else ""
        if self.from_files:
            fix = "check that the saved tensors hold what the model is fed in deployment"
        else:
            example = ", ".join(f"{s}: [low, high]" for s in suspects[:3])
            fix = (f"give their realistic values: {self.key}.ranges: {{{example}}} (equal bounds pin a constant), "
                   f"or saved inputs in {self.key}.tensors")
        at = (" at " + ", ".join(f"{k} {v}" for k, v in self.target.shapes.items())) if self.target else ""
        return StageError(f"{self.stage}: the model does not run on the {self.made()} inputs{at}: {first_line(exc)}"
                          f"{where}; {fix}")

    def _load(self, f: Path, read: Any) -> Any:
        """A saved array (or .npz) read without unpickling: anything else is bad input, never retried."""
        try:
            return read()
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise StageError(f"{self.stage}: {f.name} is not an array numpy reads without unpickling "
                             f"({first_line(exc)})", hint="save plain numeric arrays with numpy.save or "
                                                          "numpy.savez") from None

    def _fit(self, m: Any, x: np.ndarray, source: Path) -> np.ndarray:
        finite = np.isfinite(x) if x.dtype.kind == "f" else None
        if finite is not None and not finite.all():
            bad = int(finite.size - finite.sum())
            raise StageError(f"{self.stage}: {source.name}: input '{m.name}' holds {bad} NaN/Inf value(s) of "
                             f"{x.size}", hint="calibration and checks need finite inputs: fix or drop that file")
        fitted = fit_to_input(x, m)
        if fitted is None:
            raise StageError(f"{self.stage}: {source.name} gives shape {list(x.shape)}, which does not fit the "
                             f"model's input '{m.name}' {list(m.shape)}")
        return fitted
