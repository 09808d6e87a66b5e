"""The accuracy gate: per output bounds (defaults per precision, then `'*'`, then the output's own entry) checked
against a comparison's metrics (an `accuracy.Accuracy`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtflow.errors import StageError
from trtflow.stages.compare.accuracy import Accuracy, added_nonfinite
from trtflow.text import did_you_mean

# What a variant must reach against the FP32 reference unless the YAML says otherwise (README: validate).
DEFAULTS: dict[str, dict[str, float]] = {
    "fp32": {"cosine": 0.9999},
    "fp16": {"cosine": 0.999},
    "int8": {"cosine": 0.99},
}
LOWER_BOUNDS = ("cosine", "top1", "top5")  # metric must be >= bound; every other metric must be <= bound
METRIC_OF = {"rtol": "max_rel"}  # tolerance key -> metric it bounds, where the names differ


@dataclass(frozen=True)
class Violation:
    output: str
    metric: str
    value: float
    bound: float

    def line(self) -> str:
        op = "<" if self.metric in LOWER_BOUNDS else ">"
        return f"output '{self.output}': {self.metric} {self.value:.6g} {op} {self.bound:g}"


def check_names(tolerances: dict[str, Any], outputs: list[str]) -> None:
    for name in tolerances:
        if name != "*" and name not in outputs:
            raise StageError(f"validate: tolerances.{name}: the model has no output '{name}'"
                             f"{did_you_mean(name, outputs) or '; outputs: ' + ', '.join(outputs)}")


def bounds_for(precision: str, output: str, tolerances: dict[str, Any]) -> dict[str, float]:
    """The bounds of one output: the precision's defaults, overridden by `'*'`, overridden by the output's entry."""
    bounds = dict(DEFAULTS.get(precision, DEFAULTS["fp32"]))
    for key in ("*", output):
        given = tolerances.get(key)
        if given is not None:
            bounds.update({METRIC_OF.get(k, k): float(v) for k, v in given.model_dump(exclude_none=True).items()})
    return bounds


def judge(result: Accuracy, precision: str, tolerances: dict[str, Any], nan_inf: bool) -> Accuracy:
    """`result` with the bounds it misses recorded as its violations."""
    result.violations = [v.line() for v in check(result, precision, tolerances, nan_inf)]
    return result


def layer_bound(precision: str, tolerances: dict[str, Any]) -> float:
    """The cosine below which an intermediate tensor counts as gone wrong: the bound every output gets."""
    return bounds_for(precision, "*", tolerances)["cosine"]


def check(result: Accuracy, precision: str, tolerances: dict[str, Any], nan_inf: bool) -> list[Violation]:
    """Every bound an output misses. NaN/Inf the candidate adds beyond the reference's own fail when `nan_inf`."""
    found = []
    for name, m in result.outputs.items():
        if nan_inf:
            added = added_nonfinite(m)
            if added > 0:
                found.append(Violation(name, "nan_inf", float(added), 0.0))
        for metric, bound in bounds_for(precision, name, tolerances).items():
            value = m.get(metric)
            if value is None:  # top-k on an output that is not (batch, classes)
                continue
            if (value < bound) if metric in LOWER_BOUNDS else (value > bound):
                found.append(Violation(name, metric, float(value), bound))
    return found
