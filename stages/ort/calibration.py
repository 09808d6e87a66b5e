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

import functools
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
FOLD_THREADS_MAX = 4  # tensors folded in at once, each with its copies

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
    bounds = _group_bounds(int(ends[0]), int(ends[-1]), levels)
    counts = np.diff(np.take(count, bounds), axis=1)
    members = np.diff(np.take(nonzero, bounds), axis=1)
    mean = np.divide(counts, members, out=np.zeros_like(counts), where=members > 0)
    log_mean = np.log(mean, out=np.zeros_like(mean), where=mean > 0)
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


@functools.lru_cache(maxsize=8)
def _group_bounds(first: int, last: int, levels: int) -> np.ndarray:
    """For each threshold bin i in first..last, the first bin of each of its `levels` groups (ceil(g * i /
    levels)) and i itself: the same for every histogram of as many bins."""
    i = np.arange(first, last + 1)[:, None]
    group = np.arange(levels + 1)[None, :]
    bounds = (group * i + levels - 1) // levels
    bounds.flags.writeable = False
    return bounds


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
    """Feed samples in chunks; each chunk is folded into the statistics while the next one runs, so memory holds
    two chunks whatever the size of the calibration set (ONNX Runtime's calibrators keep every intermediate
    output)."""

    def __init__(self, model: Path, op_types: list[str], rule: Rule, work: Path, quantize_outputs: bool = False):
        from onnxruntime.quantization.calibrate import MinMaxCalibrater, PercentileCalibrater

        method = rule.method
        self.method, self.percentile, self.floor = method, rule.percentile, rule.floor
        # the histogram methods need the |x| histogram, which ONNX Runtime's percentile calibrator collects; made
        # here as `create_calibrator` makes it, less the session it would open on the augmented model (replaced below)
        augmented = work / "augmented.onnx"
        if method == "minmax":
            self.calibrator = MinMaxCalibrater(model, op_types, str(augmented), symmetric=True)
        else:
            self.calibrator = PercentileCalibrater(model, op_types, str(augmented), symmetric=True,
                                                   num_bins=HISTOGRAM_BINS)
        self.calibrator.augment_graph()
        if method != "minmax":
            self.calibrator.collector = _Collector(self.calibrator, q_dq_tensors(self.calibrator.model, op_types,
                                                                                  quantize_outputs))
        # the augmented model run as every stage runs a model (runner.session: its graph known to the budget)
        self.calibrator.infer_session = session(augmented, role=CALIBRATION)
        self.samples = 0
        self.full_range: list[str] = []  # tensors whose histogram was too sparse for the KL search
        self._folder = ThreadPoolExecutor(max_workers=1)
        self._folding: Future[None] | None = None

    def add(self, chunk: list[Feeds]) -> None:
        """Fold a chunk (of one shape) into the statistics (`samples` counts the samples the caller fed). The
        histograms of a chunk are made while the next chunk runs (one chunk in flight: `settle` waits for it)."""
        if self.method == "minmax":
            self.calibrator.collect_data(_Reader(chunk))
            return
        outputs = self._outputs(chunk)
        self.settle()
        self._folding = self._folder.submit(self.calibrator.collector.collect, outputs)

    def settle(self) -> None:
        """Wait for the chunk being folded in (its error, if any, raised here)."""
        folding, self._folding = self._folding, None
        if folding is not None:
            folding.result()

    def _outputs(self, chunk: list[Feeds]) -> dict[str, list[np.ndarray]]:
        """The calibrated tensors of each sample of `chunk`, by name (ONNX Runtime's `collect_data`, which would
        fold them in at once)."""
        sess = self.calibrator.infer_session
        names = [o.name for o in sess.get_outputs()]
        inputs = {i.name for i in sess.get_inputs()}
        wanted = self.calibrator.tensors_to_calibrate
        merged: dict[str, list[np.ndarray]] = {}
        for feed in chunk:
            for name, out in zip(names, sess.run(None, feed)):
                if name in wanted:  # an output that is also an input is a view of the feed (onnxruntime#21922)
                    merged.setdefault(name, []).append(out.copy() if name in inputs else out)
        return merged

    @phases.timed("thresholds from the histograms (TensorRT's KL search)")
    def ranges(self, rule: Rule | None = None) -> Any:
        """ONNX Runtime's `TensorsData`: per tensor, the symmetric range [-t, t] and, for histogram methods,
        the histogram it came from. `rule`: another histogram rule than the one collected for, from the same
        statistics (no second pass over the data)."""
        from onnxruntime.quantization.calibrate import TensorData, TensorsData

        self.settle()
        if self.method == "minmax":
            return self.calibrator.compute_data()
        method = rule.method if rule else self.method
        percentile = rule.percentile if rule else self.percentile
        floor = rule.floor if rule else self.floor
        if method == "minmax":
            return self.full_ranges()
        data = self._unbinned()
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
        return TensorsData(self._histogram_method(), dict(sorted(data.items())))  # threads fill it in any order

    def _histogram_method(self) -> Any:
        from onnxruntime.quantization import CalibrationMethod

        return CalibrationMethod.Entropy if self.method == "entropy" else CalibrationMethod.Percentile


    def full_ranges(self) -> Any:
        """Every tensor at the largest |x| seen: MinMax's symmetric ranges, from the statistics already
        collected (no second pass over the data)."""
        from onnxruntime.quantization.calibrate import TensorData, TensorsData

        self.settle()
        if self.method == "minmax":
            return self.calibrator.compute_data()
        data = self._unbinned()
        for name, (hist, edges, lo, hi) in self.calibrator.collector.histogram_dict.items():
            t = np.array(_largest(lo, hi), dtype=np.float32)
            data[name] = TensorData(lowest=-t, highest=t, hist=hist, hist_edges=edges.astype(np.float32))
        return TensorsData(self._histogram_method(), dict(sorted(data.items())))  # threads fill it in any order

    def _unbinned(self) -> dict[str, Any]:
        """The tensors calibrated without a histogram (no Q/DQ goes on them), each at its largest |x|."""
        from onnxruntime.quantization.calibrate import TensorData

        data = {}
        for name, (lo, hi) in self.calibrator.collector.extremes.items():
            t = np.array(_largest(lo, hi), dtype=np.float32)
            data[name] = TensorData(lowest=-t, highest=t)
        return data


def q_dq_tensors(model: Any, op_types: list[str], quantize_outputs: bool) -> set[str]:
    """The tensors the Q/DQ writer (qdq.write) may put a Q/DQ pair on: every input of a node of `op_types`, and
    its outputs with `quantize_outputs`. ONNX Runtime's calibrator also calibrates the outputs, whose ranges its
    quantizer asks for but no Q/DQ uses: they need no histogram."""
    tensors: set[str] = set()
    for node in model.graph.node:
        if node.op_type in op_types:
            tensors.update(node.input)
            tensors.update(node.output if quantize_outputs else ())
    return tensors


class _Collector:
    """ONNX Runtime's |x| histogram collector, as its calibrator would make it at its first batch, for the tensors
    a Q/DQ pair may go on (`binned`); the others keep only their extremes (`extremes`: name -> (lowest, highest)).
    Its statistics' time is a phase (trtflow/phases.py: on a detector they cost more than the calibration pass's
    inference)."""

    def __init__(self, calibrator: Any, binned: set[str]) -> None:
        from onnxruntime.quantization.calibrate import HistogramCollector

        self.histograms = HistogramCollector(method=calibrator.method, symmetric=calibrator.symmetric,
                                             num_bins=calibrator.num_bins,
                                             num_quantized_bins=calibrator.num_quantized_bins,
                                             percentile=calibrator.percentile, scenario=calibrator.scenario)
        self.binned = binned
        self.extremes: dict[str, tuple[float, float]] = {}

    @property
    def histogram_dict(self) -> dict[str, Any]:
        """name -> (histogram, its edges, lowest, highest), as ONNX Runtime's collector keeps them."""
        return self.histograms.histogram_dict

    @phases.timed("calibration statistics (ONNX Runtime's |x| histograms)")
    def collect(self, name_to_arr: dict[str, list[np.ndarray]]) -> None:
        """Fold a chunk in (name -> the chunk's arrays), one tensor per thread, largest first: numpy lets go of
        the GIL while it sorts and counts (1.5x on two cores)."""
        largest_first = sorted(name_to_arr.items(), key=lambda item: -sum(a.size for a in item[1]))
        with ThreadPoolExecutor(max_workers=_fold_threads()) as pool:
            list(pool.map(lambda item: self._collect_one(*item), largest_first))

    def _collect_one(self, name: str, arrays: list[np.ndarray]) -> None:
        if name in self.binned:  # what ONNX Runtime's `collect` does for a symmetric percentile collector
            self.histograms.collect_absolute_value({name: arrays})
            return
        lo = min(float(np.nanmin(a)) for a in arrays)
        hi = max(float(np.nanmax(a)) for a in arrays)
        seen = self.extremes.get(name, (lo, hi))
        self.extremes[name] = (min(seen[0], lo), max(seen[1], hi))


def _cores() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
              chunk: int, quantize_outputs: bool = False) -> StreamedCalibration:
    """Collect statistics over `samples` (`total` of them, for the progress reports), at most `chunk` at a time
    (of one shape per chunk, as many as the memory budget holds: `held`; a sample whose batch does not fit, in parts
    of it that do: `fitting`); its `ranges()` are ONNX Runtime's `TensorsData`."""
    cal = StreamedCalibration(model, op_types, rule, work, quantize_outputs)
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
    cal.settle()
    return cal


def _fold(cal: StreamedCalibration, batch: list[Feeds]) -> None:
    """`cal.add(batch)`, noted for the memory budget's record: the run with what the calibrator holds beside it."""
    graph, budget = memory.graph_of(cal.calibrator.infer_session), memory.room()
    if graph is not None:
        e = graph.estimate({k: list(v.shape) for k, v in batch[0].items()})
        memory.note(graph, e, budget, len(batch) * held_per_sample(e))
    cal.add(batch)


def held_per_sample(e: memory.Estimate) -> int:
    """The bytes the calibrator holds per sample of a chunk beside a run: the chunk's calibrated tensors twice (a
    chunk is folded in while the next one runs) and the collector's copies of the largest of them in each thread
    folding."""
    return 2 * e.outputs + COLLECTOR_COPIES * e.largest * _fold_threads()


def _fold_threads() -> int:
    return min(_cores(), FOLD_THREADS_MAX)


def _room_for(graph: memory.Graph, shapes: dict[str, list[int]], budget: memory.Room) -> tuple[int, memory.Estimate]:
    """How many samples of these shapes the calibrator may hold within `budget` beside a run, and their estimate
    (`held_per_sample`)."""
    e = graph.estimate(shapes)
    return int((budget.bytes - e.run) // max(held_per_sample(e), 1)), e


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
