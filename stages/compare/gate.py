"""The accuracy gate: per output bounds checked against a comparison's metrics (an `Accuracy`, `records.py`).

An output's bounds: the precision's defaults, overridden by `'*'`, overridden by the output's own entry. The
defaults are elementwise (cosine) for an output with no declared task metric, and the task metrics' own for one
with (`metrics:` — how its users judge it: decoded text, regions, embeddings, classes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtflow.errors import StageError
from trtflow.metrics.builtin.topk import constant_topk
from trtflow.metrics.names import metric_direction, shares_first
from trtflow.metrics.outputs import declared
from trtflow.precisions import Precision
from trtflow.stages.compare.records import Accuracy
from trtflow.text import did_you_mean, distinct

# What a variant must reach against the FP32 reference unless the YAML says otherwise (docs/pipeline.md: validate).
DEFAULTS: dict[Precision, dict[str, float]] = {
    "fp32": {"cosine": 0.9999},
    "fp16": {"cosine": 0.999},
    "int8": {"cosine": 0.99},
}


@dataclass(frozen=True)
class Violation:
    output: str
    metric: str
    value: float
    bound: float
    at_least: bool

    def line(self) -> str:
        if self.metric == "nan_inf":
            return f"output '{self.output}': {self.value:.0f} NaN/Inf values the FP32 reference does not have"
        value, bound = distinct(self.value, self.bound)
        return f"output '{self.output}': {self.metric} {value} {'<' if self.at_least else '>'} {bound}"


def check_names(stage: str, section: str, entries: dict[str, Any], outputs: list[str]) -> None:
    for name in entries:
        if name != "*" and name not in outputs:
            raise StageError(f"{stage}: {section}.{name}: the model has no output '{name}'"
                             f"{did_you_mean(name, outputs) or '; outputs: ' + ', '.join(outputs)}")


def check_metrics(stage: str, metrics: dict[str, Any], session: Any) -> None:
    """`metrics:` against the model an ONNX Runtime `session` runs: its outputs, and an embedding metric's `mask`
    among its inputs."""
    check_names(stage, "metrics", metrics, [o.name for o in session.get_outputs()])
    inputs = [i.name for i in session.get_inputs()]
    for output, m in metrics.items():
        mask = m.embedding.mask if m.embedding else None
        if mask is not None and mask not in inputs:
            raise StageError(f"{stage}: metrics.{output}.embedding.mask: the model has no input '{mask}'"
                             f"{did_you_mean(mask, inputs) or '; inputs: ' + ', '.join(inputs)}")
        if m.topk:
            _check_topk(stage, output, m.topk, session)


def _check_topk(stage: str, output: str, topk: Any, session: Any) -> None:
    """A declared top-k that cannot fail (k at least the classes along its axis, where the model fixes them),
    refused before anything runs; a dynamic class axis is checked on the first outputs (TopK.add)."""
    for o in session.get_outputs():
        shape = list(o.shape or [])
        if output not in ("*", o.name) or not -len(shape) <= topk.axis < len(shape):
            continue
        classes = shape[topk.axis]
        refused = constant_topk(topk.k, classes, f"{stage}: metrics.{output}.topk") if isinstance(classes, int) \
            else None
        if refused is not None:
            raise refused


def bounds_for(precision: Precision, output: str, tolerances: dict[str, Any], metrics: dict[str, Any] | None = None,
               task: bool | None = None) -> dict[str, tuple[float, bool]]:
    """The bounds of one output: metric -> (bound, whether the metric must be at least the bound). `task`: the
    output has declared task metrics (default: read off `metrics`)."""
    if task is None:
        task = bool(declared(metrics, output))
    if task:
        bounds = _task_defaults(precision, output, metrics or {})
    else:
        bounds = {m: (v, True) for m, v in DEFAULTS[precision].items()}
    for key in ("*", output):
        given = tolerances.get(key)
        if given is not None:
            bounds.update(given.given())
    return bounds


def _task_defaults(precision: Precision, output: str, metrics: dict[str, Any]) -> dict[str, tuple[float, bool]]:
    """The default bounds of the task metrics declared for `output` (each declaration's own), its entry's over
    '*''s."""
    bounds: dict[str, tuple[float, bool]] = {}
    for key in dict.fromkeys(("*", output)):
        for declaration in metrics[key].built_in().values() if key in metrics else ():
            bounds.update(declaration.default_bounds(precision))
    return shares_first(bounds)


def directions(output: str, names: list[str], tolerances: dict[str, Any],
               metrics: dict[str, Any] | None = None) -> dict[str, bool]:
    """Of one output's metric `names`, those whose direction is known -> whether higher is better: trtflow's own,
    the names a callable declares higher/lower, those a tolerance bounds with {min: x} / {max: x}."""
    known = {n: d for m in declared(metrics, output) if m.callable for n, d in m.callable.directions().items()}
    for key in ("*", output):
        given = tolerances.get(key)
        if given is not None:
            known.update({n: at_least for n, (_, at_least) in given.given().items()})
    out = {}
    for name in names:
        direction = known.get(name, metric_direction(name))
        if direction is not None:
            out[name] = direction
    return out


def judge(result: Accuracy, precision: Precision, tolerances: dict[str, Any], nan_inf: bool,
          metrics: dict[str, Any] | None = None) -> Accuracy:
    """`result` with the bounds it misses recorded as its violations, and the direction of each task metric it
    knows (what `select.max_accuracy_drop` weighs)."""
    result.violations = [v.line() for v in check(result, precision, tolerances, nan_inf, metrics)]
    return with_directions(result, tolerances, metrics)


def with_directions(result: Accuracy, tolerances: dict[str, Any], metrics: dict[str, Any] | None = None) -> Accuracy:
    """`result` with the direction of each task metric it knows (what `select.max_accuracy_drop` weighs)."""
    result.directions = {o: directions(o, _declared_names(o, m, tolerances), tolerances, metrics)
                         for o, m in result.outputs.items()}
    return result


def _declared_names(output: str, m: Any, tolerances: dict[str, Any]) -> list[str]:
    """An output's task metrics someone declared: every one where `metrics:` declares some (or the record does not
    say); else those a tolerance bounds (the top-1 every (batch, classes) output gets is nobody's metric until a
    tolerance names it: a regressor's three scores have no class)."""
    if m.task is not False:
        return list(m.task_values)
    bounded = {name for key in ("*", output) if (given := tolerances.get(key)) is not None for name in given.given()}
    return [name for name in m.task_values if name in bounded]


def layer_bound(precision: Precision, tolerances: dict[str, Any]) -> float:
    """The cosine below which an intermediate tensor counts as gone wrong: the bound every output gets."""
    return bounds_for(precision, "*", tolerances, task=False)["cosine"][0]


def check(result: Accuracy, precision: Precision, tolerances: dict[str, Any], nan_inf: bool,
          metrics: dict[str, Any] | None = None) -> list[Violation]:
    """Every bound an output misses. NaN/Inf the candidate adds beyond the reference's own fail when `nan_inf`.
    An elementwise bound is not missed where the largest error is negligible on the output's scale (a
    probability map near zero everywhere has a meaningless cosine)."""
    found = []
    for name, m in result.outputs.items():
        if nan_inf:
            added = m.added_nonfinite()
            if added > 0:
                found.append(Violation(name, "nan_inf", float(added), 0.0, False))
        negligible = m.negligible()
        for metric, (bound, at_least) in bounds_for(precision, name, tolerances, metrics, m.task).items():
            value = m.value(metric)
            if value is None:  # top-k on an output that is not (batch, classes)
                continue
            if metric in ("cosine", "max_rel") and negligible:
                continue
            if (value < bound) if at_least else (value > bound):
                found.append(Violation(name, metric, float(value), bound, at_least))
    return found


def preflight_warnings(result: Accuracy, precision: Precision, metrics: dict[str, Any] | None, what: str) -> list[str]:
    """What a precision/calibrate pre-flight should not pass quietly: the bounds validate would hold the variant to
    by default (NaN/Inf it adds; cosine, or the declared task metrics), missed on the held-out samples; and held-out
    samples on which the comparison cannot catch errors (`Accuracy.blind`)."""
    graph = f"; graph {result.graph}" if result.graph else ""
    found = [f"{what}: {v.line()} against FP32 on {result.samples} held-out samples ({result.runtime}{graph})"
             for v in check(result, precision, {}, True, metrics)]
    if result.blind:
        found.append(f"{what}: the pre-flight on {result.samples} held-out samples says nothing: {result.blind}")
    return found
