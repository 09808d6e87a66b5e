"""The usual causes of a deploy/training preprocessing mismatch, each as one change to the declared steps.

`candidates(steps)` yields (cause, fix, changed steps) for every change that applies to these steps: R and B
swapped, gray vs colour read, another interpolation, antialiasing, the rounding of a size computed from the aspect
ratio, letterbox vs plain resize, the pad value, a crop offset by one pixel, uint8 rounding before normalization,
x255 or /255, mean/std on the other scale, layout, crop/resize order. The fix reads as the YAML to change.
"""
from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any, Iterator

import numpy as np

from trtflow.stages.image.preprocess import INTERP

Steps = list[dict[str, Any]]
SPATIAL = ("resize", "letterbox", "center_crop", "crop")
PIXELS = (0.0, 114.0, 127.5, 255.0)  # pad values people use: black, YOLO's grey, mid-grey, white
LETTERBOX_PADS = (0, 114, 127, 128, 255)
ROUNDINGS = ("floor", "round", "ceil")


def _replace(steps: Steps, i: int, step: dict[str, Any]) -> Steps:
    out = copy.deepcopy(steps)
    out[i] = step
    return out


def _names(steps: Steps) -> list[str]:
    return [next(iter(s)) for s in steps]


def candidates(steps: Steps) -> Iterator[tuple[str, str, Steps]]:
    """(cause, fix, changed steps) for every single change worth trying."""
    names = _names(steps)
    for i, step in enumerate(steps):
        (name, val), = step.items()
        if name == "read":
            yield from _read(steps, i, val)
        if name == "letterbox":
            for interp in INTERP:
                if interp != val.get("interp", "linear"):
                    yield (f"{name} interpolation differs", f"{name} with interp: {interp}",
                           _replace(steps, i, {name: {**val, "interp": interp}}))
        if name == "resize":
            yield from _resize(steps, i, val)
        if name == "letterbox":
            yield ("letterbox where training resizes plainly", f"resize: {{size: {val['size']}}}",
                   _replace(steps, i, {"resize": {"size": val["size"], "interp": val.get("interp", "linear")}}))
            for pad in LETTERBOX_PADS:
                if pad != val.get("pad", 114):
                    yield ("pad value differs", f"letterbox with pad: {pad}",
                           _replace(steps, i, {"letterbox": {**val, "pad": pad}}))
        if name == "pad":
            yield from _pad_values(steps, i, val)
        if name in ("center_crop", "crop"):
            yield from _crop_offsets(steps, i, name, val)
        if name == "scale":
            yield ("pixel scale differs (x255)", f"scale: {num(val * 255)}", _replace(steps, i, {"scale": val * 255}))
            yield ("pixel scale differs (/255)", f"scale: {num(val / 255)}", _replace(steps, i, {"scale": val / 255}))
            yield ("pixel scale differs", "remove the scale step", steps[:i] + steps[i + 1:])
        if name == "normalize":
            for factor, label in ((255.0, "x255"), (1 / 255.0, "/255")):
                fixed = {"mean": [m * factor for m in val["mean"]], "std": [s * factor for s in val["std"]]}
                yield (f"mean/std on the other scale ({label})",
                       f"normalize: {{mean: {short(fixed['mean'])}, std: {short(fixed['std'])}}}",
                       _replace(steps, i, {"normalize": fixed}))
        if name == "layout":
            other = "hwc" if val == "chw" else "chw"
            yield ("layout differs", f"layout: {other}", _replace(steps, i, {"layout": other}))
        if i + 1 < len(steps) and name in ("resize", "center_crop", "crop") \
                and names[i + 1] in ("resize", "center_crop", "crop") and names[i + 1] != name:
            swapped = copy.deepcopy(steps)
            swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
            yield ("crop and resize in the other order", f"{names[i + 1]} before {name}", swapped)
    yield from _uint8_rounding(steps)
    if "scale" not in names:
        at = names.index("normalize") if "normalize" in names else len(steps)
        yield ("pixels not scaled to 0..1", "add scale: 1/255", steps[:at] + [{"scale": 1 / 255}] + steps[at:])
    if "layout" not in names:
        at = names.index("batch") if "batch" in names else len(steps)
        yield ("layout differs", "add layout: chw", steps[:at] + [{"layout": "chw"}] + steps[at:])


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


def _resize(steps: Steps, i: int, val: dict[str, Any]) -> Iterator[tuple[str, str, Steps]]:
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


def _uint8_rounding(steps: Steps) -> Iterator[tuple[str, str, Steps]]:
    """Training code that resizes 8-bit images gets 8-bit results (rounded) before it normalizes; code that
    converts to float first does not round. Either side may be the one that rounds."""
    names = _names(steps)
    spatial = [i for i, n in enumerate(names) if n in ("resize", "letterbox")]
    if not spatial or steps[0]["read"].get("depth", 8) != 8:
        return
    floats = [i for i, n in enumerate(names) if n == "dtype" and steps[i]["dtype"] != "uint8" and i < spatial[-1]]
    if floats:
        i = floats[0]
        rest = steps[:i] + steps[i + 1:]
        if any(n in ("scale", "normalize") for n in names[i + 1:]):  # those make floats anyway
            yield ("resized in float where training rounds to uint8", f"remove dtype: {steps[i]['dtype']}", rest)
        else:
            at = spatial[-1]  # the resize's index in `rest`, the dtype step being gone
            yield ("resized in float where training rounds to uint8", f"dtype: {steps[i]['dtype']} after {names[at]}",
                   rest[:at] + [steps[i]] + rest[at:])
    elif "dtype" not in names[:spatial[0]]:
        yield ("uint8 rounding after resize where training resizes in float", "add dtype: float32 before resize",
               steps[:1] + [{"dtype": "float32"}] + steps[1:])


def num(x: float) -> str:
    f = Fraction(x).limit_denominator(1000)
    if abs(float(f) - x) < 1e-9 and f.denominator != 1:
        return f"{f.numerator}/{f.denominator}"
    return f"{x:g}"


def short(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"
