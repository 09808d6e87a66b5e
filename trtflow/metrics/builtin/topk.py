"""Classification: does the candidate's top-k hold the reference's top class (top1, top<k>)."""
from __future__ import annotations

import re
from typing import ClassVar

import numpy as np
from pydantic import Field

from trtflow.errors import StageError
from trtflow.metrics.contract import BuiltInMetric, Gives, Sample, per_precision


def constant_topk(k: int, classes: int, where: str) -> StageError | None:
    """The refusal of a declared top-k that agrees whatever the candidate gives (k at least the classes along its
    axis; `where`: its key path, "validate: metrics.y.topk"), else None."""
    if k < classes:
        return None
    instead = ("a one-class score: declare decision: {threshold: 0.5} (its agreement at a threshold) and "
               "regression: {} (its error) instead" if classes == 1 else f"give k below {classes}")
    return StageError(f"{where}.k: {k}, and the output has {classes} class{'es' if classes > 1 else ''} along its "
                      f"axis: its top-{k} holds every class, so it agrees whatever the candidate gives; {instead}")


class TopK:
    """Share of rows whose reference class (argmax along `axis`) is among the candidate's top `k`, and top-1.
    `where`: the declaration's key path ("validate: metrics.y.topk"): a declared top-k that cannot fail (k at least
    the classes) is refused; the one every (batch, classes) output gets undeclared gives top<k> only below k."""

    def __init__(self, k: int = 5, axis: int = -1, where: str | None = None) -> None:
        self.k, self.axis, self.where = k, axis, where
        self.top1 = self.topk = self.rows = self.classes = 0

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        r = np.moveaxis(ref, self.axis, -1)
        g = np.nan_to_num(np.moveaxis(got, self.axis, -1).astype(np.float64), nan=-np.inf)
        classes = self.classes = r.shape[-1]
        refused = constant_topk(self.k, classes, self.where) if self.where is not None else None
        if refused is not None:
            raise refused
        r, g = r.reshape(-1, classes), g.reshape(-1, classes)
        want = r.argmax(1)
        self.top1 += int((g.argmax(1) == want).sum())
        k = min(self.k, classes)
        top = np.argpartition(-g, k - 1, axis=1)[:, :k]
        self.topk += int((top == want[:, None]).any(1).sum())
        self.rows += r.shape[0]

    def result(self) -> dict[str, float]:
        if not self.rows:
            return {}
        out = {"top1": self.top1 / self.rows}
        if 1 < self.k < self.classes:
            out[f"top{self.k}"] = self.topk / self.rows
        return out


class TopKMetric(BuiltInMetric):
    """Classification: does the candidate's top-k hold the reference's top class (gives top1, top<k>)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "top1": Gives(True, bounds=per_precision(0.99, 0.98, 0.95), example="topk: {k: 5}"),
        "top5": Gives(True, example="topk: {k: 5}")}
    NAMED: ClassVar[re.Pattern] = re.compile(r"top[0-9]+")  # top<k>, for any k
    k: int = Field(5, ge=1, le=1000, description="the reference's class must be among the candidate's top k")
    axis: int = Field(-1, description="the class axis")

    def gives(self) -> dict[str, Gives]:
        return {"top1": self.GIVES["top1"], f"top{self.k}": Gives(True)}

    def measure(self, where: str) -> TopK:
        return TopK(self.k, self.axis, where)


METRIC = TopKMetric
