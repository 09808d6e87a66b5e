"""Comparing a model variant's outputs with a reference over many samples (the comparators, apart from the
runners), giving the one result every comparison gives: `Accuracy` (per output metrics, the bounds missed, true
when none was; its records are in `records.py`). `Comparison` accumulates per output max/mean absolute error, max
relative error, cosine similarity, NaN/Inf counts in the candidate and in the reference, top-1 and top-5 agreement
for classifier scores (an `OutputAccuracy` per output); validate, the precision and calibrate pre-flights and
parity's model check use it."""
from __future__ import annotations

from typing import Any

import numpy as np

from trtflow.metrics import outputs
from trtflow.metrics.builtin.topk import TopK
from trtflow.metrics.contract import Sample
from trtflow.stages.compare.records import NEGLIGIBLE, Accuracy, OutputAccuracy
from trtflow.stages.ort.runner import feed_digest

REL_FLOOR = 1e-3  # max_rel ignores reference elements below this share of the output's largest |value|


class OutputStats:
    """One output's elementwise metrics, and the task metrics declared for it (`task`: see trtflow/metrics/; with
    none declared, a (batch, classes) output gets top-1/top-5 agreement). `floor`: the least scale the output
    has (1 for a probability), below which an error is negligible however its cosine comes out."""

    def __init__(self, task: list[Any] | None = None, floor: float = 0.0) -> None:
        self.max_abs = 0.0
        self.sum_abs = 0.0
        self.count = 0
        self.dot = self.ref_sq = self.got_sq = 0.0
        self.max_rel = 0.0
        self.ref_max = floor
        self.nan = self.inf = self.ref_nan = self.ref_inf = 0
        self.task = task
        self.declared = bool(task)
        self.first: np.ndarray | None = None  # the first sample's reference, and how far any other one is from it
        self.first_shape: tuple[int, ...] = ()
        self.spread = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        """One batch of this output; `sample`: what it came from (a task metric may read the inputs or the other
        outputs)."""
        r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
        self._vary(ref, r)
        self.nan += int(np.isnan(g).sum())
        self.inf += int(np.isinf(g).sum())
        self.ref_nan += int(np.isnan(r).sum())
        self.ref_inf += int(np.isinf(r).sum())
        ok = np.isfinite(g) & np.isfinite(r)
        d = np.abs(r[ok] - g[ok])
        if d.size:
            self.max_abs = max(self.max_abs, float(d.max()))
            # relative to each reference element, over elements of at least REL_FLOOR of the output's largest
            # magnitude: near-zero elements make any relative error meaningless
            mag = np.abs(r[ok])
            self.ref_max = max(self.ref_max, float(mag.max()))
            big = mag >= REL_FLOOR * float(mag.max())
            if big.any() and mag.max() > 0:
                self.max_rel = max(self.max_rel, float((d[big] / mag[big]).max()))
        self.sum_abs += float(d.sum())
        self.count += int(ok.sum())
        self.dot += float(np.dot(r[ok], g[ok]))
        self.ref_sq += float(np.dot(r[ok], r[ok]))
        self.got_sq += float(np.dot(g[ok], g[ok]))
        if self.task is None:
            self.task = [TopK(5, 1)] if ref.ndim == 2 and ref.shape[1] > 1 else []
        for metric in self.task:
            metric.add(ref, got, sample)

    def _vary(self, ref: np.ndarray, r: np.ndarray) -> None:
        """How far this sample's reference is from the first sample's (inf at another shape or where either is not
        finite)."""
        if self.first is None:
            self.first, self.first_shape = r.copy(), ref.shape  # (as float64, flat: what later samples are)
        elif ref.shape != self.first_shape:
            self.spread = np.inf
        elif self.spread < np.inf:
            d = np.abs(r - self.first)
            self.spread = max(self.spread, float(d.max(initial=0.0)) if np.isfinite(d).all() else np.inf)

    def constant(self) -> bool:
        """The reference's output was the same on every sample: no two differ by more than NEGLIGIBLE of its scale."""
        return self.spread <= NEGLIGIBLE * max(self.ref_max, np.finfo(np.float32).tiny)

    def result(self) -> OutputAccuracy:
        if self.ref_sq and self.got_sq:
            cosine = self.dot / np.sqrt(self.ref_sq * self.got_sq)
        else:  # all zeros on both sides is agreement (as in TensorStats); on one side only, none
            cosine = 1.0 if not self.ref_sq and not self.got_sq and self.count else 0.0
        values: dict[str, Any] = {}  # the task metrics' (a detection metric counts the reference's boxes too)
        for metric in self.task or []:
            values.update(metric.result())
        return OutputAccuracy.model_validate({
            "max_abs": self.max_abs, "mean_abs": self.sum_abs / max(self.count, 1), "max_rel": self.max_rel,
            "cosine": float(cosine), "nan": self.nan, "inf": self.inf, "reference_nan": self.ref_nan,
            "reference_inf": self.ref_inf, "scale": self.ref_max, **values,
            "task": self.declared})


class Comparison:
    """`metrics`: the task metrics declared per output (`OutputMetrics`, by output name or '*'); `floors`: the
    least scale of some outputs (`onnx.graph.output_floors`)."""

    def __init__(self, metrics: dict[str, Any] | None = None, floors: dict[str, float] | None = None,
                 what: str = "validate") -> None:
        self.outputs: dict[str, OutputStats] = {}
        self.samples = 0
        self.metrics, self.floors, self.what = metrics or {}, floors or {}, what
        self._first_feed: str | None = None  # the first sample's inputs, hashed
        self._distinct = False  # some sample's inputs differ from the first's

    def add(self, ref: dict[str, np.ndarray], got: dict[str, np.ndarray],
            feed: dict[str, np.ndarray] | None = None) -> None:
        """One sample's outputs; `feed`, its inputs (a metric may read one, e.g. an attention mask)."""
        self.samples += 1
        if feed and not self._distinct:  # (once two samples differ, nothing more to learn)
            digest = feed_digest(feed)
            self._first_feed = self._first_feed or digest
            self._distinct = self._distinct or digest != self._first_feed
        sample = Sample(feed or {}, ref, got)
        for name, r in ref.items():
            if name not in self.outputs:
                task = outputs.measures(outputs.declared(self.metrics, name), self.what, name) or None
                self.outputs[name] = OutputStats(task, self.floors.get(name, 0.0))
            self.outputs[name].add(r, got[name], sample)

    def result(self, runtime: str) -> Accuracy:
        return Accuracy(runtime, self.samples, {n: s.result() for n, s in self.outputs.items()},
                        blind=self.blind())

    def blind(self) -> str | None:
        """Why this comparison cannot catch errors, if it cannot: its samples are one and the same input, or on
        distinct inputs the reference's outputs are all the same (a model whose output ignores its input, such as
        one with random weights, or inputs it does not respond to, like a text detector's on images without
        text). A candidate then agrees with it whatever its errors on real inputs. None with fewer than two
        samples (nothing to tell)."""
        if self.samples < 2 or not self.outputs:
            return None
        if self._first_feed is not None and not self._distinct:
            return (f"its {self.samples} samples are one and the same input: this comparison cannot catch errors "
                    f"on any other; give distinct samples")
        if not all(s.constant() for s in self.outputs.values()):
            return None
        spread = "; ".join(f"'{n}' differs by at most {s.spread:.3g} on a scale of {s.ref_max:.3g}"
                           for n, s in list(self.outputs.items())[:3])
        return (f"the reference's output does not vary with its input: this comparison cannot catch errors (over "
                f"{self.samples} distinct samples, output {spread}); a model with random or untrained weights, or "
                f"inputs it does not respond to (give samples from the deployment's distribution)")
