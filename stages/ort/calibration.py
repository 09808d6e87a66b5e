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

from trtflow import progress

HISTOGRAM_BINS = 2048  # TensorRT's
# below this many values a 2048-bin histogram is too sparse for the KL search to mean anything (a squeeze-excite
# vector or a classifier's logits over a few samples): such tensors keep their full range, as MinMax
MIN_VALUES_FOR_KL = 16 * HISTOGRAM_BINS
START_BIN = 128  # the smallest threshold TensorRT considers, in bins
QUANTIZED_LEVELS = 128  # int8, signed: 0..127 on |x|

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
    suffix = np.concatenate([np.cumsum(bins[::-1])[::-1], [0.0]])  # suffix[i] = sum(bins[i:])
    best_i, best_kl = len(bins), np.inf
    for i in range(start_bin, len(bins) + 1):
        kl = _kl_for(bins[:i], suffix[i], levels)
        if kl <= best_kl:  # `<=`: the last minimum, as the reference takes it
            best_i, best_kl = i, kl
    return float(edges[best_i])


def _kl_for(kept: np.ndarray, outliers: float, levels: int) -> float:
    i = len(kept)
    level = (np.arange(i) * levels) // i  # = the reference's np.digitize over linspace(0, i, levels + 1), exactly
    nonzero = kept != 0
    counts = np.bincount(level[nonzero], weights=kept[nonzero], minlength=levels)
    members = np.bincount(level[nonzero], minlength=levels)
    mean = np.divide(counts, members, out=np.zeros(levels), where=members > 0)
    q = np.where(nonzero, mean[level], 0.0)
    p = kept.copy()
    p[-1] += outliers
    p_sum, q_sum = p.sum(), q.sum()
    if q_sum == 0 or p_sum == 0:
        return np.inf
    p, q = p / p_sum, q / q_sum
    mask = p > 0
    if np.any(q[mask] == 0):
        return np.inf
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


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
        self.samples = 0
        self.full_range: list[str] = []  # tensors whose histogram was too sparse for the KL search

    def add(self, chunk: list[Feeds]) -> None:
        self.calibrator.collect_data(_Reader(chunk))
        self.samples += len(chunk)

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
    """Collect statistics over `samples` (`total` of them, for the progress reports), `chunk` at a time (samples
    of one shape per chunk); its `ranges()` are ONNX Runtime's `TensorsData`."""
    cal = StreamedCalibration(model, op_types, rule, work)
    batch: list[Feeds] = []
    for feed in samples:
        if batch and _shapes(feed) != _shapes(batch[0]):  # ONNX Runtime stacks a chunk's outputs: one shape each
            cal.add(batch)
            batch = []
        batch.append(feed)
        if len(batch) == chunk:
            cal.add(batch)
            batch = []
            progress.report("calibrating", cal.samples, total)
    if batch:
        cal.add(batch)
        progress.report("calibrating", cal.samples, total)
    return cal


def _shapes(feed: Feeds) -> dict[str, tuple[int, ...]]:
    return {k: v.shape for k, v in feed.items()}
