"""Every preprocessing step, one frozen dataclass each, registered in `STEPS` by the key it has in the YAML: its
parameters (every default filled in), its OpenCV/NumPy implementation, the causes of a deploy/training mismatch the
diagnosis may try on it, and the form people write it in. The YAML's parameters are validated in
`pipelines/params/parity.py` (`PreprocessStep`); adding a step is a field there and a class here.

Steps are typed everywhere they are used; their dict forms are at the boundary only: `parse`/`dump` (the canonical
JSON digests and preprocess.json hold) and `friendly` (the YAML a fix suggests). The standard library, numpy and
OpenCV only (scipy through `resample`): this module is copied into a Triton Python-backend model
(`stages/release/triton/preprocess.py`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from typing import Any, Callable, ClassVar, Iterator

import cv2
import numpy as np

from trtflow.errors import StageError
from trtflow.stages.image import resample

INTERP = {"nearest": cv2.INTER_NEAREST, "linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC,
          "area": cv2.INTER_AREA, "lanczos": cv2.INTER_LANCZOS4}
COLOR = {"rgb2bgr": cv2.COLOR_RGB2BGR, "bgr2rgb": cv2.COLOR_BGR2RGB, "gray2rgb": cv2.COLOR_GRAY2RGB,
         "rgb2gray": cv2.COLOR_RGB2GRAY}
ROUNDING: dict[str, Callable[[float], int]] = {"floor": math.floor, "round": round, "ceil": math.ceil}
PIXELS = (0.0, 114.0, 127.5, 255.0)  # pad values people use: black, YOLO's grey, mid-grey, white
LETTERBOX_PADS = (0, 114, 127, 128, 255)
ROUNDINGS = ("floor", "round", "ceil")


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Step:
    """One step and its parameters. Frozen, sequences held as tuples: the diagnosis shares, compares and hashes
    steps across the sets it tries. `spatial` steps work on HxWxC images, so they come before `layout: chw` and
    `batch`; `sizes` steps may change the image's height and width."""

    name: ClassVar[str]
    spatial: ClassVar[bool] = False
    sizes: ClassVar[bool] = False
    # parameters left out of the canonical JSON at these values, as before the parameter existed: digests stay
    omitted: ClassVar[dict[str, Any]] = {}

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _frozen(getattr(self, f.name)))

    @classmethod
    def from_json(cls, value: Any) -> Step:
        """The step from its value in the canonical JSON or the YAML: a mapping of its parameters, or the one value
        of a step that has one."""
        return cls(**value) if isinstance(value, dict) else cls(value)

    def to_json(self) -> Any:
        """The canonical value, every default filled in: the same steps always give the same digest."""
        return {f.name: _plain(v) for f in fields(self)
                if (v := getattr(self, f.name)) is not None and self.omitted.get(f.name) != v}

    def friendly(self) -> Any:
        """The value in the form people write it."""
        return self.to_json()

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        raise NotImplementedError

    def causes(self, steps: Steps, i: int) -> Iterator[Cause]:
        """The single changes to this step (`steps[i]`) worth trying when deploy and training disagree."""
        return iter(())

    def fixed_size(self) -> tuple[int, int] | None:
        """(height, width) of every image the step gives; None where it depends on the image (or the step keeps
        it: see `sizes`)."""
        return None

    def scaled(self, fy: float, fx: float) -> Step:
        """The step for images fy times as high and fx times as wide (validate's data at a profile's shape)."""
        return self

    def moves(self, h: int, w: int) -> Frame:
        """Where the step puts a point of an h x w image, and the size it gives (`sizes` steps say; the rest keep
        every point where it is)."""
        return Frame.still(h, w)


@dataclass(frozen=True)
class Frame:
    """Where the points of an image land after steps: y' = sy * y + ty, x' = sx * x + tx in pixel-edge coordinates
    (a box's corners map as they are), the height and width after them, and the image's before. One step's
    (`Step.moves`), or the steps' composed (`of`): where the decoded image's points land in the tensor (labelled
    boxes and masks are drawn on the image as read)."""
    sy: float
    sx: float
    ty: float
    tx: float
    height: int
    width: int
    image: tuple[int, int]

    @classmethod
    def of(cls, steps: Steps, h: int, w: int) -> Frame:
        """The frame of an h x w image through `steps` (those after `read`)."""
        frame = cls.still(h, w)
        for step in steps:
            m = step.moves(frame.height, frame.width)
            frame = cls(frame.sy * m.sy, frame.sx * m.sx, frame.ty * m.sy + m.ty, frame.tx * m.sx + m.tx,
                        m.height, m.width, (h, w))
        return frame

    @classmethod
    def still(cls, h: int, w: int) -> Frame:
        """Every point of an h x w image where it is."""
        return cls(1.0, 1.0, 0.0, 0.0, h, w, (h, w))

    def scaled(self, fy: float, fx: float) -> Frame:
        """The frame of a map fy times as high and fx times as wide as the tensor image (a head's output)."""
        return Frame(self.sy * fy, self.sx * fx, self.ty * fy, self.tx * fx, round(self.height * fy),
                     round(self.width * fx), self.image)

    def back(self, boxes: np.ndarray) -> np.ndarray:
        """Boxes [K, 4] (x1, y1, x2, y2) in the tensor's coordinates, in the image's."""
        b = np.asarray(boxes, np.float64).reshape(-1, 4)
        return np.stack([(b[:, 0] - self.tx) / self.sx, (b[:, 1] - self.ty) / self.sy,
                         (b[:, 2] - self.tx) / self.sx, (b[:, 3] - self.ty) / self.sy], 1)

    def matrix(self) -> np.ndarray:
        """The 2 x 3 affine matrix taking the image's pixel centres to the tensor's (OpenCV's convention)."""
        return np.array([[self.sx, 0.0, self.tx + 0.5 * self.sx - 0.5],
                         [0.0, self.sy, self.ty + 0.5 * self.sy - 0.5]])


@dataclass(frozen=True)
class _Single(Step):
    """A step whose value is one parameter (`scale: 1/255`, `layout: chw`)."""

    def to_json(self) -> Any:
        (f,) = fields(self)
        return _plain(getattr(self, f.name))


Steps = list[Step]
Cause = tuple[str, str, Steps]  # (what differs, the fix as YAML, the changed steps)


def _replace(steps: Steps, i: int, step: Step) -> Steps:
    out = list(steps)
    out[i] = step
    return out


def _times(hw: tuple[int, int], fy: float, fx: float) -> tuple[int, int]:
    """(h, w) scaled by (fy, fx), rounded, at least 1: a size that was exactly (h0, w0) becomes exactly the target."""
    return max(1, round(hw[0] * fy)), max(1, round(hw[1] * fx))


def _flag(value: bool) -> str:
    return str(value).lower()


@dataclass(frozen=True)
class Read(Step):
    """How the file is decoded: colour order (or gray) and bit depth. The first step, always."""
    name = "read"
    color: str = "rgb"
    depth: int = 8

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        raise StageError("'read' may appear only once, as the first step")

    def causes(self, steps: Steps, i: int) -> Iterator[Cause]:
        if self.color in ("rgb", "bgr"):
            other = "bgr" if self.color == "rgb" else "rgb"
            yield ("R and B swapped", f"read: {other}", _replace(steps, i, replace(self, color=other)))
            yield ("read in colour where training reads gray", "read: gray",
                   _replace(steps, i, replace(self, color="gray")))
        else:
            for other in ("rgb", "bgr"):
                yield ("read as gray where training reads colour", f"read: {other}",
                       _replace(steps, i, replace(self, color=other)))

    def friendly(self) -> Any:
        return self.color if self.depth == 8 else self.to_json()


@dataclass(frozen=True)
class Resize(Step):
    """To `size` (h, w); or the shorter side to `shorter` (torchvision), or to `height` with the width keeping the
    aspect ratio up to `max_width` (text lines), the side computed from the aspect ratio rounded by `round`."""
    name, spatial, sizes = "resize", True, True
    omitted: ClassVar[dict[str, Any]] = {"round": "floor"}
    size: tuple[int, int] | None = None
    shorter: int | None = None
    height: int | None = None
    max_width: int | None = None
    round: str = "floor"
    interp: str = "linear"
    antialias: bool = False

    def _size(self, h: int, w: int) -> tuple[int, int]:
        rounded = ROUNDING[self.round]
        if self.size:
            return self.size
        if self.height:  # text lines: fixed height, the width keeps the aspect ratio up to max_width
            nh = self.height
            nw = max(1, rounded(nh * (w / h)))  # in PaddleOCR's order: nh * w / h can round to the other integer
            return nh, min(nw, self.max_width) if self.max_width else nw
        s = self.shorter  # torchvision semantics: the shorter side becomes `shorter`, the other keeps the ratio
        return (s, rounded(s * w / h)) if h <= w else (rounded(s * h / w), s)

    def moves(self, h: int, w: int) -> Frame:
        nh, nw = self._size(h, w)
        return Frame(nh / h, nw / w, 0.0, 0.0, nh, nw, (h, w))

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        nh, nw = self._size(*img.shape[:2])
        if self.antialias and self.interp in resample.FILTERS:
            # PIL/torchvision resampling: OpenCV's linear and cubic do not low-pass when shrinking
            return resample.resize(img, nh, nw, self.interp), layout
        out = cv2.resize(img, (nw, nh), interpolation=INTERP[self.interp])
        return (out[:, :, None] if out.ndim == 2 else out), layout

    def friendly(self) -> Any:
        return {k: v for k, v in self.to_json().items() if not (k == "antialias" and v is False)}

    def fixed_size(self) -> tuple[int, int] | None:
        return self.size

    def scaled(self, fy: float, fx: float) -> Step:
        if self.size:
            return replace(self, size=_times(self.size, fy, fx))
        if self.height:
            return replace(self, height=max(1, round(self.height * fy)),
                           max_width=max(1, round(self.max_width * fx)) if self.max_width else None)
        # the shorter side: at least as far as either side grows, so a crop after it still fits
        return replace(self, shorter=math.ceil(self.shorter * max(fy, fx)))

    def causes(self, steps: Steps, i: int) -> Iterator[Cause]:
        interp, aa = self.interp, self.antialias
        # the filter is one choice (a cubic without antialiasing, written from memory, is one mistake): every
        # interpolation with and without antialiasing; nearest has no antialiased form
        for other in INTERP:
            for other_aa in (False, True) if other != "nearest" else (False,):
                if (other, other_aa) == (interp, aa) or (other, other_aa, interp) == ("nearest", False, "nearest"):
                    continue
                changed = _replace(steps, i, replace(self, interp=other, antialias=other_aa))
                if other == interp:
                    yield ("antialiasing differs", f"resize with antialias: {_flag(other_aa)}", changed)
                elif other_aa == aa:
                    yield ("resize interpolation differs", f"resize with interp: {other}", changed)
                else:
                    yield ("resize filter differs", f"resize with interp: {other}, antialias: {_flag(other_aa)}",
                           changed)
        if self.size:
            h, w = self.size
            yield ("plain resize where training letterboxes", f"letterbox: {{size: {[h, w]}}}",
                   _replace(steps, i, Letterbox(size=(h, w), pad=114, interp=interp)))
            later = [s.size for s in steps[i + 1:] if isinstance(s, Pad)]
            if later and later[0] == (h, w):  # text lines: the training keeps the aspect ratio and pads the width
                for mode in ("floor", "ceil"):
                    yield ("aspect ratio not kept (training resizes to the height and pads)",
                           f"resize: {{height: {h}, max_width: {w}{'' if mode == 'floor' else ', round: ' + mode}}}",
                           _replace(steps, i, Resize(height=h, max_width=w, round=mode, interp=interp, antialias=aa)))
            return
        for mode in ROUNDINGS:
            if mode != self.round:
                yield ("resize rounding differs", f"resize with round: {mode}",
                       _replace(steps, i, replace(self, round=mode)))
        if self.height and self.max_width:
            yield ("aspect ratio kept where training stretches", f"resize: {{size: {[self.height, self.max_width]}}}",
                   _replace(steps, i, Resize(size=(self.height, self.max_width), interp=interp, antialias=aa)))


@dataclass(frozen=True)
class Letterbox(Step):
    """To fit inside `size` (h, w) keeping the aspect ratio, centred, the rest filled with `pad`."""
    name, spatial, sizes = "letterbox", True, True
    size: tuple[int, int]
    pad: float = 114
    interp: str = "linear"

    def _placed(self, h: int, w: int) -> tuple[int, int, int, int]:
        """(height, width, top, left) of the resized image inside `size`."""
        th, tw = self.size
        r = min(th / h, tw / w)
        nh, nw = round(h * r), round(w * r)
        return nh, nw, (th - nh) // 2, (tw - nw) // 2

    def moves(self, h: int, w: int) -> Frame:
        nh, nw, top, left = self._placed(h, w)
        return Frame(nh / h, nw / w, top, left, *self.size, (h, w))

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        th, tw = self.size
        nh, nw, top, left = self._placed(*img.shape[:2])
        resized = cv2.resize(img, (nw, nh), interpolation=INTERP[self.interp])
        if resized.ndim == 2:
            resized = resized[:, :, None]
        out = np.full((th, tw, img.shape[2]), self.pad, dtype=img.dtype)
        out[top:top + nh, left:left + nw] = resized
        return out, layout

    def fixed_size(self) -> tuple[int, int] | None:
        return self.size

    def scaled(self, fy: float, fx: float) -> Step:
        return replace(self, size=_times(self.size, fy, fx))

    def causes(self, steps: Steps, i: int) -> Iterator[Cause]:
        for interp in INTERP:
            if interp != self.interp:
                yield ("letterbox interpolation differs", f"letterbox with interp: {interp}",
                       _replace(steps, i, replace(self, interp=interp)))
        yield ("letterbox where training resizes plainly", f"resize: {{size: {list(self.size)}}}",
               _replace(steps, i, Resize(size=self.size, interp=self.interp)))
        for pad in LETTERBOX_PADS:
            if pad != self.pad:
                yield ("pad value differs", f"letterbox with pad: {pad}", _replace(steps, i, replace(self, pad=pad)))


@dataclass(frozen=True)
class CenterCrop(Step):
    """The centre `size` (h, w; one side for a square), its offset (size - crop) / 2 rounded by `round`."""
    name, spatial, sizes = "center_crop", True, True
    size: tuple[int, int]
    round: str = "round"  # as torchvision: half to even

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.size, int):
            object.__setattr__(self, "size", (self.size, self.size))

    def to_json(self) -> Any:
        """(h, w), or {size: (h, w), round: ...} when the offset is not rounded as torchvision rounds it."""
        return list(self.size) if self.round == "round" else {"size": list(self.size), "round": self.round}

    def friendly(self) -> Any:
        side = self.size[0] if self.size[0] == self.size[1] else list(self.size)
        return side if self.round == "round" else {"size": side, "round": self.round}

    def _corner(self, h: int, w: int) -> tuple[int, int]:
        ch, cw = self.size
        if ch > h or cw > w:
            raise StageError(f"center_crop {ch}x{cw} is larger than the image ({h}x{w}) at that step")
        rounded = ROUNDING[self.round]
        return int(rounded((h - ch) / 2.0)), int(rounded((w - cw) / 2.0))

    def moves(self, h: int, w: int) -> Frame:
        top, left = self._corner(h, w)
        return Frame(1.0, 1.0, -top, -left, *self.size, (h, w))

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        ch, cw = self.size
        top, left = self._corner(*img.shape[:2])
        return img[top:top + ch, left:left + cw], layout

    def fixed_size(self) -> tuple[int, int] | None:
        return self.size

    def scaled(self, fy: float, fx: float) -> Step:
        return replace(self, size=_times(self.size, fy, fx))

    def causes(self, steps: Steps, i: int) -> Iterator[Cause]:
        for mode in ROUNDINGS:
            if mode != self.round:
                yield ("crop offset by one pixel", f"center_crop with round: {mode}",
                       _replace(steps, i, replace(self, round=mode)))


@dataclass(frozen=True)
class Crop(Step):
    name, spatial, sizes = "crop", True, True
    top: int
    left: int
    height: int
    width: int

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        t, l, ch, cw = self.top, self.left, self.height, self.width
        if t + ch > img.shape[0] or l + cw > img.shape[1]:
            raise StageError(f"crop {self.to_json()} falls outside the image ({img.shape[0]}x{img.shape[1]})")
        return img[t:t + ch, l:l + cw], layout

    def moves(self, h: int, w: int) -> Frame:
        return Frame(1.0, 1.0, -self.top, -self.left, self.height, self.width, (h, w))

    def fixed_size(self) -> tuple[int, int] | None:
        return self.height, self.width

    def scaled(self, fy: float, fx: float) -> Step:
        height, width = _times((self.height, self.width), fy, fx)
        return replace(self, top=round(self.top * fy), left=round(self.left * fx), height=height, width=width)

    def causes(self, steps: Steps, i: int) -> Iterator[Cause]:
        for key in ("top", "left"):
            for delta in (-1, 1):
                moved = getattr(self, key) + delta
                if moved >= 0:
                    yield ("crop offset by one pixel", f"crop with {key}: {moved}",
                           _replace(steps, i, replace(self, **{key: moved})))


@dataclass(frozen=True)
class Color(_Single):
    name, spatial = "color", True
    conversion: str

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        out = cv2.cvtColor(img, COLOR[self.conversion])
        return (out[:, :, None] if out.ndim == 2 else out), layout


@dataclass(frozen=True)
class Pad(Step):
    """To `size` ((h, w) or "square") with the image at `place`, in either layout (PaddleOCR pads after
    normalizing, in CHW); `value` on the tensor's scale at that step, one or one per channel."""
    name, sizes = "pad", True
    # the placement every pad had before `place` existed is left out: their digests stay what they were
    omitted: ClassVar[dict[str, Any]] = {"place": "top_left"}
    size: tuple[int, int] | str
    value: float | tuple[float, ...] = 0.0
    place: str = "top_left"

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        if img.ndim != 3:
            raise StageError("'pad' must come before 'batch'")
        hwc = layout == "hwc"
        h, w, c = img.shape if hwc else (img.shape[1], img.shape[2], img.shape[0])
        th, tw, top, left = self._placed(h, w)
        value = np.asarray(self.value, np.float64).reshape(-1)
        if len(value) not in (1, c):
            raise StageError(f"pad has {len(value)} values for an image with {c} channels")
        if np.issubdtype(img.dtype, np.integer):
            value = np.clip(np.round(value), np.iinfo(img.dtype).min, np.iinfo(img.dtype).max)
        out = np.empty((th, tw, c) if hwc else (c, th, tw), img.dtype)
        out[...] = value.reshape((1, 1, -1) if hwc else (-1, 1, 1)).astype(img.dtype)
        if hwc:
            out[top:top + h, left:left + w] = img
        else:
            out[:, top:top + h, left:left + w] = img
        return out, layout

    def _placed(self, h: int, w: int) -> tuple[int, int, int, int]:
        """(height, width) padded to, and (top, left) of the image in it."""
        th, tw = (max(h, w), max(h, w)) if self.size == "square" else self.size
        if h > th or w > tw:
            raise StageError(f"pad: the image is {h}x{w} at that step, larger than size [{th}, {tw}] "
                             f"(resize with max_width, or a larger pad size)")
        top, left = {"top_left": (0, 0), "center": ((th - h) // 2, (tw - w) // 2),
                     "bottom_right": (th - h, tw - w)}[self.place]
        return th, tw, top, left

    def moves(self, h: int, w: int) -> Frame:
        th, tw, top, left = self._placed(h, w)
        return Frame(1.0, 1.0, top, left, th, tw, (h, w))

    def fixed_size(self) -> tuple[int, int] | None:
        return None if self.size == "square" else self.size

    def scaled(self, fy: float, fx: float) -> Step:
        return self if self.size == "square" else replace(self, size=_times(self.size, fy, fx))

    def causes(self, steps: Steps, i: int) -> Iterator[Cause]:
        yield from self._values(steps, i)
        for place in ("top_left", "center", "bottom_right"):
            if place != self.place:
                yield ("padding placed differently", f"pad with place: {place}",
                       _replace(steps, i, replace(self, place=place)))

    def _values(self, steps: Steps, i: int) -> Iterator[Cause]:
        """Pad values on the scale of the tensor at the pad step: the usual pixel values taken through the scale
        and normalize steps before it, and 0 (PaddleOCR pads with 0 after normalizing)."""
        current = np.atleast_1d(np.asarray(self.value, np.float64))
        seen = [current]
        for pixel in (None, *PIXELS):
            value = np.zeros(1) if pixel is None else _through(steps[:i], pixel)
            if any(np.allclose(v, value, atol=1e-6) for v in seen
                   if 1 in (v.size, value.size) or v.size == value.size):
                continue
            seen.append(value)
            plain = round(float(value[0]), 6) if np.allclose(value, value[0]) else [round(float(v), 6) for v in value]
            shown = f"{plain:g}" if isinstance(plain, float) else "[" + ", ".join(f"{v:g}" for v in plain) + "]"
            yield ("pad value differs", f"pad with value: {shown}", _replace(steps, i, replace(self, value=plain)))


@dataclass(frozen=True)
class Dtype(_Single):
    name = "dtype"
    dtype: str

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        return img.astype(self.dtype), layout


@dataclass(frozen=True)
class Scale(_Single):
    name = "scale"
    factor: float

    @classmethod
    def from_json(cls, value: Any) -> Step:
        if isinstance(value, str):  # the YAML's fraction, e.g. 1/255
            numerator, _, denominator = value.partition("/")
            value = float(numerator) / float(denominator) if denominator else float(numerator)
        return cls(value)

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        return img.astype(np.float32) * np.float32(self.factor), layout

    def causes(self, steps: Steps, i: int) -> Iterator[Cause]:
        for factor, label in ((self.factor * 255, "x255"), (self.factor / 255, "/255")):
            yield (f"pixel scale differs ({label})", f"scale: {num(factor)}", _replace(steps, i, Scale(factor)))
        yield ("pixel scale differs", "remove the scale step", steps[:i] + steps[i + 1:])

    def friendly(self) -> Any:
        return num(self.factor)


@dataclass(frozen=True)
class Normalize(Step):
    """(x - mean) / std, one of each or one per channel."""
    name = "normalize"
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        c = img.shape[0] if layout == "chw" else img.shape[-1]
        mean, std = np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)
        if len(mean) not in (1, c) or len(std) not in (1, c):
            raise StageError(f"normalize has {len(mean)} means / {len(std)} stds for an image with {c} channels")
        shape = (-1, 1, 1) if layout == "chw" else (1, 1, -1)
        return (img.astype(np.float32) - mean.reshape(shape)) / std.reshape(shape), layout

    def causes(self, steps: Steps, i: int) -> Iterator[Cause]:
        for factor, label in ((255.0, "x255"), (1 / 255.0, "/255")):
            fixed = Normalize(tuple(m * factor for m in self.mean), tuple(s * factor for s in self.std))
            yield (f"mean/std on the other scale ({label})",
                   f"normalize: {{mean: {short(fixed.mean)}, std: {short(fixed.std)}}}", _replace(steps, i, fixed))

    def friendly(self) -> Any:
        return {"mean": [round(v, 6) for v in self.mean], "std": [round(v, 6) for v in self.std]}


@dataclass(frozen=True)
class Layout(_Single):
    name = "layout"
    layout: str  # "hwc" or "chw"

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        if self.layout == layout:
            return img, layout
        return (np.ascontiguousarray(img.transpose(2, 0, 1)) if self.layout == "chw"
                else np.ascontiguousarray(img.transpose(1, 2, 0))), self.layout

    def causes(self, steps: Steps, i: int) -> Iterator[Cause]:
        other = "hwc" if self.layout == "chw" else "chw"
        yield ("layout differs", f"layout: {other}", _replace(steps, i, Layout(other)))


@dataclass(frozen=True)
class Batch(_Single):
    name = "batch"
    batch: bool

    def apply(self, img: np.ndarray, layout: str) -> tuple[np.ndarray, str]:
        return (img[None] if self.batch else img), layout


STEPS: dict[str, type[Step]] = {s.name: s for s in (Read, Resize, Letterbox, CenterCrop, Crop, Color, Pad, Dtype,
                                                    Scale, Normalize, Layout, Batch)}


def step_of(name: str, value: Any) -> Step:
    """One step from its name and its value in the canonical JSON or the YAML."""
    kind = STEPS.get(name)
    if kind is None:
        raise StageError(f"unknown preprocessing step '{name}'")
    try:
        return kind.from_json(value)
    except (TypeError, ValueError) as exc:
        raise StageError(f"preprocessing step '{name}': cannot read {value!r} ({exc})") from None


def parse(data: list[Any]) -> Steps:
    """Steps from their canonical JSON (preprocess.json, a report) or their YAML form: each a mapping of one step
    name to its value, e.g. {"resize": {"shorter": 256}}; the defaults are filled in."""
    out = []
    for item in data:
        if not isinstance(item, dict) or len(item) != 1:
            raise StageError(f"a preprocessing step is a mapping of one name to its value, e.g. "
                             f"{{resize: {{shorter: 256}}}}; got {item!r}")
        (name, value), = item.items()
        out.append(step_of(name, value))
    return out


def dump(steps: Steps) -> list[dict[str, Any]]:
    """The canonical JSON of the steps: what digests and preprocess.json hold."""
    return [{step.name: step.to_json()} for step in steps]


def apply(img: np.ndarray, step: Step, layout: str) -> tuple[np.ndarray, str]:
    """One step on the image so far (in `layout`): the image after it and its layout."""
    if step.spatial and (layout != "hwc" or img.ndim != 3):
        raise StageError(f"'{step.name}' must come before 'layout: chw' and 'batch'")
    return step.apply(img, layout)


def _through(steps: Steps, pixel: float) -> np.ndarray:
    """A pixel value taken through the scale and normalize steps."""
    value = np.array([pixel], np.float64)
    for step in steps:
        if isinstance(step, Scale):
            value = value * step.factor
        elif isinstance(step, Normalize):
            value = (value - np.asarray(step.mean)) / np.asarray(step.std)
    return value


def num(x: float) -> str:
    f = Fraction(x).limit_denominator(1000)
    if abs(float(f) - x) < 1e-9 and f.denominator != 1:
        return f"{f.numerator}/{f.denominator}"
    return f"{x:g}"


def short(values: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"
