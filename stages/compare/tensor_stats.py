"""How far one float tensor of a candidate is from the reference's, accumulated over samples: what the layerwise
search keeps for every intermediate tensor (and `reduce` and validate's sample ranking for outputs).

Its cost bounds the layerwise search, which reads every intermediate tensor of both models, so the common case
takes few passes over memory: three float32 dot products and the reference's min and max. A tensor holding inf or
NaN shows in those sums (as do float32 sums that overflow); only then are its elements checked one by one, and
the sums taken over the elements finite in both (in float64 where float32 overflows).
"""
from __future__ import annotations

import numpy as np

FP16_MAX = 65504.0
SENTINEL_VALUES = 2  # a tensor whose values beyond FP16 take at most this many distinct values holds a mask or sentinel


class TensorStats:
    """Per-tensor error statistics over samples: cosine (exact near 1: 1 - cosine comes from the squared
    difference), RMS error relative to the reference, the largest |reference|, non-finite values in candidate and
    reference, FP16 overflow in the reference, and the share of the reference outside a quantized range."""
    __slots__ = ("ref_max", "diff_sq", "ref_sq", "got_sq", "bad", "ref_bad", "over_fp16", "over_values", "clipped",
                 "elements")

    def __init__(self) -> None:
        self.ref_max = self.diff_sq = self.ref_sq = self.got_sq = 0.0
        self.bad = self.ref_bad = self.over_fp16 = self.clipped = self.elements = 0
        self.over_values: set[float] = set()  # the distinct values beyond FP16's range (a few at most are kept)

    def add(self, r: np.ndarray, g: np.ndarray, qrange: tuple[float, float] | None = None) -> None:
        with np.errstate(over="ignore", invalid="ignore"):  # inf/NaN and overflowing sums are handled below
            self._add(r, g, qrange)

    def _add(self, r: np.ndarray, g: np.ndarray, qrange: tuple[float, float] | None) -> None:
        r, g = np.asarray(r, np.float32).ravel(), np.asarray(g, np.float32).ravel()
        rr, gg = float(np.dot(r, r)), float(np.dot(g, g))
        if not np.isfinite(rr + gg):  # inf/NaN somewhere, or float32 sums overflowing
            rf, gf = np.isfinite(r), np.isfinite(g)
            self.ref_bad += int(r.size - np.count_nonzero(rf))
            self.bad += int(np.count_nonzero(rf & ~gf))  # non-finite where the reference is finite
            ok = rf & gf
            r, g = (r, g) if ok.all() else (r[ok], g[ok])
            rr, gg = float(np.dot(r, r)), float(np.dot(g, g))
            if not np.isfinite(rr + gg):  # finite values whose float32 sums overflow
                r, g = r.astype(np.float64), g.astype(np.float64)
                rr, gg = float(r @ r), float(g @ g)
        if not r.size:
            return
        d = r - g
        dd = float(np.dot(d, d))
        if not np.isfinite(dd):
            d = d.astype(np.float64)
            dd = float(d @ d)
        lo, hi = float(r.min()), float(r.max())
        self.diff_sq += dd
        self.ref_sq += rr
        self.got_sq += gg
        self.ref_max = max(self.ref_max, hi, -lo)
        self.elements += r.size
        if max(hi, -lo) > FP16_MAX:
            over = r[np.abs(r) > FP16_MAX]
            self.over_fp16 += int(over.size)
            if len(self.over_values) <= SENTINEL_VALUES:
                self.over_values.update(float(v) for v in np.unique(over)[:SENTINEL_VALUES + 1])
        if qrange is not None and (lo < qrange[0] or hi > qrange[1]):
            self.clipped += int(np.count_nonzero((r < qrange[0]) | (r > qrange[1])))

    @property
    def sentinel(self) -> bool:
        """Every value beyond FP16's range is one of a couple of finite constants: a mask or a sentinel (an attention
        mask's -3.4e38, a -1e9 fill), not activations that grew past FP16."""
        return bool(self.over_values) and len(self.over_values) <= SENTINEL_VALUES

    @property
    def cosine(self) -> float:
        if self.ref_sq == 0 and self.got_sq == 0:
            return 1.0
        if not (self.ref_sq and self.got_sq):
            return 0.0
        # |r - g|^2 = |r|^2 + |g|^2 - 2 r.g, so 1 - cos = (|r - g|^2 - (|r| - |g|)^2) / (2 |r| |g|)
        nr, ng = np.sqrt(self.ref_sq), np.sqrt(self.got_sq)
        return float(1.0 - max(0.0, self.diff_sq - (nr - ng) ** 2) / (2 * nr * ng))

    @property
    def drift(self) -> float:
        """1 - cosine; 1 where the candidate turned a finite value non-finite."""
        return 1.0 if self.bad else max(0.0, 1.0 - self.cosine)

    @property
    def rms_rel(self) -> float:
        """|r - g| / |r| over every element: the error's RMS relative to the reference's."""
        if self.ref_sq:
            return float(np.sqrt(self.diff_sq / self.ref_sq))
        return float(self.diff_sq > 0)
