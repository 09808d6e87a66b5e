"""The usual causes of a deploy/training preprocessing mismatch, each as one change to the declared steps.

`candidates(steps)` yields (cause, fix, changed steps) for every change that applies to these steps: each step's
own (`steps.py`: R and B swapped, gray vs colour read, another interpolation, antialiasing, the rounding of a size
computed from the aspect ratio, letterbox vs plain resize, the pad value, a crop offset by one pixel, x255 or /255,
mean/std on the other scale, layout), then those across steps: crop/resize order, uint8 rounding before
normalization, a missing scale or layout. The fix reads as the YAML to change.
"""
from __future__ import annotations

from collections.abc import Iterator

from trtflow.stages.image.steps import (
    Batch,
    Cause,
    CenterCrop,
    Crop,
    Dtype,
    Layout,
    Letterbox,
    Normalize,
    Read,
    Resize,
    Scale,
    Steps,
)

CROPS_AND_RESIZES = (Resize, CenterCrop, Crop)


def candidates(steps: Steps) -> Iterator[Cause]:
    """(cause, fix, changed steps) for every single change worth trying."""
    for i, step in enumerate(steps):
        yield from step.causes(steps, i)
        after = steps[i + 1] if i + 1 < len(steps) else None
        if isinstance(step, CROPS_AND_RESIZES) and isinstance(after, CROPS_AND_RESIZES) \
                and type(after) is not type(step):
            swapped = list(steps)
            swapped[i], swapped[i + 1] = after, step
            yield ("crop and resize in the other order", f"{after.name} before {step.name}", swapped)
    yield from _uint8_rounding(steps)
    if not any(isinstance(s, Scale) for s in steps):
        at = _first(steps, Normalize)
        yield ("pixels not scaled to 0..1", "add scale: 1/255", steps[:at] + [Scale(1 / 255)] + steps[at:])
    if not any(isinstance(s, Layout) for s in steps):
        at = _first(steps, Batch)
        yield ("layout differs", "add layout: chw", steps[:at] + [Layout("chw")] + steps[at:])


def _first(steps: Steps, kind: type) -> int:
    """Where the first step of this kind is (the end, with none)."""
    return next((i for i, s in enumerate(steps) if isinstance(s, kind)), len(steps))


def _uint8_rounding(steps: Steps) -> Iterator[Cause]:
    """Training code that resizes 8-bit images gets 8-bit results (rounded) before it normalizes; code that
    converts to float first does not round. Either side may be the one that rounds."""
    spatial = [i for i, s in enumerate(steps) if isinstance(s, (Resize, Letterbox))]
    if not spatial or not (isinstance(steps[0], Read) and steps[0].depth == 8):
        return
    floats = [i for i, s in enumerate(steps) if isinstance(s, Dtype) and s.dtype != "uint8" and i < spatial[-1]]
    if floats:
        i = floats[0]
        dtype = steps[i]
        rest = steps[:i] + steps[i + 1:]
        if any(isinstance(s, (Scale, Normalize)) for s in steps[i + 1:]):  # those make floats anyway
            yield ("resized in float where training rounds to uint8", f"remove dtype: {dtype.dtype}", rest)
        else:
            at = spatial[-1]  # after the resize in `rest`, the dtype step being gone
            yield ("resized in float where training rounds to uint8", f"dtype: {dtype.dtype} after {steps[at].name}",
                   rest[:at] + [dtype] + rest[at:])
    elif not any(isinstance(s, Dtype) for s in steps[:spatial[0]]):
        yield ("uint8 rounding after resize where training resizes in float", "add dtype: float32 before resize",
               steps[:1] + [Dtype("float32")] + steps[1:])
