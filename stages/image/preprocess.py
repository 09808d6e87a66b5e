"""The declared deploy-time preprocessing, executed with OpenCV and NumPy.

One source of truth: the resolved steps are written once (canonical JSON + digest) by the parity stage and every
later consumer (calibration, validation, benchmark) runs them through `Preprocessor`, never a re-declaration.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable

import cv2
import numpy as np

from trtflow.errors import StageError
from trtflow.stages.image import resample

INTERP = {"nearest": cv2.INTER_NEAREST, "linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC,
          "area": cv2.INTER_AREA, "lanczos": cv2.INTER_LANCZOS4}
COLOR = {"rgb2bgr": cv2.COLOR_RGB2BGR, "bgr2rgb": cv2.COLOR_BGR2RGB, "gray2rgb": cv2.COLOR_GRAY2RGB,
         "rgb2gray": cv2.COLOR_RGB2GRAY}


def canonical(steps: Iterable[Any]) -> list[dict[str, Any]]:
    """Steps as plain JSON with every default filled in, `read` first (added when missing)."""
    out: list[dict[str, Any]] = []
    for step in steps:
        data = step.model_dump(mode="json", exclude_none=True) if hasattr(step, "model_dump") else dict(step)
        (name, value), = data.items()
        if name == "read" and isinstance(value, str):
            value = {"color": value, "depth": 8}
        if name == "scale" and isinstance(value, str):
            num, _, den = value.partition("/")
            value = float(num) / float(den) if den else float(num)
        if name == "center_crop":
            value = _center_crop_spec(value)
        if name == "resize" and value.get("round") == "floor":  # the default: the same steps, the same digest
            value = {k: v for k, v in value.items() if k != "round"}
        out.append({name: value})
    if not out or "read" not in out[0]:
        if any("read" in s for s in out):
            raise StageError("'read' must be the first preprocessing step")
        out.insert(0, {"read": {"color": "rgb", "depth": 8}})
    return out


def _center_crop_spec(value: Any) -> Any:
    """[h, w], or {size: [h, w], round: ...} when the offset is not rounded as torchvision rounds it."""
    spec = value if isinstance(value, dict) else {"size": value}
    size = spec["size"]
    size = [size, size] if isinstance(size, int) else list(size)
    return size if spec.get("round", "round") == "round" else {"size": size, "round": spec["round"]}


ROUNDING: dict[str, Callable[[float], int]] = {"floor": math.floor, "round": round, "ceil": math.ceil}


def digest(steps: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(steps, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_image(path: Path, color: str = "rgb", depth: int = 8) -> np.ndarray:
    """HxWxC (C = 3, or 1 for gray) in the requested color order; uint8 or uint16."""
    flags = cv2.IMREAD_GRAYSCALE if color == "gray" else cv2.IMREAD_COLOR
    if depth == 16:
        flags |= cv2.IMREAD_ANYDEPTH
    if not Path(path).is_file():
        raise StageError(f"image not found: {path}")
    image = cv2.imread(str(path), flags)
    if image is None:
        raise StageError(f"cannot read image {path}: not an image OpenCV can decode (corrupt or unsupported)")
    if image.ndim == 2:
        image = image[:, :, None]
    elif color == "rgb":
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    return image


def _resize(img: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    h, w = img.shape[:2]
    rounded = ROUNDING[spec.get("round") or "floor"]
    if spec.get("size"):
        nh, nw = spec["size"]
    elif spec.get("height"):  # text lines: fixed height, the width keeps the aspect ratio up to max_width
        nh = spec["height"]
        nw = max(1, rounded(nh * (w / h)))  # in PaddleOCR's order: nh * w / h can round to the other integer
        if spec.get("max_width"):
            nw = min(nw, spec["max_width"])
    else:  # torchvision semantics: the shorter side becomes `shorter`, the other keeps the aspect ratio
        s = spec["shorter"]
        if h <= w:
            nh, nw = s, rounded(s * w / h)
        else:
            nh, nw = rounded(s * h / w), s
    name = spec.get("interp", "linear")
    if spec.get("antialias") and name in resample.FILTERS:
        # PIL/torchvision resampling: OpenCV's linear and cubic do not low-pass when shrinking
        return resample.resize(img, nh, nw, name)
    out = cv2.resize(img, (nw, nh), interpolation=INTERP[name])
    return out[:, :, None] if out.ndim == 2 else out


def _letterbox(img: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    th, tw = spec["size"]
    h, w = img.shape[:2]
    r = min(th / h, tw / w)
    nh, nw = round(h * r), round(w * r)
    resized = cv2.resize(img, (nw, nh), interpolation=INTERP[spec.get("interp", "linear")])
    if resized.ndim == 2:
        resized = resized[:, :, None]
    out = np.full((th, tw, img.shape[2]), spec.get("pad", 114), dtype=img.dtype)
    top, left = (th - nh) // 2, (tw - nw) // 2
    out[top:top + nh, left:left + nw] = resized
    return out


def _center_crop(img: np.ndarray, spec: Any) -> np.ndarray:
    ch, cw = spec["size"] if isinstance(spec, dict) else spec
    rounded = ROUNDING[spec["round"] if isinstance(spec, dict) else "round"]  # torchvision: round half to even
    h, w = img.shape[:2]
    if ch > h or cw > w:
        raise StageError(f"center_crop {ch}x{cw} is larger than the image ({h}x{w}) at that step")
    top, left = int(rounded((h - ch) / 2.0)), int(rounded((w - cw) / 2.0))
    return img[top:top + ch, left:left + cw]


def _pad(img: np.ndarray, spec: dict[str, Any], layout: str) -> np.ndarray:
    """Pads on the right and at the bottom, in either layout (PaddleOCR pads after normalizing, in CHW)."""
    th, tw = spec["size"]
    hwc = layout == "hwc"
    h, w, c = img.shape if hwc else (img.shape[1], img.shape[2], img.shape[0])
    if h > th or w > tw:
        raise StageError(f"pad: the image is {h}x{w} at that step, larger than size [{th}, {tw}] "
                         f"(resize with max_width, or a larger pad size)")
    value = np.asarray(spec.get("value", 0.0), np.float64).reshape(-1)
    if len(value) not in (1, c):
        raise StageError(f"pad has {len(value)} values for an image with {c} channels")
    if np.issubdtype(img.dtype, np.integer):
        value = np.clip(np.round(value), np.iinfo(img.dtype).min, np.iinfo(img.dtype).max)
    out = np.empty((th, tw, c) if hwc else (c, th, tw), img.dtype)
    out[...] = value.reshape((1, 1, -1) if hwc else (-1, 1, 1)).astype(img.dtype)
    if hwc:
        out[:h, :w] = img
    else:
        out[:, :h, :w] = img
    return out


def _crop(img: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    t, l, ch, cw = spec["top"], spec["left"], spec["height"], spec["width"]
    if t + ch > img.shape[0] or l + cw > img.shape[1]:
        raise StageError(f"crop {spec} falls outside the image ({img.shape[0]}x{img.shape[1]})")
    return img[t:t + ch, l:l + cw]


def _color(img: np.ndarray, conv: str) -> np.ndarray:
    out = cv2.cvtColor(img, COLOR[conv])
    return out[:, :, None] if out.ndim == 2 else out


def _normalize(img: np.ndarray, spec: dict[str, Any], layout: str) -> np.ndarray:
    c = img.shape[0] if layout == "chw" else img.shape[-1]
    mean, std = np.asarray(spec["mean"], np.float32), np.asarray(spec["std"], np.float32)
    if len(mean) not in (1, c) or len(std) not in (1, c):
        raise StageError(f"normalize has {len(mean)} means / {len(std)} stds for an image with {c} channels")
    shape = (-1, 1, 1) if layout == "chw" else (1, 1, -1)
    return (img.astype(np.float32) - mean.reshape(shape)) / std.reshape(shape)


class Preprocessor:
    """Runs canonical steps on an image file and returns the exact tensor the engine is fed."""

    def __init__(self, steps: list[dict[str, Any]]):
        self.steps = steps
        self.digest = digest(steps)

    def __call__(self, path: Path) -> np.ndarray:
        (_, read), = self.steps[0].items()
        img: np.ndarray = read_image(path, read["color"], read["depth"])
        layout = "hwc"
        for step in self.steps[1:]:
            (name, value), = step.items()
            img, layout = self._apply(img, name, value, layout)
        return img

    @staticmethod
    def _apply(img: np.ndarray, name: str, value: Any, layout: str) -> tuple[np.ndarray, str]:
        spatial: dict[str, Callable[[np.ndarray], np.ndarray]] = {
            "resize": lambda x: _resize(x, value), "letterbox": lambda x: _letterbox(x, value),
            "center_crop": lambda x: _center_crop(x, value), "crop": lambda x: _crop(x, value),
            "color": lambda x: _color(x, value)}
        if name in spatial:
            if layout != "hwc" or img.ndim != 3:
                raise StageError(f"'{name}' must come before 'layout: chw' and 'batch'")
            return spatial[name](img), layout
        if name == "pad":
            if img.ndim != 3:
                raise StageError("'pad' must come before 'batch'")
            return _pad(img, value, layout), layout
        if name == "dtype":
            return img.astype(value), layout
        if name == "scale":
            return img.astype(np.float32) * np.float32(value), layout
        if name == "normalize":
            return _normalize(img, value, layout), layout
        if name == "layout":
            if value == layout:
                return img, layout
            return (np.ascontiguousarray(img.transpose(2, 0, 1)) if value == "chw"
                    else np.ascontiguousarray(img.transpose(1, 2, 0))), value
        if name == "batch":
            return (img[None] if value else img), layout
        if name == "read":
            raise StageError("'read' may appear only once, as the first step")
        raise StageError(f"unknown preprocessing step '{name}'")


def save(steps: list[dict[str, Any]], out: Path) -> Path:
    out.write_text(json.dumps({"steps": steps, "digest": digest(steps)}, indent=2) + "\n")
    return out


def load(path: Path) -> Preprocessor:
    data = json.loads(Path(path).read_text())
    return Preprocessor(data["steps"])
