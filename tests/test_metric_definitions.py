"""Issue #70 Build 4: a built-in metric is one module of trtflow/metrics/builtin/ holding its declaration (its
parameters, the names it gives, which way each is better, whether the release weighs it, its default bounds) and its
computation. Here the two are held to each other on real arithmetic (what each computation returns is exactly what
its declaration says it gives), and a metric added as one new module, nothing else edited, is declared, documented,
computed, bounded, weighed and keyed."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.test_new_kind import _copy_source
from trtflow.metrics.builtin import BUILT_IN
from trtflow.metrics.names import gives
from trtflow.metrics.outputs import OutputMetrics, measures
from trtflow.precisions import Precision

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


def test_every_built_in_metric_has_a_case_here():
    assert {case.split()[0] for case in CASES} == set(BUILT_IN)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_metric_computes_exactly_the_names_its_declaration_gives(case):
    block, ref = CASES[case]
    declared = OutputMetrics.model_validate(block)
    (metric,) = measures([declared], "validate", "y")
    noisy = ref + RNG.normal(scale=0.01, size=ref.shape).astype(ref.dtype)
    metric.add(ref, noisy)
    counts = {n for spec in declared.built_in().values() for n in spec.REPORTS}
    assert set(metric.result()) == declared.names() | counts, case
    for name in declared.names():
        assert gives(name) is not None, name  # its direction and weighing are known: validate and release read them


@pytest.mark.parametrize("key", sorted(BUILT_IN))
def test_a_default_bound_is_given_for_every_precision(key):
    for name, given in BUILT_IN[key].GIVES.items():
        if given.bounds is not None:
            assert set(given.bounds) == set(Precision.__args__), name
        assert given.example.split(":")[0] == key, (name, given.example)  # the hint names the declaration


# A metric of a new task, written as a contributor would: the share of elements whose sign the candidate keeps.
SIGN_AGREE = '''
"""A signed output (a steering angle, a disparity's direction): does the candidate keep each element's sign."""
from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import Field

from trtflow.metrics.contract import BuiltInMetric, Gives, Sample, per_precision


class SignAgree:
    def __init__(self, dead_zone: float) -> None:
        self.dead_zone, self.same, self.count = dead_zone, 0, 0

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        live = np.abs(ref) > self.dead_zone
        self.same += int((np.sign(ref) == np.sign(got))[live].sum())
        self.count += int(live.sum())

    def result(self) -> dict[str, float]:
        return {"sign_agree": self.same / self.count} if self.count else {}


class SignAgreeMetric(BuiltInMetric):
    """A signed output: the share of elements, beyond the dead zone, whose sign the candidate keeps."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "sign_agree": Gives(True, bounds=per_precision(0.999, 0.99, 0.95), example="sign_agree: {dead_zone: 0.1}")}
    dead_zone: float = Field(0.0, ge=0, description="elements of the reference within this of zero are not counted")

    def measure(self, where: str) -> SignAgree:
        return SignAgree(self.dead_zone)


METRIC = SignAgreeMetric
'''

# What the copy of trtflow with the new module does with it, each the way the product reaches a metric.
CHECKS = '''
import json, sys
import numpy as np
from trtflow.flows import code_lock
from trtflow.metrics.names import metric_direction, not_weighed
from trtflow.pipelines import reference
from trtflow.pipelines.kinds import BUILT_IN_KINDS
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.pipelines.pipeline import json_schema
from trtflow.stages.compare import gate
from trtflow.stages.compare.accuracy import Comparison

declared = ValidateStage.model_validate({"kind": "validate", "metrics": {"y": {"sign_agree": {"dead_zone": 0.1}}}})
ref = np.random.default_rng(0).normal(size=(8, 64)).astype(np.float32)
flipped = ref.copy()
flipped[:, :8] *= -1  # an eighth of the signs lost
judged = {}
for name, got in (("same", ref + 1e-4), ("flipped", flipped)):
    comparison = Comparison(declared.metrics)
    comparison.add({"y": ref}, {"y": got})
    result = comparison.result("onnxruntime")
    judged[name] = {"value": result.outputs["y"].value("sign_agree"),
                    "violations": [v.line() for v in gate.check(result, "fp16", declared.tolerances, True,
                                                                declared.metrics)]}
bounded = ValidateStage.model_validate({"kind": "validate", "metrics": {"y": {"sign_agree": {}}},
                                        "tolerances": {"y": {"sign_agree": 0.5}}})
print(json.dumps({
    "judged": judged,
    "tolerance": bounded.tolerances["y"].given(),
    "release": [metric_direction("sign_agree"), not_weighed("sign_agree")],
    "schema": "sign_agree" in json.dumps(json_schema()),
    "reference": "dead_zone" in reference.render(),
    "validate_key": "metrics/builtin/sign_agree.py" in code_lock.closure(BUILT_IN_KINDS["validate"]).files,
}))
'''


@pytest.mark.slow
def test_a_built_in_metric_added_as_one_module_is_declared_computed_bounded_and_keyed(tmp_path):
    """Adding a built-in metric touches one module: a copy of trtflow's source with one new file in
    trtflow/metrics/builtin/, nothing else edited."""
    src = _copy_source(tmp_path / "src")
    (src / "trtflow" / "metrics" / "builtin" / "sign_agree.py").write_text(textwrap.dedent(SIGN_AGREE))
    done = subprocess.run([sys.executable, "-c", CHECKS], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(src)})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    assert seen["judged"]["same"] == {"value": 1.0, "violations": []}
    assert seen["judged"]["flipped"]["value"] == pytest.approx(0.875, abs=0.02)
    # its own default bound for FP16, with no tolerance written
    (violation,) = seen["judged"]["flipped"]["violations"]
    assert violation.startswith("output 'y': sign_agree 0.87") and violation.endswith(" < 0.99"), violation
    assert seen["tolerance"] == {"sign_agree": [0.5, True]}  # a tolerance bounds it as trtflow's own
    assert seen["release"] == [True, False]  # the release weighs it as a share, higher better
    assert seen["schema"] and seen["reference"]  # the pipeline's JSON Schema and docs/reference.md, generated
    assert seen["validate_key"]  # editing it re-keys validate
