"""The usual causes of a deploy/training preprocessing mismatch, each as one change to the declared steps.

`candidates(steps)` yields (cause, fix, changed steps) for every change that applies to these steps: each step's
own (`steps.py`: R and B swapped, gray vs colour read, another interpolation, antialiasing, the rounding of a size
computed from the aspect ratio, letterbox vs plain resize, the pad value, a crop offset by one pixel, x255 or /255,
mean/std on the other scale, layout), then those across steps: crop/resize order, uint8 rounding before
normalization, a missing scale or layout. The fix reads as the YAML to change.
"""
from __future__ import annotations

import copy
from typing import Iterator

from trtflow.stages.image.steps import STEPS, Cause, Steps


def _names(steps: Steps) -> list[str]:
    return [next(iter(s)) for s in steps]


def candidates(steps: Steps) -> Iterator[Cause]:
    """(cause, fix, changed steps) for every single change worth trying."""
    names = _names(steps)
    for i, step in enumerate(steps):
        (name, val), = step.items()
        yield from STEPS[name].causes(steps, i, val)
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
