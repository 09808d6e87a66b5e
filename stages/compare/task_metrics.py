"""Accuracy the way a model's users judge it, per output: classification top-k agreement, the text a CTC
recognizer decodes, the regions a probability map or a segmentation marks, each sample's embedding, a detector's
boxes after decoding and NMS, an image's pixels (PSNR, within N levels, SSIM), a regression's errors in its own
units, a score's decision at a threshold, or the user's own function.

Each metric folds in one batch at a time (`add(reference, candidate, sample)`: arrays of one output, batch first,
and the `Sample` they came from: the inputs, and every output of both sides by name) and gives named values
(`result()`), the names tolerances bound. Every value is a share in [0, 1] or a rate, so a bound reads the same on
any model, but for PSNR (in decibels, as image users expect) and a regression's errors (in the output's units: a
MOS error of 0.33 is what its users bound, not a share of anything).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from trtflow.errors import StageError
from trtflow.stages.compare.sample import Sample


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


class MapIoU:
    """A probability or segmentation map thresholded into regions: IoU of the candidate's regions with the
    reference's, pooled over every sample (`iou`) and for the worst sample (`iou_min`). Two empty maps agree.
    `channel`: only that index along `axis` is the map. `classes`: each element's class is the argmax along
    `axis` (segmentation scores), and each listed class's region is compared: pooled over the classes and samples
    (`iou`), the worst sample (`iou_min`), the worst class (`iou_class_min`)."""

    def __init__(self, threshold: float = 0.5, channel: int | None = None, classes: list[int] | tuple[int, ...] = (),
                 axis: int = 1, what: str = "map_iou") -> None:
        self.threshold, self.channel, self.classes, self.axis, self.what = threshold, channel, list(classes), axis, what
        self.inter = self.union = 0
        self.class_inter = np.zeros(len(self.classes), np.int64)
        self.class_union = np.zeros(len(self.classes), np.int64)
        self.worst = 1.0
        self.samples = 0

    def _regions(self, x: np.ndarray) -> np.ndarray:
        """(batch, regions, elements) booleans: one region, or one per selected class."""
        x = np.nan_to_num(x.astype(np.float64), nan=-np.inf)
        if self.channel is None and not self.classes:
            return (x > self.threshold).reshape(x.shape[0], 1, -1)
        if not -x.ndim <= self.axis < x.ndim or self.axis % x.ndim == 0:
            raise StageError(f"{self.what}.axis: {self.axis} is not a non-batch axis of an output of shape "
                             f"{list(x.shape)}")
        count = x.shape[self.axis]
        wanted = [self.channel] if self.channel is not None else self.classes
        beyond = [c for c in wanted if c >= count]
        if beyond:
            raise StageError(f"{self.what}.{'channel' if self.channel is not None else 'classes'}: "
                             f"{', '.join(map(str, beyond))} beyond the {count} along axis {self.axis} of an output "
                             f"of shape {list(x.shape)}")
        if self.channel is not None:
            return (np.take(x, self.channel, axis=self.axis) > self.threshold).reshape(x.shape[0], 1, -1)
        label = x.argmax(self.axis).reshape(x.shape[0], -1)
        return np.stack([label == c for c in self.classes], 1)

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        r, g = self._regions(ref), self._regions(got)
        inter, union = (r & g).sum(2), (r | g).sum(2)  # (batch, regions)
        self.inter += int(inter.sum())
        self.union += int(union.sum())
        if self.classes:
            self.class_inter += inter.sum(0)
            self.class_union += union.sum(0)
        i, u = inter.sum(1), union.sum(1)
        per = np.where(u > 0, i / np.maximum(u, 1), 1.0)
        self.worst = min(self.worst, float(per.min()))
        self.samples += r.shape[0]

    def result(self) -> dict[str, float]:
        if not self.samples:
            return {}
        out = {"iou": self.inter / self.union if self.union else 1.0, "iou_min": self.worst}
        if self.classes:
            per = np.where(self.class_union > 0, self.class_inter / np.maximum(self.class_union, 1), 1.0)
            out["iou_class_min"] = float(per.min())
        return out


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


class ImagePixels:
    """An image output against the reference's, pixel by pixel after clipping both to `low..high`: PSNR over every
    pixel of every sample (capped at 100 dB: identical images), the share of values within `within` levels
    (a level: (high - low) / levels), and scikit-image's SSIM per sample (a 7x7 window, the channels averaged),
    their mean. A non-finite candidate value counts as the farthest from the reference."""

    def __init__(self, low: float, high: float, layout: str = "nchw", levels: int = 255, within: float = 1.0) -> None:
        self.low, self.high, self.layout = low, high, layout
        self.step = (high - low) / levels
        self.within = within
        self.squared = self.values = self.close = 0.0
        self.ssims: list[float] = []

    def _hwc(self, x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        if x.ndim == 4 and self.layout == "nchw":
            x = np.moveaxis(x, 1, -1)
        elif x.ndim == 3:
            x = x[..., None]  # one channel, no channel axis
        return x

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        from skimage.metrics import structural_similarity

        r = np.clip(self._hwc(ref), self.low, self.high)
        g = self._hwc(got)
        g = np.clip(np.where(np.isfinite(g), g, np.where(r - self.low > self.high - r, self.low, self.high)),
                    self.low, self.high)
        diff = np.abs(r - g)
        self.squared += float((diff ** 2).sum())
        self.values += diff.size
        self.close += float((diff <= self.within * self.step * (1 + 1e-9)).sum())
        span = self.high - self.low
        for a, b in zip(r, g):
            side = min(a.shape[0], a.shape[1])
            window = min(7, side if side % 2 else side - 1)
            if window >= 3:
                self.ssims.append(float(structural_similarity(a, b, data_range=span, channel_axis=-1,
                                                              win_size=window)))

    def result(self) -> dict[str, float]:
        if not self.values:
            return {}
        mse = self.squared / self.values
        span = self.high - self.low
        out = {"psnr": 100.0 if mse == 0 else min(100.0, 10 * float(np.log10(span * span / mse))),
               "pixels_within": self.close / self.values}
        if self.ssims:
            out["ssim"] = float(np.mean(self.ssims))
        return out


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


class UserMetric:
    """The user's `package.module:function(reference, candidate) -> {name: value}`, called per batch; each name's
    mean over batches."""

    def __init__(self, func: Callable[[np.ndarray, np.ndarray], dict[str, Any]], ref: str) -> None:
        self.func, self.ref = func, ref
        self.sums: dict[str, float] = {}
        self.calls = 0

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
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


def _detections(spec: Any, where: str) -> Any:
    from trtflow.stages.compare.detections import BoxDecoder, Detections

    return Detections(BoxDecoder.declared(spec, f"{where}.detections"), spec.match_iou)


# Each built-in metric's computation, by its key in `OutputMetrics`: (its declaration, the declaration's key path)
# -> the metric object. What each gives, and how, is declared with its parameters (pipelines/schema.py).
MAKERS: dict[str, Callable[[Any, str], Any]] = {
    "topk": lambda spec, where: TopK(spec.k, spec.axis, f"{where}.topk"),
    "ctc": lambda spec, where: CTC(spec.blank, spec.axis, spec.batch_axis),
    "map_iou": lambda spec, where: MapIoU(spec.threshold, spec.channel, spec.classes, spec.axis, f"{where}.map_iou"),
    "embedding": lambda spec, where: Embedding(spec.axis, spec.pool, spec.mask),
    "detections": _detections,
    "image": lambda spec, where: ImagePixels(spec.range[0], spec.range[1], spec.layout, spec.levels, spec.within),
    "regression": lambda spec, where: Regression(spec.relative_above),
    "decision": lambda spec, where: Decision(spec.threshold),
}


def make(specs: list[Any], what: str, output: str = "*") -> list[Any]:
    """The metric objects the `OutputMetrics` entries `specs` declare for `output`."""
    from trtflow.usercode import import_callable

    made: list[Any] = []
    for m in specs:
        where = f"{what}: metrics.{output}"
        made += [MAKERS[key](spec, where) for key, spec in m.built_in().items()]
        if m.callable:
            ref = m.callable.function
            made.append(UserMetric(import_callable(ref, f"{what}: metrics callable", 2), ref))
    return made
