"""Values with no class semantics, judged by their errors in the output's own units."""
from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import Field

from trtflow.metrics.contract import BuiltInMetric, Gives, Sample, per_precision


class Regression:
    """Values with no class semantics against the reference's, in the output's own units (batch first): the worst
    element's absolute error (`abs_err_max`, the worst sample's too), the mean over elements (`abs_err_mean`), each
    sample's worst element averaged over samples (`sample_err_mean`), and the worst error over the reference's
    spread (`spread_err_max`: its largest value less its smallest over every sample; its largest magnitude where
    it takes one value). `relative_above`: also |error| / |reference| over the elements whose |reference| is above
    it (`rel_err_max`, `rel_err_mean`). A non-finite candidate value where the reference's is finite is an
    infinite error; elements where the reference is not finite are left out (validate reports those apart)."""

    def __init__(self, relative_above: float | None = None) -> None:
        self.relative_above = relative_above
        self.worst = self.total = self.sample_total = self.rel_worst = self.rel_total = 0.0
        self.count = self.samples = self.rel_count = 0
        self.low, self.high = np.inf, -np.inf

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        rows = ref.shape[0] if ref.ndim else 1
        r, g = ref.astype(np.float64).reshape(rows, -1), got.astype(np.float64).reshape(rows, -1)
        ok = np.isfinite(r)
        with np.errstate(invalid="ignore"):
            err = np.abs(r - g)
        err = np.where(ok, np.where(np.isfinite(err), err, np.inf), 0.0)
        if not ok.any():
            return
        self.worst = max(self.worst, float(err.max()))
        self.total += float(err.sum())
        self.count += int(ok.sum())
        self.sample_total += float(err.max(1).sum())
        self.samples += rows
        self.low, self.high = min(self.low, float(r[ok].min())), max(self.high, float(r[ok].max()))
        if self.relative_above is not None:
            big = ok & (np.abs(r) > self.relative_above)
            rel = err[big] / np.abs(r[big])
            self.rel_worst = max(self.rel_worst, float(rel.max(initial=0.0)))
            self.rel_total += float(rel.sum())
            self.rel_count += int(big.sum())

    def result(self) -> dict[str, float]:
        if not self.count:
            return {}
        spread = (self.high - self.low) or max(abs(self.low), abs(self.high))
        out = {"abs_err_max": self.worst, "abs_err_mean": self.total / self.count,
               "sample_err_mean": self.sample_total / self.samples,
               "spread_err_max": self.worst / spread if spread else (0.0 if self.worst == 0 else np.inf)}
        if self.rel_count:
            out.update(rel_err_max=self.rel_worst, rel_err_mean=self.rel_total / self.rel_count)
        return out


class RegressionMetric(BuiltInMetric):
    """Values with no class semantics (quality scores, a box, a pose, a price): the candidate's errors against the
    reference's in the output's own units. Gives abs_err_max (the worst element's absolute error: the worst
    sample's too), abs_err_mean (over every element), sample_err_mean (each sample's worst element, the mean over
    samples) and spread_err_max (abs_err_max over the reference's spread: its largest value less its smallest over
    every sample), all better lower; with relative_above, rel_err_max and rel_err_mean. Errors in the output's
    units: bounded by validate, never weighed as a share (a regression's 0.33 is no 33% of anything)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        **{n: Gives(False, weighed=False, example="regression: {within: 0.1}")
           for n in ("abs_err_max", "abs_err_mean", "sample_err_mean")},
        "spread_err_max": Gives(False, weighed=False, bounds=per_precision(0.001, 0.01, 0.05),
                                example="regression: {within: 0.1}"),
        **{n: Gives(False, weighed=False, example="regression: {relative_above: 1.0}")
           for n in ("rel_err_max", "rel_err_mean")}}
    within: float | None = Field(None, gt=0, description=(
        "the largest absolute error your users accept, in the output's units: a candidate passes where its "
        "abs_err_max is at most this (replacing the default bound on spread_err_max)"), examples=[0.1])
    relative_above: float | None = Field(None, ge=0, description=(
        "also the relative error |error| / |reference| (rel_err_max, rel_err_mean), over the elements whose "
        "|reference| is above this, in the output's units (0: every nonzero element)"), examples=[1.0])

    def gives(self) -> dict[str, Gives]:
        return {n: g for n, g in self.GIVES.items() if not n.startswith("rel_") or self.relative_above is not None}

    def default_bounds(self, precision: str) -> dict[str, tuple[float, bool]]:
        if self.within is None:
            return super().default_bounds(precision)
        return {"abs_err_max": (self.within, False)}  # your users' bound replaces the one on the spread's share

    def measure(self, where: str) -> Regression:
        return Regression(self.relative_above)


METRIC = RegressionMetric
