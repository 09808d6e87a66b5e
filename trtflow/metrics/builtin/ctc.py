"""Text recognition: both sides greedily CTC-decoded and compared (text_exact, cer)."""
from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import Field

from trtflow.metrics.contract import BuiltInMetric, Gives, Sample, per_precision


def ctc_greedy(scores: np.ndarray, blank: int = 0, axis: int = -1, batch_axis: int = 0) -> list[list[int]]:
    """Greedy CTC decoding of (batch, time, classes) scores, classes along `axis`, the batch along `batch_axis`: the
    best class per step, repeats collapsed, blanks dropped. One label sequence per batch row."""
    s = np.nan_to_num(scores.astype(np.float64), nan=-np.inf)
    s = np.moveaxis(s, [batch_axis % s.ndim, axis % s.ndim], [0, -1])
    best = s.reshape(s.shape[0], -1, s.shape[-1]).argmax(-1)
    out = []
    for row in best:
        keep = np.ones(len(row), bool)
        keep[1:] = row[1:] != row[:-1]
        out.append([int(c) for c in row[keep] if c != blank])
    return out


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance between two label sequences."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


class CTC:
    """A CTC text recognizer's decoded text: the share of samples decoded exactly as the reference decodes them
    (`text_exact`) and the character error rate against the reference's text (`cer`: edits / characters)."""

    def __init__(self, blank: int = 0, axis: int = -1, batch_axis: int = 0) -> None:
        self.blank, self.axis, self.batch_axis = blank, axis, batch_axis
        self.exact = self.samples = self.edits = self.chars = 0

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        for want, have in zip(ctc_greedy(ref, self.blank, self.axis, self.batch_axis),
                              ctc_greedy(got, self.blank, self.axis, self.batch_axis)):
            self.samples += 1
            self.exact += want == have
            self.edits += edit_distance(want, have)
            self.chars += len(want)

    def result(self) -> dict[str, float]:
        if not self.samples:
            return {}
        return {"text_exact": self.exact / self.samples, "cer": self.edits / max(self.chars, 1)}


class CTCMetric(BuiltInMetric):
    """Text recognition: both sides greedily CTC-decoded and compared (gives text_exact, cer)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "text_exact": Gives(True, bounds=per_precision(0.98, 0.95, 0.9), example="ctc: {blank: 0}"),
        "cer": Gives(False, bounds=per_precision(0.005, 0.01, 0.02), example="ctc: {blank: 0}")}
    blank: int = Field(0, ge=0, description="the CTC blank's class index")
    axis: int = Field(-1, description="the class axis; the other non-batch axis is time")
    batch_axis: int = Field(0, description="the batch axis: 1 for time-major scores [T, N, C] (an LSTM or GRU "
                                           "exported without batch_first)")

    def measure(self, where: str) -> CTC:
        return CTC(self.blank, self.axis, self.batch_axis)


METRIC = CTCMetric
