"""INT8 calibration: activation statistics streamed through ONNX Runtime's calibrators, thresholds chosen as
TensorRT chooses them, written as ONNX Runtime's calibration cache (which `quantize_static` then uses as is).

ONNX Runtime's `EntropyCalibrater` defaults to 128 histogram bins and 128 quantized bins, so its KL search has
one candidate, the full range: "entropy" through `quantize_static` is MinMax. TensorRT's entropy calibration
(IInt8EntropyCalibrator2) takes a 2048-bin histogram of |x| and picks, among thresholds from bin 128 up, the one
whose 128-level quantization diverges least (KL) from the clipped distribution. Here the |x| histogram is ONNX
Runtime's own (its percentile calibrator collects exactly that, growing the range bin by bin as larger values
arrive), and the threshold search follows NVIDIA's reference implementation (pytorch-quantization's
`_compute_amax_entropy`), vectorized. Percentile is taken on the same |x| histogram, as TensorRT's tools do
(ONNX Runtime's own clips the threshold to the largest *signed* value, which loses a tensor whose large values are
negative). MinMax is ONNX Runtime's.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from trtflow import phases, progress
from trtflow.stages.ort import memory
from trtflow.stages.ort.runner import CALIBRATION, session

HISTOGRAM_BINS = 2048  # TensorRT's
# below this many values a 2048-bin histogram is too sparse for the KL search to mean anything (a squeeze-excite
# vector or a classifier's logits over a few samples): such tensors keep their full range, as MinMax
MIN_VALUES_FOR_KL = 16 * HISTOGRAM_BINS
START_BIN = 128  # the smallest threshold TensorRT considers, in bins
QUANTIZED_LEVELS = 128  # int8, signed: 0..127 on |x|
KL_TIE = 1e-12  # divergences closer than this are equal (float rounding of the prefix-sum form)
COLLECTOR_COPIES = 3  # ONNX Runtime's histogram collector copies a tensor's held samples: asarray, flatten, absolute

Feeds = dict[str, np.ndarray]


def entropy_threshold(hist: np.ndarray, edges: np.ndarray, start_bin: int = START_BIN,
                      levels: int = QUANTIZED_LEVELS) -> float:
    """The |x| threshold with the least KL divergence between the clipped histogram and its `levels`-level
    quantization, searched over bin edges from `start_bin` up (the largest such edge on ties)."""
    bins = np.asarray(hist, dtype=np.float64).copy()
    if len(bins) <= start_bin:
        return float(edges[-1])
    bins[0] = bins[1]  # as NVIDIA's reference: the zero bin (ReLU outputs) would dominate the distribution
    total = bins.sum()
    if total == 0:
        return float(edges[-1])
    kl = _divergences(bins, np.arange(start_bin, len(bins) + 1), levels)
    # the last minimum, as the reference takes it; rounding apart (the reference's exact ties, such as KL 0 for
    # two thresholds past the last nonzero bin, differ here by ~1e-16)
    best = int(np.nonzero(kl <= kl.min() + KL_TIE)[0][-1])
    return float(edges[start_bin + best])


def _divergences(bins: np.ndarray, ends: np.ndarray, levels: int) -> np.ndarray:
    """KL(p || q) for every threshold bin `i` in `ends` at once, from prefix sums (the reference loops over `i`).
    p: bins[:i] with every outlier (bins[i:]) added to its last bin; q: bins[:i] merged into `levels` groups (bin
    j in group j * levels // i), each nonzero bin given its group's mean over nonzero bins, zero bins kept zero.
    With P = sum(p) (every value) and Q = sum(q) = sum(bins[:i]):
    KL = (sum p log p - sum p log q) / P - log P + log Q, where sum p log q is sum over groups of count * log(mean)
    plus the outliers times the log of the last bin's q."""
    def xlogx(x: np.ndarray) -> np.ndarray:
        return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)

    total = bins.sum()
    suffix = total - np.concatenate([[0.0], np.cumsum(bins)])  # suffix[i] = sum(bins[i:])
    count = np.concatenate([[0.0], np.cumsum(bins)])
    nonzero = np.concatenate([[0], np.cumsum(bins != 0)])
    plogp = np.concatenate([[0.0], np.cumsum(xlogx(bins))])
    i = ends[:, None]
    group = np.arange(levels + 1)[None, :]
    bounds = (group * i + levels - 1) // levels  # first bin of each group (ceil(g * i / levels)); the last is i
    counts = count[bounds[:, 1:]] - count[bounds[:, :-1]]
    members = nonzero[bounds[:, 1:]] - nonzero[bounds[:, :-1]]
    mean = np.divide(counts, members, out=np.zeros_like(counts), where=members > 0)
    log_mean = np.log(np.where(mean > 0, mean, 1.0))
    ends_1 = ends - 1
    last = bins[ends_1]  # the last kept bin, which takes the outliers
    outliers = suffix[ends]
    last_q = mean[np.arange(len(ends)), (ends_1 * levels) // ends]
    p_log_q = (counts * log_mean).sum(axis=1) + np.where(last > 0, outliers * np.log(np.where(last > 0, last_q, 1.0)),
                                                           0.0)
    p_log_p = plogp[ends_1] + xlogx(last + outliers)
    kept = count[ends]
    with np.errstate(divide="ignore"):
        kl = (p_log_p - p_log_q) / total - np.log(total) + np.log(kept)
    # q is zero where p is not (every kept bin zero, or outliers landing on an empty last bin): no candidate
    return np.where((kept == 0) | ((last == 0) & (outliers > 0)), np.inf, kl)


def percentile_threshold(hist: np.ndarray, edges: np.ndarray, percentile: float) -> float:
    """The |x| below which `percentile` % of the values fall, at the bin edge (pytorch-quantization's rule)."""
    total = float(np.sum(hist))
    if total == 0:
        return float(edges[-1])
    cdf = np.cumsum(np.asarray(hist, dtype=np.float64) / total)
    return float(edges[min(int(np.searchsorted(cdf, percentile / 100.0)), len(edges) - 1)])


@dataclass(frozen=True)
class Rule:
    """How each tensor's threshold is chosen: `entropy` (TensorRT's KL rule, never below the `floor` percentile
    of |x| when one is given), `percentile` (that percentile of |x|) or `minmax` (the largest |x|)."""
    method: str = "entropy"
    percentile: float = 99.99
    floor: float | None = None


class StreamedCalibration:
    """Feed samples in chunks; ONNX Runtime folds each chunk into its statistics before the next is run, so
    memory does not grow with the calibration set (its calibrators otherwise keep every intermediate output)."""

    def __init__(self, model: Path, op_types: list[str], rule: Rule, work: Path):
        from onnxruntime.quantization import CalibrationMethod, create_calibrator

        method = rule.method
        self.method, self.percentile, self.floor = method, rule.percentile, rule.floor
        # the histogram methods need the |x| histogram, which ONNX Runtime's percentile calibrator collects
        collector, options = (CalibrationMethod.MinMax, {"symmetric": True}) if method == "minmax" else \
            (CalibrationMethod.Percentile, {"symmetric": True, "num_bins": HISTOGRAM_BINS})
        self.calibrator = create_calibrator(model, op_types, augmented_model_path=str(work / "augmented.onnx"),
                                            calibrate_method=collector, extra_options=options)
        if method != "minmax":  # ONNX Runtime's own collector, as it makes it; its statistics' time is a phase
            self.calibrator.collector = _timed_collector(self.calibrator)
        # the augmented model run as every stage runs a model (runner.session: its graph known to the budget)
        self.calibrator.infer_session = session(work / "augmented.onnx", role=CALIBRATION)
        self.samples = 0
        self.full_range: list[str] = []  # tensors whose histogram was too sparse for the KL search

    def add(self, chunk: list[Feeds]) -> None:
        """Fold a chunk (of one shape) into the statistics (`samples` counts the samples the caller fed)."""
        self.calibrator.collect_data(_Reader(chunk))

    def ranges(self, rule: Rule | None = None) -> Any:
        """ONNX Runtime's `TensorsData`: per tensor, the symmetric range [-t, t] and, for histogram methods,
        the histogram it came from. `rule`: another histogram rule than the one collected for, from the same
        statistics (no second pass over the data)."""
        from onnxruntime.quantization.calibrate import TensorData, TensorsData

        if self.method == "minmax":
            return self.calibrator.compute_data()
        method = rule.method if rule else self.method
        percentile = rule.percentile if rule else self.percentile
        floor = rule.floor if rule else self.floor
        if method == "minmax":
            return self.full_ranges()
        data = {}
        self.full_range = []
        for name, (hist, edges, lo, hi) in self.calibrator.collector.histogram_dict.items():
            # the histogram's last edge can lie up to two bins past the largest |x| (ONNX Runtime widens it by
            # whole bins as new chunks arrive): no threshold goes past the largest |x| itself
            seen = _largest(lo, hi)
            if method == "entropy" and hist.sum() < MIN_VALUES_FOR_KL:
                self.full_range.append(name)
                amax = seen
            elif method == "entropy":
                amax = entropy_threshold(hist, edges)
                if floor is not None:
                    amax = max(amax, percentile_threshold(hist, edges, floor))
            else:
                amax = percentile_threshold(hist, edges, percentile)
            t = np.array(min(amax, seen), dtype=np.float32)
            data[name] = TensorData(lowest=-t, highest=t, hist=hist, hist_edges=edges.astype(np.float32))
        return TensorsData(self._histogram_method(), data)

    def _histogram_method(self) -> Any:
        from onnxruntime.quantization import CalibrationMethod

        return CalibrationMethod.Entropy if self.method == "entropy" else CalibrationMethod.Percentile


    def full_ranges(self) -> Any:
        """Every tensor at the largest |x| seen: MinMax's symmetric ranges, from the statistics already
        collected (no second pass over the data)."""
        from onnxruntime.quantization.calibrate import TensorData, TensorsData

        if self.method == "minmax":
            return self.calibrator.compute_data()
        data = {}
        for name, (hist, edges, lo, hi) in self.calibrator.collector.histogram_dict.items():
            t = np.array(_largest(lo, hi), dtype=np.float32)
            data[name] = TensorData(lowest=-t, highest=t, hist=hist, hist_edges=edges.astype(np.float32))
        return TensorsData(self._histogram_method(), data)


def _timed_collector(calibrator: Any) -> Any:
    """The histogram collector ONNX Runtime's calibrator makes at its first batch, made now, its `collect` a phase
    (trtflow/phases.py: the |x| histograms cost more than the calibration pass's inference on a detector)."""
    from onnxruntime.quantization.calibrate import HistogramCollector

    collector = HistogramCollector(method=calibrator.method, symmetric=calibrator.symmetric,
                                   num_bins=calibrator.num_bins, num_quantized_bins=calibrator.num_quantized_bins,
                                   percentile=calibrator.percentile, scenario=calibrator.scenario)
    collector.collect = phases.timed("calibration statistics (ONNX Runtime's |x| histograms)")(collector.collect)
    return collector


def save(tensors: Any, path: Path) -> None:
    """ONNX Runtime's calibration cache (which `quantize_static` reads as it is)."""
    from onnxruntime.quantization.calibrate import save_tensors_data

    save_tensors_data(tensors, path)


def ranges_only(tensors: Any) -> Any:
    """`tensors` (ONNX Runtime's TensorsData) without the histograms."""
    from onnxruntime.quantization.calibrate import TensorData, TensorsData

    return TensorsData(tensors.calibration_method, {name: TensorData(lowest=d.range_value[0], highest=d.range_value[1])
                                                   for name, d in tensors.data.items()})


def _largest(lo: Any, hi: Any) -> float:
    return float(max(abs(float(lo)), abs(float(hi))))


class _Reader:
    """ONNX Runtime's CalibrationDataReader protocol over one chunk of samples."""

    def __init__(self, chunk: list[Feeds]) -> None:
        self._it: Iterator[Feeds] = iter(chunk)

    def get_next(self) -> Feeds | None:
        return next(self._it, None)


def calibrate(model: Path, op_types: list[str], rule: Rule, samples: Iterator[Feeds], total: int, work: Path,
              chunk: int) -> StreamedCalibration:
    """Collect statistics over `samples` (`total` of them, for the progress reports), at most `chunk` at a time
    (of one shape per chunk, as many as the memory budget holds: `held`; a sample whose batch does not fit, in parts
    of it that do: `fitting`); its `ranges()` are ONNX Runtime's `TensorsData`."""
    cal = StreamedCalibration(model, op_types, rule, work)
    sess = cal.calibrator.infer_session
    batch: list[Feeds] = []
    most = chunk
    for feed in samples:
        for part in fitting(sess, feed):
            # ONNX Runtime stacks a chunk's outputs: one shape each
            if batch and (len(batch) >= most or _shapes(part) != _shapes(batch[0])):
                _fold(cal, batch)
                batch = []
                progress.report("calibrating", cal.samples, total)
            if not batch:
                most = held(sess, part, chunk)
            batch.append(part)
        cal.samples += 1
    if batch:
        _fold(cal, batch)
        progress.report("calibrating", cal.samples, total)
    return cal


def _fold(cal: StreamedCalibration, batch: list[Feeds]) -> None:
    """`cal.add(batch)`, noted for the memory budget's record: the run with what the calibrator holds beside it."""
    graph, budget = memory.graph_of(cal.calibrator.infer_session), memory.room()
    if graph is not None:
        e = graph.estimate({k: list(v.shape) for k, v in batch[0].items()})
        memory.note(graph, e, budget, len(batch) * (e.outputs + COLLECTOR_COPIES * e.largest))
    cal.add(batch)


def _room_for(graph: memory.Graph, shapes: dict[str, list[int]], budget: memory.Room) -> tuple[int, memory.Estimate]:
    """How many samples of these shapes the calibrator may hold within `budget` beside a run, and their estimate:
    it holds every calibrated tensor of each, and its histogram copies the largest of them three times over the
    samples held (np.asarray of the list, flatten, absolute)."""
    e = graph.estimate(shapes)
    return int((budget.bytes - e.run) // max(e.outputs + COLLECTOR_COPIES * e.largest, 1)), e


def held(sess: Any, feed: Feeds, most: int) -> int:
    """How many samples of `feed`'s shapes the calibrator may hold before folding them in: at most `most`, as many
    as fit the memory budget (`_room_for`). A single one that does not fit is refused naming its shape and the
    estimate (memory.py)."""
    graph, budget = memory.graph_of(sess), memory.room()
    if graph is None or budget.bytes is None:
        return most
    fit, e = _room_for(graph, {k: list(v.shape) for k, v in feed.items()}, budget)
    if fit < 1:
        raise memory.refusal(graph, e, budget, "calibration holds every calibrated tensor of a sample, and one "
                                               "sample's do not fit")
    return min(most, fit)


def fitting(sess: Any, feed: Feeds) -> Iterator[Feeds]:
    """`feed` whole where the calibrator can hold it within the memory budget, else in parts of its batch that it
    can (the statistics of the parts are the statistics of the whole; the histogram's bins, which widen as larger
    values arrive, may fall apart as they would over more samples)."""
    graph, budget = memory.graph_of(sess), memory.room()
    rows = {v.shape[0] if v.ndim else None for v in feed.values()}
    n = next(iter(rows)) if len(rows) == 1 else None
    if graph is None or budget.bytes is None or not graph.batched() or not n or n < 2:
        yield feed
        return
    shapes = {k: list(v.shape) for k, v in feed.items()}
    size = n
    while size > 1 and _room_for(graph, {k: [size, *s[1:]] for k, s in shapes.items()}, budget)[0] < 1:
        size = -(-size // 2)
    for start in range(0, n, size):
        yield {k: v[start:start + size] for k, v in feed.items()}


def _shapes(feed: Feeds) -> dict[str, tuple[int, ...]]:
    return {k: v.shape for k, v in feed.items()}
