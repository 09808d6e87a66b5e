"""The declared deploy-time preprocessing, executed with OpenCV and NumPy (each step's code: `steps.py`).

One source of truth: the resolved steps are written once (canonical JSON + digest) by the parity stage and every
later consumer (calibration, validation, benchmark) runs them through `Preprocessor`, never a re-declaration.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

import cv2
import numpy as np

from trtflow.errors import StageError
from trtflow.stages.image.steps import STEPS, apply


def canonical(steps: Iterable[Any]) -> list[dict[str, Any]]:
    """Steps as plain JSON with every default filled in, `read` first (added when missing)."""
    out: list[dict[str, Any]] = []
    for step in steps:
        data = step.model_dump(mode="json", exclude_none=True) if hasattr(step, "model_dump") else dict(step)
        (name, value), = data.items()
        out.append({name: STEPS[name].canonical(value) if name in STEPS else value})
    if not out or "read" not in out[0]:
        if any("read" in s for s in out):
            raise StageError("'read' must be the first preprocessing step")
        out.insert(0, {"read": {"color": "rgb", "depth": 8}})
    return out


def digest(steps: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(steps, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_image(path: Path, color: str = "rgb", depth: int = 8) -> np.ndarray:
    """HxWxC (C = 3, or 1 for gray) in the requested color order; uint8 or uint16."""
    if not Path(path).is_file():
        raise StageError(f"image not found: {path}")
    image = cv2.imread(str(path), _flags(color, depth))
    if image is None:
        raise StageError(f"cannot read image {path}: not an image OpenCV can decode (corrupt or unsupported)")
    return _ordered(image, color)


def decode_image(data: bytes, color: str = "rgb", depth: int = 8) -> np.ndarray:
    """`read_image` of an encoded image held in memory (what a serving request carries)."""
    image = cv2.imdecode(np.frombuffer(data, np.uint8), _flags(color, depth)) if data else None
    if image is None:
        raise StageError(f"cannot decode the image ({len(data)} bytes): not an image OpenCV can decode")
    return _ordered(image, color)


def _flags(color: str, depth: int) -> int:
    flags = cv2.IMREAD_GRAYSCALE if color == "gray" else cv2.IMREAD_COLOR
    return flags | cv2.IMREAD_ANYDEPTH if depth == 16 else flags


def _ordered(image: np.ndarray, color: str) -> np.ndarray:
    if image.ndim == 2:
        return image[:, :, None]
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB) if color == "rgb" else image


class Preprocessor:
    """Runs canonical steps on an image (a file, or encoded bytes) and returns the exact tensor the engine is fed."""

    def __init__(self, steps: list[dict[str, Any]]):
        self.steps = steps
        self.digest = digest(steps)

    def __call__(self, path: Path) -> np.ndarray:
        (_, read), = self.steps[0].items()
        return self.run(read_image(path, read["color"], read["depth"]))

    def from_bytes(self, data: bytes) -> np.ndarray:
        (_, read), = self.steps[0].items()
        return self.run(decode_image(data, read["color"], read["depth"]))

    @property
    def layout(self) -> str:
        """The layout of the image in the tensor the steps give: 'hwc' or 'chw'."""
        return next((v for step in reversed(self.steps) for k, v in step.items() if k == "layout"), "hwc")

    def output_size(self) -> tuple[int, int] | None:
        """(height, width) of every tensor the steps give, where the last step that sizes the image fixes it; None
        where it depends on the image (a resize to a height alone, a pad to a square)."""
        size = None
        for step in self.steps[1:]:
            (name, value), = step.items()
            kind = STEPS.get(name)
            if kind is not None and kind.sizes:
                size = kind.fixed_size(value)
        return size

    def resized(self, height: int, width: int) -> tuple["Preprocessor", list[str]] | None:
        """The same steps giving `height` x `width` tensors, and the changed steps in words: every step that sizes
        the image scaled by the same factors (a resize to 256 before a 224 crop becomes one to 512 before a 448
        crop). None where the steps do not fix the size."""
        size = self.output_size()
        if size is None:
            return None
        fy, fx = height / size[0], width / size[1]
        steps, changed = [self.steps[0]], []
        for step in self.steps[1:]:
            (name, value), = step.items()
            kind = STEPS.get(name)
            new = kind.scaled(value, fy, fx) if kind is not None else value
            if new != value:
                changed.append(f"{name} {json.dumps(kind.friendly(new), separators=(', ', ': '))}")
            steps.append({name: new})
        return Preprocessor(steps), changed

    def run(self, img: np.ndarray) -> np.ndarray:
        """The steps after `read` on a decoded HxWxC image."""
        layout = "hwc"
        for step in self.steps[1:]:
            (name, value), = step.items()
            img, layout = apply(img, name, value, layout)
        return img


def save(steps: list[dict[str, Any]], out: Path) -> Path:
    out.write_text(json.dumps({"steps": steps, "digest": digest(steps)}, indent=2) + "\n")
    return out


def load(path: Path) -> Preprocessor:
    data = json.loads(Path(path).read_text())
    return Preprocessor(data["steps"])
