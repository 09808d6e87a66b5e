"""Antialiased resampling as PIL (and so torchvision's Resize) does it; OpenCV has no antialiased bilinear/bicubic.

Separable: a weight matrix per axis from the filter stretched by the downscale factor, applied horizontally
then vertically, rounding to the image's integer type between the passes as PIL does.
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
    return 1.0 if -0.5 <= x < 0.5 else 0.0


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
    return w.astype(np.float32)


@functools.lru_cache(maxsize=64)
def _horizontal(in_w: int, out_w: int, channels: int, interp: str):
    """Acts on an image flattened to (h, w*c): kron(W^T, I_c), so no transpose is needed."""
    import scipy.sparse as sp
    return sp.kron(sp.csr_matrix(weights(in_w, out_w, interp).T), sp.identity(channels, np.float32), format="csr")


@functools.lru_cache(maxsize=64)
def _vertical(in_h: int, out_h: int, interp: str):
    import scipy.sparse as sp
    return sp.csr_matrix(weights(in_h, out_h, interp))


def resize(img: np.ndarray, out_h: int, out_w: int, interp: str) -> np.ndarray:
    """HxWxC image -> out_h x out_w x C, PIL-style antialiased; integer images are rounded after each pass."""
    if interp not in FILTERS:
        raise ValueError(f"antialiased resampling supports {', '.join(FILTERS)}, not {interp}")
    h, w, c = img.shape
    integer = np.issubdtype(img.dtype, np.integer)
    info = np.iinfo(img.dtype) if integer else None

    def settle(a: np.ndarray) -> np.ndarray:
        return np.clip(np.floor(a + 0.5), info.min, info.max) if integer else a

    x = img.astype(np.float32).reshape(h, w * c)
    if out_w != w:  # horizontal pass first, as PIL; sparse products: each output reads only a few inputs
        x = settle(np.asarray(x @ _horizontal(w, out_w, c, interp)))
    if out_h != h:
        x = settle(np.asarray(_vertical(h, out_h, interp) @ x))
    return x.reshape(out_h, out_w, c).astype(img.dtype)
