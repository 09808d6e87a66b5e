"""Issue #70 Build 4: a built-in metric is declared once (pipelines/schema.py: its parameters, the names it gives,
which way each is better, whether the release weighs it, its default bounds), and its computation is found by its
key (stages/compare/task_metrics.py `MAKERS`). Here the two are held to each other on real arithmetic: what each
computation returns is exactly what its declaration says it gives."""
from __future__ import annotations

import numpy as np
import pytest

from trtflow.pipelines.schema import BUILT_IN_METRICS, OutputMetrics, gives
from trtflow.precisions import Precision
from trtflow.stages.compare.task_metrics import MAKERS, make

RNG = np.random.default_rng(0)


def _boxes(n: int) -> np.ndarray:
    """A yolov8 head [1, 4 + 2 classes, n anchors]: boxes spread over a 640-pixel image, one class each."""
    out = np.zeros((1, 6, n), np.float32)
    out[0, 0], out[0, 1] = RNG.uniform(50, 590, n), RNG.uniform(50, 590, n)
    out[0, 2], out[0, 3] = 30, 30
    out[0, 4 + (np.arange(n) % 2), np.arange(n)] = RNG.uniform(0.5, 0.9, n)
    return out


# per declaration: (its YAML block, a reference output of the shape it reads)
CASES = {
    "topk": ({"topk": {"k": 3}}, RNG.normal(size=(4, 10))),
    "ctc": ({"ctc": {"blank": 0}}, RNG.normal(size=(2, 6, 5))),
    "map_iou": ({"map_iou": {"threshold": 0.3}}, RNG.uniform(size=(2, 1, 8, 8))),
    "map_iou classes": ({"map_iou": {"classes": [1, 2]}}, RNG.normal(size=(2, 3, 8, 8))),
    "embedding": ({"embedding": {}}, RNG.normal(size=(3, 16))),
    "detections": ({"detections": {"layout": "yolov8"}}, _boxes(8)),
    "image": ({"image": {"range": [0, 1]}}, RNG.uniform(size=(2, 3, 16, 16))),
    "regression": ({"regression": {}}, RNG.normal(size=(3, 4))),
    "regression relative": ({"regression": {"relative_above": 0.1}}, RNG.normal(size=(3, 4))),
    "decision": ({"decision": {"threshold": 0.5}}, RNG.uniform(size=(4, 2))),
}


def test_every_built_in_metric_has_its_computation_and_a_case_here():
    assert set(MAKERS) == set(BUILT_IN_METRICS)
    assert {case.split()[0] for case in CASES} == set(BUILT_IN_METRICS)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_metric_computes_exactly_the_names_its_declaration_gives(case):
    block, ref = CASES[case]
    declared = OutputMetrics.model_validate(block)
    (metric,) = make([declared], "validate", "y")
    noisy = ref + RNG.normal(scale=0.01, size=ref.shape).astype(ref.dtype)
    metric.add(ref, noisy)
    counts = {n for spec in declared.built_in().values() for n in spec.REPORTS}
    assert set(metric.result()) == declared.names() | counts, case
    for name in declared.names():
        assert gives(name) is not None, name  # its direction and weighing are known: validate and release read them


@pytest.mark.parametrize("key", sorted(BUILT_IN_METRICS))
def test_a_default_bound_is_given_for_every_precision(key):
    for name, given in BUILT_IN_METRICS[key].GIVES.items():
        if given.bounds is not None:
            assert set(given.bounds) == set(Precision.__args__), name
        assert given.example.split(":")[0] == key, (name, given.example)  # the hint names the declaration
