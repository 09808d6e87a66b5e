"""Accuracy the way a model's users judge it, per output: classification top-k agreement, the text a CTC
recognizer decodes, the regions a probability map marks, each sample's embedding, or the user's own function.

Each metric folds in one batch at a time (`add(reference, candidate, feed)`: arrays of one output, batch first, and
the inputs that produced them) and
gives named values (`result()`), the names tolerances bound. Every value is a share in [0, 1] or a rate, so a
bound reads the same on any model.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from trtflow.errors import StageError


class TopK:
    """Share of rows whose reference class (argmax along `axis`) is among the candidate's top `k`, and top-1."""

    def __init__(self, k: int = 5, axis: int = -1) -> None:
        self.k, self.axis = k, axis
        self.top1 = self.topk = self.rows = 0

    def add(self, ref: np.ndarray, got: np.ndarray, feed: dict[str, np.ndarray] | None = None) -> None:
        r = np.moveaxis(ref, self.axis, -1)
        g = np.nan_to_num(np.moveaxis(got, self.axis, -1).astype(np.float64), nan=-np.inf)
        classes = r.shape[-1]
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
        if self.k != 1:
            out[f"top{self.k}"] = self.topk / self.rows
        return out


def ctc_greedy(scores: np.ndarray, blank: int = 0, axis: int = -1) -> list[list[int]]:
    """Greedy CTC decoding of (batch, time, classes) scores, classes along `axis`: the best class per step,
    repeats collapsed, blanks dropped. One label sequence per batch row."""
    s = np.moveaxis(np.nan_to_num(scores.astype(np.float64), nan=-np.inf), axis, -1)
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

    def __init__(self, blank: int = 0, axis: int = -1) -> None:
        self.blank, self.axis = blank, axis
        self.exact = self.samples = self.edits = self.chars = 0

    def add(self, ref: np.ndarray, got: np.ndarray, feed: dict[str, np.ndarray] | None = None) -> None:
        for want, have in zip(ctc_greedy(ref, self.blank, self.axis), ctc_greedy(got, self.blank, self.axis)):
            self.samples += 1
            self.exact += want == have
            self.edits += edit_distance(want, have)
            self.chars += len(want)

    def result(self) -> dict[str, float]:
        if not self.samples:
            return {}
        return {"text_exact": self.exact / self.samples, "cer": self.edits / max(self.chars, 1)}


class MapIoU:
    """A probability or segmentation map thresholded into regions: IoU of the candidate's regions with the
    reference's, pooled over every sample (`iou`) and for the worst sample (`iou_min`). Two empty maps agree."""

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold
        self.inter = self.union = 0
        self.worst = 1.0
        self.samples = 0

    def add(self, ref: np.ndarray, got: np.ndarray, feed: dict[str, np.ndarray] | None = None) -> None:
        r = ref.reshape(ref.shape[0], -1) > self.threshold
        g = np.nan_to_num(got.astype(np.float64), nan=-np.inf).reshape(got.shape[0], -1) > self.threshold
        inter, union = (r & g).sum(1), (r | g).sum(1)
        self.inter += int(inter.sum())
        self.union += int(union.sum())
        per = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
        self.worst = min(self.worst, float(per.min()))
        self.samples += r.shape[0]

    def result(self) -> dict[str, float]:
        if not self.samples:
            return {}
        return {"iou": self.inter / self.union if self.union else 1.0, "iou_min": self.worst}


def _cosines(r: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Cosine per row; rows zero on both sides agree (1), on one side only do not (0)."""
    dot = (r * g).sum(1)
    nr, ng = np.sqrt((r * r).sum(1)), np.sqrt((g * g).sum(1))
    both_zero = (nr == 0) & (ng == 0)
    cos = np.where((nr > 0) & (ng > 0), dot / np.maximum(nr * ng, np.finfo(np.float64).tiny), 0.0)
    return np.where(both_zero, 1.0, cos)


class Embedding:
    """Each sample's embedding against the reference's: the worst sample's cosine (`embedding_cosine`) and the
    mean (`embedding_cosine_mean`). `pool: mean` averages the axes between the batch and `axis` first (token
    embeddings -> one vector per sentence); otherwise each sample's whole output is its embedding."""

    def __init__(self, axis: int = -1, pool: str = "none", mask: str | None = None) -> None:
        self.axis, self.pool, self.mask = axis, pool, mask
        self.values: list[float] = []

    def _vectors(self, x: np.ndarray, feed: dict[str, np.ndarray] | None) -> np.ndarray:
        x = np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        if self.pool == "mean" and x.ndim > 2:
            x = np.moveaxis(x, self.axis, -1)
            x = x.reshape(x.shape[0], -1, x.shape[-1])
            if self.mask is not None and feed is not None and self.mask in feed:
                m = feed[self.mask].reshape(x.shape[0], -1)[..., None].astype(np.float64)
                return (x * m).sum(1) / np.maximum(m.sum(1), 1.0)
            x = x.mean(1)
        return x.reshape(x.shape[0], -1)

    def add(self, ref: np.ndarray, got: np.ndarray, feed: dict[str, np.ndarray] | None = None) -> None:
        bad = ~np.isfinite(got.astype(np.float64)).reshape(got.shape[0], -1).all(1)
        cos = _cosines(self._vectors(ref, feed), self._vectors(got, feed))
        self.values += [0.0 if b else float(c) for b, c in zip(bad, cos)]  # a non-finite embedding is no match

    def result(self) -> dict[str, float]:
        if not self.values:
            return {}
        return {"embedding_cosine": min(self.values), "embedding_cosine_mean": float(np.mean(self.values))}


class UserMetric:
    """The user's `package.module:function(reference, candidate) -> {name: value}`, called per batch; each name's
    mean over batches."""

    def __init__(self, func: Callable[[np.ndarray, np.ndarray], dict[str, Any]], ref: str) -> None:
        self.func, self.ref = func, ref
        self.sums: dict[str, float] = {}
        self.calls = 0

    def add(self, ref: np.ndarray, got: np.ndarray, feed: dict[str, np.ndarray] | None = None) -> None:
        try:
            values = self.func(ref, got)
        except Exception as exc:  # the user's code: one line naming it, not a traceback from inside trtflow
            raise StageError(f"metric '{self.ref}' raised {type(exc).__name__}: {exc}") from None
        if not isinstance(values, dict):
            raise TypeError(f"metric '{self.ref}' returned {type(values).__name__}, not {{name: value}}")
        self.calls += 1
        for name, value in values.items():
            self.sums[str(name)] = self.sums.get(str(name), 0.0) + float(value)

    def result(self) -> dict[str, float]:
        return {name: total / self.calls for name, total in self.sums.items()} if self.calls else {}


def declared(metrics: dict[str, Any] | None, output: str) -> list[Any]:
    """The `OutputMetrics` entries that apply to `output`: its own and `'*'`."""
    return [m for key, m in (metrics or {}).items() if key in ("*", output)]


def make(specs: list[Any], what: str) -> list[Any]:
    """The metric objects the `OutputMetrics` entries `specs` declare."""
    from trtflow.usercode import import_callable

    made: list[Any] = []
    for m in specs:
        if m.topk:
            made.append(TopK(m.topk.k, m.topk.axis))
        if m.ctc:
            made.append(CTC(m.ctc.blank, m.ctc.axis))
        if m.map_iou:
            made.append(MapIoU(m.map_iou.threshold))
        if m.embedding:
            made.append(Embedding(m.embedding.axis, m.embedding.pool, m.embedding.mask))
        if m.callable:
            made.append(UserMetric(import_callable(m.callable, f"{what}: metrics callable", 2), m.callable))
    return made
