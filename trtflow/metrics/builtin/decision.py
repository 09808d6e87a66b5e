"""A score decided at a threshold: does the candidate decide as the reference does (decision_agree)."""
from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import Field

from trtflow.metrics.contract import BuiltInMetric, Gives, Sample, per_precision


class Decision:
    """Scores decided at `threshold` (a one-class Sigmoid, a binary logit, multi-label scores): the share of
    elements the candidate decides as the reference does, above the threshold or not (`decision_agree`). A
    non-finite candidate score decides nothing: a disagreement."""

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold
        self.agree = self.count = 0

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
        ok = np.isfinite(r)
        same = ((r > self.threshold) == (g > self.threshold)) & np.isfinite(g)
        self.agree += int((same & ok).sum())
        self.count += int(ok.sum())

    def result(self) -> dict[str, float]:
        return {"decision_agree": self.agree / self.count} if self.count else {}


class DecisionMetric(BuiltInMetric):
    """A score decided at a threshold (a one-class Sigmoid, a binary logit, multi-label scores): the share of
    elements the candidate decides as the reference does, above the threshold or not (gives decision_agree)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "decision_agree": Gives(True, bounds=per_precision(0.99, 0.98, 0.95), example="decision: {threshold: 0.5}")}
    threshold: float = Field(0.5, description="a score above this is a positive decision (a logit's: 0)")

    def measure(self, where: str) -> Decision:
        return Decision(self.threshold)


METRIC = DecisionMetric
