"""The FP16 safeguards' magnitudes (stages/ort/ranges.py `Magnitudes`): per tensor the largest |x| (inf where a value
is inf or NaN) and the smallest nonzero finite |x|, computed in the tensor's own type, equal to computing them in
float64 on every kind of value the safeguards meet."""
from __future__ import annotations

import numpy as np
import pytest

from trtflow.stages.ort.ranges import Magnitudes

RNG = np.random.default_rng(0)


def _in_float64(values: list[np.ndarray]) -> tuple[float, float | None]:
    v = np.abs(np.concatenate([x.astype(np.float64).ravel() for x in values]))
    peak = float(v.max(initial=0.0)) if np.isfinite(v).all() else float("inf")
    nonzero = v[(v > 0) & np.isfinite(v)]
    return peak, float(nonzero.min()) if nonzero.size else None


CASES = {
    "activations": [RNG.standard_normal((2, 8, 300)).astype(np.float32) * 40],
    "after a ReLU": [np.maximum(RNG.standard_normal((4, 100)), 0).astype(np.float32)],
    "all zeros": [np.zeros((3, 5), np.float32), -np.zeros(4, np.float32)],
    "an inf": [np.array([0.0, np.inf, 2.0], np.float32)],
    "a NaN beside a subnormal": [np.array([np.nan, 1e-30, 0.0], np.float32), np.array([3e-45], np.float32)],
    "float16": [RNG.standard_normal(1000).astype(np.float16), np.array([6e-8, 65504], np.float16)],
    "empty": [np.zeros((0, 4), np.float32)],
    "two batches": [RNG.standard_normal(50).astype(np.float32), RNG.standard_normal(50).astype(np.float32) * 1e-3],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_magnitudes_in_the_tensors_own_type_equal_float64s(case):
    seen = Magnitudes()
    for value in CASES[case]:
        seen.add("t", value)
    peak, floor = _in_float64(CASES[case])
    assert seen.peak["t"] == peak
    assert seen.floor.get("t") == floor
