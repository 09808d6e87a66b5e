"""The declared deploy-time preprocessing, executed with OpenCV and NumPy (each step's code: `steps.py`).

One source of truth: the resolved steps are written once (canonical JSON + digest) by the parity stage and every
later consumer (calibration, validation, benchmark) runs them through `Preprocessor`, never a re-declaration.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

import cv2
import numpy as np

from trtflow.errors import StageError
from trtflow.stages.image.steps import Batch, Frame, Layout, Read, Steps, apply, dump, parse


def canonical(steps: Iterable[Any]) -> Steps:
    """The declared steps (`PreprocessStep`s, or their YAML/JSON form) typed, every default filled in, `read` first
    (added when missing)."""
    out = parse([step.model_dump(mode="json", exclude_none=True) if hasattr(step, "model_dump") else step
                 for step in steps])
    if not out or not isinstance(out[0], Read):
        if any(isinstance(step, Read) for step in out):
            raise StageError("'read' must be the first preprocessing step")
        out.insert(0, Read())
    return out


def digest(steps: Steps) -> str:
    return hashlib.sha256(json.dumps(dump(steps), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_image(path: Path, color: str = "rgb", depth: int = 8) -> np.ndarray:
    """HxWxC (C = 3, or 1 for gray) in the requested color order; uint8 or uint16."""
    if not Path(path).is_file():
        raise StageError(f"image not found: {path}")
    try:
        image = cv2.imread(str(path), _flags(color, depth))
    except cv2.error as exc:
        raise StageError(f"cannot read image {path}: OpenCV refuses it: {_refusal(exc)}") from None
    if image is None:
        raise StageError(f"cannot read image {path}: not an image OpenCV can decode (corrupt or unsupported)")
    return _ordered(image, color)


def decode_image(data: bytes, color: str = "rgb", depth: int = 8) -> np.ndarray:
    """`read_image` of an encoded image held in memory (what a serving request carries)."""
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), _flags(color, depth)) if data else None
    except cv2.error as exc:
        raise StageError(f"cannot decode the image ({len(data)} bytes): OpenCV refuses it: {_refusal(exc)}") from None
    if image is None:
        raise StageError(f"cannot decode the image ({len(data)} bytes): not an image OpenCV can decode")
    return _ordered(image, color)


def _refusal(exc: cv2.error) -> str:
    """OpenCV's reason, without its source file and line: an image over its pixel limit raises where a broken one
    gives None."""
    why = getattr(exc, "err", "") or str(exc).strip().splitlines()[-1][:200]
    if "CV_IO_MAX_IMAGE_PIXELS" in why:
        return "more pixels than its limit, 2**30 unless OPENCV_IO_MAX_IMAGE_PIXELS says otherwise: resize it"
    return why


def _flags(color: str, depth: int) -> int:
    flags = cv2.IMREAD_GRAYSCALE if color == "gray" else cv2.IMREAD_COLOR
    return flags | cv2.IMREAD_ANYDEPTH if depth == 16 else flags


def _ordered(image: np.ndarray, color: str) -> np.ndarray:
    if image.ndim == 2:
        return image[:, :, None]
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if color == "rgb" else image


class Preprocessor:
    """Runs canonical steps on an image (a file, or encoded bytes) and returns the exact tensor the engine is fed."""

    def __init__(self, steps: Steps):
        if not steps or not isinstance(steps[0], Read):
            raise StageError("the preprocessing steps must start with 'read' (canonical() puts it first)")
        self.read, self.steps = steps[0], steps
        self.digest = digest(steps)

    @classmethod
    def from_json(cls, steps: list[Any]) -> Preprocessor:
        """The steps of preprocess.json."""
        return cls(parse(steps))

    def __call__(self, path: Path) -> np.ndarray:
        return self.run(read_image(path, self.read.color, self.read.depth))

    def from_bytes(self, data: bytes) -> np.ndarray:
        return self.run(decode_image(data, self.read.color, self.read.depth))

    @property
    def layout(self) -> str:
        """The layout of the image in the tensor the steps give: 'hwc' or 'chw'."""
        return next((step.layout for step in reversed(self.steps) if isinstance(step, Layout)), "hwc")

    @property
    def batched(self) -> bool:
        """Whether the tensor has a batch dimension (`batch: true`)."""
        return any(isinstance(step, Batch) and step.batch for step in self.steps)

    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of every tensor the steps give, where the last step that sizes the image fixes it; None
        where it depends on the image (a resize to a height alone, a pad to a square)."""
        size = None
        for step in self.steps[1:]:
            if step.sizes:
                size = step.fixed_size()
        return size

    def resized(self, height: int, width: int) -> tuple[Preprocessor, list[str]] | None:
        """The same steps giving `height` x `width` tensors, and the changed steps in words: every step that sizes
        the image scaled by the same factors (a resize to 256 before a 224 crop becomes one to 512 before a 448
        crop). None where the steps do not fix the size."""
        size = self.output_size()
        if size is None:
            return None
        fy, fx = height / size[0], width / size[1]
        steps, changed = [self.steps[0]], []
        for step in self.steps[1:]:
            new = step.scaled(fy, fx)
            if new != step:
                changed.append(f"{new.name} {json.dumps(new.friendly(), separators=(', ', ': '))}")
            steps.append(new)
        return Preprocessor(steps), changed

    def frame(self, path: Path) -> Frame:
        """Where the points of the image file land in the tensor the steps make of it."""
        st = Path(path).stat()
        h, w = _size_as_read(str(path), self.read.color, self.read.depth, (st.st_mtime_ns, st.st_size))
        return Frame.of(self.steps[1:], h, w)

    def run(self, img: np.ndarray) -> np.ndarray:
        """The steps after `read` on a decoded HxWxC image."""
        layout = "hwc"
        for step in self.steps[1:]:
            img, layout = apply(img, step, layout)
        return img


@functools.lru_cache(maxsize=4096)
def _size_as_read(path: str, color: str, depth: int, stamp: tuple[int, int]) -> tuple[int, int]:
    """(height, width) of an image file as `read_image` decodes it (EXIF orientation applied), decoded once per
    version of the file: validate scores each labelled file for the reference and every candidate."""
    h, w = read_image(Path(path), color, depth).shape[:2]
    return h, w


def save(steps: Steps, out: Path) -> Path:
    out.write_text(json.dumps({"steps": dump(steps), "digest": digest(steps)}, indent=2) + "\n")
    return out


def load(path: Path) -> Preprocessor:
    data = json.loads(Path(path).read_text())
    return Preprocessor.from_json(data["steps"])
