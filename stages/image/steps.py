"""Every preprocessing step, one class each, registered in `STEPS` by the key it has in the YAML: its canonical
form, its OpenCV/NumPy implementation, the causes of a deploy/training mismatch the diagnosis may try on it, and
the form people write it in. The step's parameters are declared in `pipelines/params/parity.py` (`PreprocessStep`);
adding a step is a field there and a class here.
"""
from __future__ import annotations

import copy
import math
from fractions import Fraction
from typing import Any, Callable, ClassVar, Iterator

import cv2
import numpy as np

from trtflow.errors import StageError
from trtflow.stages.image import resample

Steps = list[dict[str, Any]]
Cause = tuple[str, str, Steps]  # (what differs, the fix as YAML, the changed steps)

INTERP = {"nearest": cv2.INTER_NEAREST, "linear": cv2.INTER_LINEAR, "cubic": cv2.INTER_CUBIC,
          "area": cv2.INTER_AREA, "lanczos": cv2.INTER_LANCZOS4}
COLOR = {"rgb2bgr": cv2.COLOR_RGB2BGR, "bgr2rgb": cv2.COLOR_BGR2RGB, "gray2rgb": cv2.COLOR_GRAY2RGB,
         "rgb2gray": cv2.COLOR_RGB2GRAY}
ROUNDING: dict[str, Callable[[float], int]] = {"floor": math.floor, "round": round, "ceil": math.ceil}
PIXELS = (0.0, 114.0, 127.5, 255.0)  # pad values people use: black, YOLO's grey, mid-grey, white
LETTERBOX_PADS = (0, 114, 127, 128, 255)
ROUNDINGS = ("floor", "round", "ceil")


class Step:
    """One kind of step. `spatial` steps work on HxWxC images, so they come before `layout: chw` and `batch`;
    `sizes` steps may change the image's height and width."""

    name: ClassVar[str]
    spatial: ClassVar[bool] = False
    sizes: ClassVar[bool] = False

    def canonical(self, value: Any) -> Any:
        """The value with every default filled in: the same steps always give the same digest."""
        return value

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        raise NotImplementedError

    def causes(self, steps: Steps, i: int, value: Any) -> Iterator[Cause]:
        """The single changes to this step worth trying when deploy and training disagree."""
        return iter(())

    def friendly(self, value: Any) -> Any:
        """The canonical value in the form people write it."""
        return {k: v for k, v in value.items() if not (k == "antialias" and v is False)} \
            if isinstance(value, dict) else value

    def fixed_size(self, value: Any) -> tuple[int, int] | None:
        """(height, width) of every image the step gives; None where it depends on the image (or the step keeps
        it: see `sizes`)."""
        return None

    def scaled(self, value: Any, fy: float, fx: float) -> Any:
        """The value for images fy times as high and fx times as wide (validate's data at a profile's shape)."""
        return value


def _replace(steps: Steps, i: int, step: dict[str, Any]) -> Steps:
    out = copy.deepcopy(steps)
    out[i] = step
    return out



class Read(Step):
    name = "read"

    def canonical(self, value: Any) -> Any:
        return {"color": value, "depth": 8} if isinstance(value, str) else value

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        raise StageError("'read' may appear only once, as the first step")

    def causes(self, steps: Steps, i: int, value: Any) -> Iterator[Cause]:
        return _read(steps, i, value)

    def friendly(self, value: Any) -> Any:
        return value["color"] if value.get("depth", 8) == 8 else value


class Resize(Step):
    name, spatial, sizes = "resize", True, True

    def canonical(self, value: Any) -> Any:
        if value.get("round") == "floor":  # the default: the same steps, the same digest
            return {k: v for k, v in value.items() if k != "round"}
        return value

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        return _resize(img, value), layout

    def causes(self, steps: Steps, i: int, value: Any) -> Iterator[Cause]:
        return _resize_causes(steps, i, value)

    def fixed_size(self, value: Any) -> tuple[int, int] | None:
        return tuple(value["size"]) if value.get("size") else None

    def scaled(self, value: Any, fy: float, fx: float) -> Any:
        out = dict(value)
        if out.get("size"):
            out["size"] = _times(out["size"], fy, fx)
        elif out.get("height"):
            out["height"] = max(1, round(out["height"] * fy))
            if out.get("max_width"):
                out["max_width"] = max(1, round(out["max_width"] * fx))
        else:  # the shorter side: at least as far as either side grows, so a crop after it still fits
            out["shorter"] = math.ceil(out["shorter"] * max(fy, fx))
        return out


class Letterbox(Step):
    name, spatial, sizes = "letterbox", True, True

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        return _letterbox(img, value), layout

    def fixed_size(self, value: Any) -> tuple[int, int] | None:
        return tuple(value["size"])

    def scaled(self, value: Any, fy: float, fx: float) -> Any:
        return {**value, "size": _times(value["size"], fy, fx)}

    def causes(self, steps: Steps, i: int, value: Any) -> Iterator[Cause]:
        for interp in INTERP:
            if interp != value.get("interp", "linear"):
                yield ("letterbox interpolation differs", f"letterbox with interp: {interp}",
                       _replace(steps, i, {"letterbox": {**value, "interp": interp}}))
        yield ("letterbox where training resizes plainly", f"resize: {{size: {value['size']}}}",
               _replace(steps, i, {"resize": {"size": value["size"], "interp": value.get("interp", "linear")}}))
        for pad in LETTERBOX_PADS:
            if pad != value.get("pad", 114):
                yield ("pad value differs", f"letterbox with pad: {pad}",
                       _replace(steps, i, {"letterbox": {**value, "pad": pad}}))


class CenterCrop(Step):
    name, spatial, sizes = "center_crop", True, True

    def canonical(self, value: Any) -> Any:
        return _center_crop_spec(value)

    def fixed_size(self, value: Any) -> tuple[int, int] | None:
        return tuple(value["size"] if isinstance(value, dict) else value)

    def scaled(self, value: Any, fy: float, fx: float) -> Any:
        if isinstance(value, dict):
            return {**value, "size": _times(value["size"], fy, fx)}
        return _times(value, fy, fx)

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        return _center_crop(img, value), layout

    def causes(self, steps: Steps, i: int, value: Any) -> Iterator[Cause]:
        return _crop_offsets(steps, i, self.name, value)

    def friendly(self, value: Any) -> Any:
        if isinstance(value, list) and value[0] == value[1]:
            return value[0]
        if isinstance(value, dict) and value["size"][0] == value["size"][1]:
            return {**value, "size": value["size"][0]}
        return value


class Crop(Step):
    name, spatial, sizes = "crop", True, True

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        return _crop(img, value), layout

    def fixed_size(self, value: Any) -> tuple[int, int] | None:
        return value["height"], value["width"]

    def scaled(self, value: Any, fy: float, fx: float) -> Any:
        height, width = _times([value["height"], value["width"]], fy, fx)
        return {**value, "top": round(value["top"] * fy), "left": round(value["left"] * fx), "height": height,
                "width": width}

    def causes(self, steps: Steps, i: int, value: Any) -> Iterator[Cause]:
        return _crop_offsets(steps, i, self.name, value)


class Color(Step):
    name, spatial = "color", True

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        return _color(img, value), layout


class Pad(Step):
    name, sizes = "pad", True

    def canonical(self, value: Any) -> Any:
        # the placement every pad had before `place` existed is left out: their digests stay what they were
        return {k: v for k, v in value.items() if not (k == "place" and v == "top_left")}

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        if img.ndim != 3:
            raise StageError("'pad' must come before 'batch'")
        return _pad(img, value, layout), layout

    def fixed_size(self, value: Any) -> tuple[int, int] | None:
        return None if value["size"] == "square" else tuple(value["size"])

    def scaled(self, value: Any, fy: float, fx: float) -> Any:
        return value if value["size"] == "square" else {**value, "size": _times(value["size"], fy, fx)}

    def causes(self, steps: Steps, i: int, value: Any) -> Iterator[Cause]:
        yield from _pad_values(steps, i, value)
        for place in ("top_left", "center", "bottom_right"):
            if place != value.get("place", "top_left"):
                yield ("padding placed differently", f"pad with place: {place}",
                       _replace(steps, i, {"pad": {**value, "place": place}}))


class Dtype(Step):
    name = "dtype"

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        return img.astype(value), layout


class Scale(Step):
    name = "scale"

    def canonical(self, value: Any) -> Any:
        if isinstance(value, str):
            num_, _, den = value.partition("/")
            return float(num_) / float(den) if den else float(num_)
        return value

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        return img.astype(np.float32) * np.float32(value), layout

    def causes(self, steps: Steps, i: int, value: Any) -> Iterator[Cause]:
        yield ("pixel scale differs (x255)", f"scale: {num(value * 255)}", _replace(steps, i, {"scale": value * 255}))
        yield ("pixel scale differs (/255)", f"scale: {num(value / 255)}", _replace(steps, i, {"scale": value / 255}))
        yield ("pixel scale differs", "remove the scale step", steps[:i] + steps[i + 1:])

    def friendly(self, value: Any) -> Any:
        return num(value)


class Normalize(Step):
    name = "normalize"

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        return _normalize(img, value, layout), layout

    def causes(self, steps: Steps, i: int, value: Any) -> Iterator[Cause]:
        for factor, label in ((255.0, "x255"), (1 / 255.0, "/255")):
            fixed = {"mean": [m * factor for m in value["mean"]], "std": [s * factor for s in value["std"]]}
            yield (f"mean/std on the other scale ({label})",
                   f"normalize: {{mean: {short(fixed['mean'])}, std: {short(fixed['std'])}}}",
                   _replace(steps, i, {"normalize": fixed}))

    def friendly(self, value: Any) -> Any:
        return {k: [round(v, 6) for v in vs] for k, vs in value.items()}


class Layout(Step):
    name = "layout"

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        if value == layout:
            return img, layout
        return (np.ascontiguousarray(img.transpose(2, 0, 1)) if value == "chw"
                else np.ascontiguousarray(img.transpose(1, 2, 0))), value

    def causes(self, steps: Steps, i: int, value: Any) -> Iterator[Cause]:
        other = "hwc" if value == "chw" else "chw"
        yield ("layout differs", f"layout: {other}", _replace(steps, i, {"layout": other}))


class Batch(Step):
    name = "batch"

    def apply(self, img: np.ndarray, value: Any, layout: str) -> tuple[np.ndarray, str]:
        return (img[None] if value else img), layout


STEPS: dict[str, Step] = {s.name: s for s in (Read(), Resize(), Letterbox(), CenterCrop(), Crop(), Color(), Pad(),
                                              Dtype(), Scale(), Normalize(), Layout(), Batch())}


def apply(img: np.ndarray, name: str, value: Any, layout: str) -> tuple[np.ndarray, str]:
    """One canonical step on the image so far (in `layout`): the image after it and its layout."""
    step = STEPS.get(name)
    if step is None:
        raise StageError(f"unknown preprocessing step '{name}'")
    if step.spatial and (layout != "hwc" or img.ndim != 3):
        raise StageError(f"'{name}' must come before 'layout: chw' and 'batch'")
    return step.apply(img, value, layout)


# --- implementations ----------------------------------------------------------------------------------------------

def _times(hw: list[int], fy: float, fx: float) -> list[int]:
    """[h, w] scaled by (fy, fx), rounded, at least 1: a size that was exactly (h0, w0) becomes exactly the target."""
    return [max(1, round(hw[0] * fy)), max(1, round(hw[1] * fx))]


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


def _center_crop_spec(value: Any) -> Any:
    """[h, w], or {size: [h, w], round: ...} when the offset is not rounded as torchvision rounds it."""
    spec = value if isinstance(value, dict) else {"size": value}
    size = spec["size"]
    size = [size, size] if isinstance(size, int) else list(size)
    return size if spec.get("round", "round") == "round" else {"size": size, "round": spec["round"]}


def _center_crop(img: np.ndarray, spec: Any) -> np.ndarray:
    ch, cw = spec["size"] if isinstance(spec, dict) else spec
    rounded = ROUNDING[spec["round"] if isinstance(spec, dict) else "round"]  # torchvision: round half to even
    h, w = img.shape[:2]
    if ch > h or cw > w:
        raise StageError(f"center_crop {ch}x{cw} is larger than the image ({h}x{w}) at that step")
    top, left = int(rounded((h - ch) / 2.0)), int(rounded((w - cw) / 2.0))
    return img[top:top + ch, left:left + cw]


def _crop(img: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    t, l, ch, cw = spec["top"], spec["left"], spec["height"], spec["width"]
    if t + ch > img.shape[0] or l + cw > img.shape[1]:
        raise StageError(f"crop {spec} falls outside the image ({img.shape[0]}x{img.shape[1]})")
    return img[t:t + ch, l:l + cw]


def _color(img: np.ndarray, conv: str) -> np.ndarray:
    out = cv2.cvtColor(img, COLOR[conv])
    return out[:, :, None] if out.ndim == 2 else out


def _pad(img: np.ndarray, spec: dict[str, Any], layout: str) -> np.ndarray:
    """Pads to `size` ([h, w] or "square") with the image at `place`, in either layout (PaddleOCR pads after
    normalizing, in CHW)."""
    hwc = layout == "hwc"
    h, w, c = img.shape if hwc else (img.shape[1], img.shape[2], img.shape[0])
    th, tw = (max(h, w), max(h, w)) if spec["size"] == "square" else spec["size"]
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
    place = spec.get("place", "top_left")
    top, left = {"top_left": (0, 0), "center": ((th - h) // 2, (tw - w) // 2),
                 "bottom_right": (th - h, tw - w)}[place]
    if hwc:
        out[top:top + h, left:left + w] = img
    else:
        out[:, top:top + h, left:left + w] = img
    return out


def _normalize(img: np.ndarray, spec: dict[str, Any], layout: str) -> np.ndarray:
    c = img.shape[0] if layout == "chw" else img.shape[-1]
    mean, std = np.asarray(spec["mean"], np.float32), np.asarray(spec["std"], np.float32)
    if len(mean) not in (1, c) or len(std) not in (1, c):
        raise StageError(f"normalize has {len(mean)} means / {len(std)} stds for an image with {c} channels")
    shape = (-1, 1, 1) if layout == "chw" else (1, 1, -1)
    return (img.astype(np.float32) - mean.reshape(shape)) / std.reshape(shape)


# --- causes -------------------------------------------------------------------------------------------------------

def _read(steps: Steps, i: int, val: dict[str, Any]) -> Iterator[tuple[str, str, Steps]]:
    color = val["color"]
    if color in ("rgb", "bgr"):
        other = "bgr" if color == "rgb" else "rgb"
        yield ("R and B swapped", f"read: {other}", _replace(steps, i, {"read": {**val, "color": other}}))
        yield ("read in colour where training reads gray", "read: gray",
               _replace(steps, i, {"read": {**val, "color": "gray"}}))
    else:
        for other in ("rgb", "bgr"):
            yield ("read as gray where training reads colour", f"read: {other}",
                   _replace(steps, i, {"read": {**val, "color": other}}))


def _resize_causes(steps: Steps, i: int, val: dict[str, Any]) -> Iterator[tuple[str, str, Steps]]:
    interp, aa = val.get("interp", "linear"), bool(val.get("antialias"))
    # the filter is one choice (a cubic without antialiasing, written from memory, is one mistake): every
    # interpolation with and without antialiasing; nearest has no antialiased form
    for other in INTERP:
        for other_aa in (False, True) if other != "nearest" else (False,):
            if (other, other_aa) == (interp, aa) or (other, other_aa, interp) == ("nearest", False, "nearest"):
                continue
            changed = _replace(steps, i, {"resize": {**val, "interp": other, "antialias": other_aa}})
            if other == interp:
                yield ("antialiasing differs", f"resize with antialias: {str(other_aa).lower()}", changed)
            elif other_aa == aa:
                yield ("resize interpolation differs", f"resize with interp: {other}", changed)
            else:
                yield ("resize filter differs", f"resize with interp: {other}, antialias: {str(other_aa).lower()}",
                       changed)
    if val.get("size"):
        h, w = val["size"]
        yield ("plain resize where training letterboxes", f"letterbox: {{size: {[h, w]}}}",
               _replace(steps, i, {"letterbox": {"size": [h, w], "pad": 114, "interp": interp}}))
        later = [s["pad"]["size"] for s in steps[i + 1:] if "pad" in s]
        if later and later[0] == [h, w]:  # text lines: the training keeps the aspect ratio and pads the width
            for mode in ("floor", "ceil"):
                spec = {"height": h, "max_width": w, **({"round": mode} if mode != "floor" else {}),
                        "interp": interp, "antialias": aa}
                yield ("aspect ratio not kept (training resizes to the height and pads)",
                       "resize: {" + ", ".join(f"{k}: {v}" for k, v in list(spec.items())[:-2]) + "}",
                       _replace(steps, i, {"resize": spec}))
        return
    current = val.get("round") or "floor"
    for mode in ROUNDINGS:
        if mode != current:
            spec = {k: v for k, v in val.items() if k != "round"} | ({"round": mode} if mode != "floor" else {})
            yield ("resize rounding differs", f"resize with round: {mode}", _replace(steps, i, {"resize": spec}))
    if val.get("height") and val.get("max_width"):
        yield ("aspect ratio kept where training stretches", f"resize: {{size: {[val['height'], val['max_width']]}}}",
               _replace(steps, i, {"resize": {"size": [val["height"], val["max_width"]], "interp": interp,
                                              "antialias": aa}}))


def _pad_values(steps: Steps, i: int, val: dict[str, Any]) -> Iterator[tuple[str, str, Steps]]:
    """Pad values on the scale of the tensor at the pad step: the usual pixel values taken through the scale and
    normalize steps before it, and 0 (PaddleOCR pads with 0 after normalizing)."""
    current = np.atleast_1d(np.asarray(val.get("value", 0.0), np.float64))
    seen = [current]
    for pixel in (None, *PIXELS):
        value = np.zeros(1) if pixel is None else _through(steps[:i], pixel)
        if any(np.allclose(v, value, atol=1e-6) for v in seen if 1 in (v.size, value.size) or v.size == value.size):
            continue
        seen.append(value)
        plain = round(float(value[0]), 6) if np.allclose(value, value[0]) else [round(float(v), 6) for v in value]
        shown = f"{plain:g}" if isinstance(plain, float) else "[" + ", ".join(f"{v:g}" for v in plain) + "]"
        yield ("pad value differs", f"pad with value: {shown}", _replace(steps, i, {"pad": {**val, "value": plain}}))


def _through(steps: Steps, pixel: float) -> np.ndarray:
    value = np.array([pixel], np.float64)
    for step in steps:
        (name, val), = step.items()
        if name == "scale":
            value = value * val
        elif name == "normalize":
            value = (value - np.asarray(val["mean"])) / np.asarray(val["std"])
    return value


def _crop_offsets(steps: Steps, i: int, name: str, val: Any) -> Iterator[tuple[str, str, Steps]]:
    if name == "center_crop":
        size, current = (val["size"], val["round"]) if isinstance(val, dict) else (val, "round")
        for mode in ROUNDINGS:
            if mode != current:
                spec = size if mode == "round" else {"size": size, "round": mode}
                yield ("crop offset by one pixel", f"center_crop with round: {mode}",
                       _replace(steps, i, {"center_crop": spec}))
        return
    for key in ("top", "left"):
        for delta in (-1, 1):
            if val[key] + delta >= 0:
                yield ("crop offset by one pixel", f"crop with {key}: {val[key] + delta}",
                       _replace(steps, i, {"crop": {**val, key: val[key] + delta}}))


def num(x: float) -> str:
    f = Fraction(x).limit_denominator(1000)
    if abs(float(f) - x) < 1e-9 and f.denominator != 1:
        return f"{f.numerator}/{f.denominator}"
    return f"{x:g}"


def short(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"
