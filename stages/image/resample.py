"""Antialiased resampling as PIL (and so torchvision's Resize on PIL images) does it, bit for bit on 8-bit
images; OpenCV has no antialiased bilinear/bicubic.

Separable: a weight matrix per axis from the filter stretched by the downscale factor, applied horizontally
then vertically. On 8-bit images the weights are PIL's fixed point (`normalize_coeffs_8bpc`: each weight times
2^22, rounded half away from zero, summed in integers from 2^21 and shifted right by 22, clamped to 0..255 after
each pass); other images are resampled in floating point.
"""
from __future__ import annotations

import functools
import math

import numpy as np


def _bilinear(x: float) -> float:
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _bicubic(x: float, a: float = -0.5) -> float:
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _sinc(x: float) -> float:
    if x == 0.0:
        return 1.0
    x *= math.pi
    return math.sin(x) / x


def _lanczos(x: float) -> float:
    return _sinc(x) * _sinc(x / 3.0) if -3.0 <= x < 3.0 else 0.0


def _box(x: float) -> float:
    return 1.0 if -0.5 < x <= 0.5 else 0.0  # PIL's box_filter (the ends matter when upscaling)


FILTERS = {"linear": (_bilinear, 1.0), "cubic": (_bicubic, 2.0), "lanczos": (_lanczos, 3.0), "area": (_box, 0.5)}


@functools.lru_cache(maxsize=64)
def weights(in_size: int, out_size: int, interp: str) -> np.ndarray:
    """(out_size, in_size) matrix, each row summing to 1, as PIL's precompute_coeffs."""
    fn, support = FILTERS[interp]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support *= filterscale
    ss = 1.0 / filterscale
    w = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        center = (i + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        k = np.array([fn((x - center + 0.5) * ss) for x in range(lo, hi)])
        total = k.sum()
        if total != 0:
            k /= total
        w[i, lo:hi] = k
    return w


PRECISION_BITS = 32 - 8 - 2  # PIL's Resample.c for 8 bits per channel


@functools.lru_cache(maxsize=64)
def _fixed(in_size: int, out_size: int, interp: str) -> np.ndarray:
    """PIL's integer weights: round half away from zero of weight x 2^22."""
    w = weights(in_size, out_size, interp) * (1 << PRECISION_BITS)
    return np.where(w < 0, np.ceil(w - 0.5), np.floor(w + 0.5)).astype(np.int64)


def _matrix(in_size: int, out_size: int, interp: str, fixed: bool) -> np.ndarray:
    return _fixed(in_size, out_size, interp) if fixed else weights(in_size, out_size, interp).astype(np.float32)


@functools.lru_cache(maxsize=64)
def _horizontal(in_w: int, out_w: int, channels: int, interp: str, fixed: bool):
    """Acts on an image flattened to (h, w*c): kron(W^T, I_c), so no transpose is needed."""
    import scipy.sparse as sp
    w = _matrix(in_w, out_w, interp, fixed)
    return sp.kron(sp.csr_matrix(w.T), sp.identity(channels, w.dtype), format="csr")


@functools.lru_cache(maxsize=64)
def _vertical(in_h: int, out_h: int, interp: str, fixed: bool):
    import scipy.sparse as sp
    return sp.csr_matrix(_matrix(in_h, out_h, interp, fixed))


def resize(img: np.ndarray, out_h: int, out_w: int, interp: str) -> np.ndarray:
    """HxWxC image -> out_h x out_w x C, PIL-style antialiased: 8-bit images in PIL's fixed point (bit-exact),
    other integer images rounded after each pass, float images in float."""
    if interp not in FILTERS:
        raise ValueError(f"antialiased resampling supports {', '.join(FILTERS)}, not {interp}")
    h, w, c = img.shape
    if img.dtype == np.uint8:
        half = 1 << (PRECISION_BITS - 1)

        def settle(a: np.ndarray) -> np.ndarray:
            return np.clip((a + half) >> PRECISION_BITS, 0, 255)

        x = img.astype(np.int64).reshape(h, w * c)
        if out_w != w:  # horizontal pass first, as PIL; sparse products: each output reads only a few inputs
            x = settle(np.asarray(x @ _horizontal(w, out_w, c, interp, True)))
        if out_h != h:
            x = settle(np.asarray(_vertical(h, out_h, interp, True) @ x))
        return x.reshape(out_h, out_w, c).astype(np.uint8)
    integer = np.issubdtype(img.dtype, np.integer)
    info = np.iinfo(img.dtype) if integer else None

    def rounded(a: np.ndarray) -> np.ndarray:
        return np.clip(np.floor(a + 0.5), info.min, info.max) if integer else a

    x = img.astype(np.float32).reshape(h, w * c)
    if out_w != w:
        x = rounded(np.asarray(x @ _horizontal(w, out_w, c, interp, False)))
    if out_h != h:
        x = rounded(np.asarray(_vertical(h, out_h, interp, False) @ x))
    return x.reshape(out_h, out_w, c).astype(img.dtype)
