"""Embeddings: the cosine of each sample's embedding to the reference's (embedding_cosine, its mean)."""
from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from trtflow.metrics.contract import BuiltInMetric, Gives, Sample, per_precision


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

    def _vectors(self, x: np.ndarray, sample: Sample | None) -> np.ndarray:
        x = np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        if self.pool == "mean" and x.ndim > 2:
            x = np.moveaxis(x, self.axis, -1)
            x = x.reshape(x.shape[0], -1, x.shape[-1])
            feed = sample.feed if sample is not None else {}
            if self.mask is not None and self.mask in feed:
                m = feed[self.mask].reshape(x.shape[0], -1)[..., None].astype(np.float64)
                return (x * m).sum(1) / np.maximum(m.sum(1), 1.0)
            x = x.mean(1)
        return x.reshape(x.shape[0], -1)

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        bad = ~np.isfinite(got.astype(np.float64)).reshape(got.shape[0], -1).all(1)
        cos = _cosines(self._vectors(ref, sample), self._vectors(got, sample))
        self.values += [0.0 if b else float(c) for b, c in zip(bad, cos)]  # a non-finite embedding is no match

    def result(self) -> dict[str, float]:
        if not self.values:
            return {}
        return {"embedding_cosine": min(self.values), "embedding_cosine_mean": float(np.mean(self.values))}


class EmbeddingMetric(BuiltInMetric):
    """Embeddings: the cosine of each sample's embedding to the reference's (gives embedding_cosine, its worst
    sample, and embedding_cosine_mean)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "embedding_cosine": Gives(True, weighed=False, bounds=per_precision(0.999, 0.995, 0.98),
                                  example="embedding: {pool: mean}"),
        "embedding_cosine_mean": Gives(True, example="embedding: {pool: mean}")}
    axis: int = Field(-1, description="the embedding axis")
    pool: Literal["none", "mean"] = Field(
        "none", description="mean: average the axes between batch and axis first (token embeddings -> one vector "
                            "per sentence); none: each sample's whole output is its embedding")
    mask: str | None = Field(None, description="with pool: mean, the model input holding each token's mask (1 a "
                                               "real token, 0 padding): the mean over real tokens only, as "
                                               "sentence-transformers pools")

    def measure(self, where: str) -> Embedding:
        return Embedding(self.axis, self.pool, self.mask)


METRIC = EmbeddingMetric
