"""Comparing a model variant's outputs with a reference over many samples (the comparators, apart from the
runners), and the one result every comparison gives: `Accuracy` (per output metrics, the bounds missed, true when
none was). `Comparison` accumulates per output max/mean absolute error, max relative error, cosine similarity,
NaN/Inf counts in the candidate and in the reference, top-1 and top-5 agreement for classifier scores; validate,
the precision and calibrate pre-flights and parity's model check use it; prepare's elementwise check
(`ort.runner.compare_models`) gives an `Accuracy` too."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from trtflow import markdown
from trtflow.stages.compare import task_metrics

REL_FLOOR = 1e-3  # max_rel ignores reference elements below this share of the output's largest |value|


NEGLIGIBLE = 1e-4  # an error below this share of an output's scale is not a difference, whatever the cosine


class OutputStats:
    """One output's elementwise metrics, and the task metrics declared for it (`task`: see task_metrics; with
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

    def add(self, ref: np.ndarray, got: np.ndarray, sample: task_metrics.Sample | None = None) -> None:
        """One batch of this output; `sample`: what it came from (a task metric may read the inputs or the other
        outputs)."""
        r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
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
            self.task = [task_metrics.TopK(5, 1)] if ref.ndim == 2 and ref.shape[1] > 1 else []
        for metric in self.task:
            metric.add(ref, got, sample)

    def result(self) -> dict[str, Any]:
        if self.ref_sq and self.got_sq:
            cosine = self.dot / np.sqrt(self.ref_sq * self.got_sq)
        else:  # all zeros on both sides is agreement (as in TensorStats); on one side only, none
            cosine = 1.0 if not self.ref_sq and not self.got_sq and self.count else 0.0
        out = {"max_abs": self.max_abs, "mean_abs": self.sum_abs / max(self.count, 1), "max_rel": self.max_rel,
               "cosine": float(cosine), "nan": self.nan, "inf": self.inf,
               "reference_nan": self.ref_nan, "reference_inf": self.ref_inf, "scale": self.ref_max}
        for metric in self.task or []:
            out.update(metric.result())
        if self.declared:
            out["task"] = True
        return out


ELEMENTWISE = ("max_abs", "mean_abs", "max_rel", "cosine", "nan", "inf", "reference_nan", "reference_inf", "scale",
               "task")
COUNTS = ("reference_boxes",)  # what a task metric counts beside its values (how many boxes the reference has)


def task_values(metrics: dict[str, Any]) -> dict[str, float]:
    """The task-level values among one output's metrics."""
    return {k: v for k, v in metrics.items() if k not in ELEMENTWISE and k not in COUNTS}


def added_nonfinite(metrics: dict[str, Any]) -> int:
    """NaN/Inf values in one output of the candidate beyond those its reference has itself."""
    return int(metrics["nan"] + metrics["inf"] - metrics.get("reference_nan", 0) - metrics.get("reference_inf", 0))


@dataclass
class Accuracy:
    """What comparing a candidate with its reference found: metrics per output over `samples`, measured on
    `runtime`, and the bounds it missed (one line each). True when it missed none."""

    runtime: str
    samples: int
    outputs: dict[str, dict[str, Any]]  # output -> metric -> value
    # a report's field of this type stores runtime, samples, outputs and directions (not violations nor details)
    violations: Annotated[list[str], Field(exclude=True)] = field(default_factory=list)
    # what else the comparator reports (its bounds, shapes)
    details: Annotated[dict[str, Any], Field(exclude=True)] = field(default_factory=dict)
    # output -> task metric -> whether higher is better, where it is known (gate.judge records it: trtflow's own
    # metrics, a callable's declared names, a tolerance's {min: x} / {max: x})
    directions: dict[str, dict[str, bool]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return not self.violations

    def total(self, metric: str) -> float:
        return sum(o.get(metric, 0) for o in self.outputs.values())

    def table(self) -> list[str]:
        lines = ["| output | max abs | mean abs | cosine | NaN/Inf | task metrics |", "|---|---|---|---|---|---|"]
        for name, r in self.outputs.items():
            task = ", ".join([f"{markdown.text(k)} {v:.4g}" for k, v in task_values(r).items()]
                             + [f"{k.replace('_', ' ')} {r[k]}" for k in COUNTS if k in r]) or "-"
            lines.append(f"| {markdown.code(name, cell=True)} | {r['max_abs']:.4g} | {r['mean_abs']:.4g} | "
                         f"{r['cosine']:.6f} | {r['nan']}/{r['inf']} | {task} |")
        return lines


class Comparison:
    """`metrics`: the task metrics declared per output (`OutputMetrics`, by output name or '*'); `floors`: the
    least scale of some outputs (`onnx.graph.output_floors`)."""

    def __init__(self, metrics: dict[str, Any] | None = None, floors: dict[str, float] | None = None,
                 what: str = "validate") -> None:
        self.outputs: dict[str, OutputStats] = {}
        self.samples = 0
        self.metrics, self.floors, self.what = metrics or {}, floors or {}, what

    def add(self, ref: dict[str, np.ndarray], got: dict[str, np.ndarray],
            feed: dict[str, np.ndarray] | None = None) -> None:
        """One sample's outputs; `feed`, its inputs (a metric may read one, e.g. an attention mask)."""
        self.samples += 1
        sample = task_metrics.Sample(feed or {}, ref, got)
        for name, r in ref.items():
            if name not in self.outputs:
                task = task_metrics.make(task_metrics.declared(self.metrics, name), self.what, name) or None
                self.outputs[name] = OutputStats(task, self.floors.get(name, 0.0))
            self.outputs[name].add(r, got[name], sample)

    def result(self, runtime: str) -> Accuracy:
        return Accuracy(runtime, self.samples, {n: s.result() for n, s in self.outputs.items()})
