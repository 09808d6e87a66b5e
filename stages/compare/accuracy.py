"""Comparing a model variant's outputs with a reference over many samples (the comparators, apart from the
runners), and the one result every comparison gives: `Accuracy` (per output metrics, the bounds missed, true when
none was). `Comparison` accumulates per output max/mean absolute error, max relative error, cosine similarity,
NaN/Inf counts in the candidate and in the reference, top-1 and top-5 agreement for classifier scores (an
`OutputAccuracy` per output); validate, the precision and calibrate pre-flights and parity's model check use it."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, Field, model_serializer, model_validator

from trtflow import markdown
from trtflow.stages.compare import task_metrics
from trtflow.stages.compare.sample import Sample

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
        self.first: np.ndarray | None = None  # the first sample's reference, and how far any other one is from it
        self.first_shape: tuple[int, ...] = ()
        self.spread = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        """One batch of this output; `sample`: what it came from (a task metric may read the inputs or the other
        outputs)."""
        r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
        self._vary(ref, r)
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

    def _vary(self, ref: np.ndarray, r: np.ndarray) -> None:
        """How far this sample's reference is from the first sample's (inf at another shape or where either is not
        finite)."""
        if self.first is None:
            self.first, self.first_shape = r.copy(), ref.shape  # (as float64, flat: what later samples are)
        elif ref.shape != self.first_shape:
            self.spread = np.inf
        elif self.spread < np.inf:
            d = np.abs(r - self.first)
            self.spread = max(self.spread, float(d.max(initial=0.0)) if np.isfinite(d).all() else np.inf)

    def constant(self) -> bool:
        """The reference's output was the same on every sample: no two differ by more than NEGLIGIBLE of its scale."""
        return self.spread <= NEGLIGIBLE * max(self.ref_max, np.finfo(np.float32).tiny)

    def result(self) -> OutputAccuracy:
        if self.ref_sq and self.got_sq:
            cosine = self.dot / np.sqrt(self.ref_sq * self.got_sq)
        else:  # all zeros on both sides is agreement (as in TensorStats); on one side only, none
            cosine = 1.0 if not self.ref_sq and not self.got_sq and self.count else 0.0
        values: dict[str, Any] = {}  # the task metrics' (a detection metric counts the reference's boxes too)
        for metric in self.task or []:
            values.update(metric.result())
        return OutputAccuracy.model_validate({
            "max_abs": self.max_abs, "mean_abs": self.sum_abs / max(self.count, 1), "max_rel": self.max_rel,
            "cosine": float(cosine), "nan": self.nan, "inf": self.inf, "reference_nan": self.ref_nan,
            "reference_inf": self.ref_inf, "scale": self.ref_max, **values,
            "task": self.declared})


class OutputAccuracy(BaseModel):
    """One output's metrics over a comparison's samples: elementwise (errors, cosine, NaN/Inf in the candidate
    and in its reference, `scale`: the largest |reference| value, at least the output's floor) and its task
    metrics' values (`task_values`; `reference_boxes`: how many boxes a detection reference has). `task`: True
    where task metrics were declared for the output, False where none was (its task values are the top-1/top-k
    every (batch, classes) output gets: the release weighs them only where a tolerance bounds them), None: not
    recorded.

    Stored flat, as reports always stored it: the task metrics beside the elementwise ones, and only the fields
    the record has (a report from before `max_rel`, `scale` or the reference's NaN/Inf reads back as written)."""

    max_abs: float = 0.0
    mean_abs: float = 0.0
    max_rel: float = 0.0
    cosine: float = 0.0
    nan: int = 0
    inf: int = 0
    reference_nan: int = 0
    reference_inf: int = 0
    scale: float = 0.0
    reference_boxes: int | None = None
    task: bool | None = None
    # metric -> value (None: it did not come out finite and the report stored null)
    task_values: dict[str, float | None] = Field(default_factory=dict, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: Any) -> Any:
        """A stored record (or a comparator's): every key that is no field is a task metric's value."""
        if isinstance(data, dict):
            values = {k: v for k, v in data.items() if k not in cls.model_fields}
            if values:
                return {**{k: v for k, v in data.items() if k in cls.model_fields}, "task_values": values}
        return data

    @model_serializer(mode="wrap")
    def _to_flat(self, handler: Any) -> dict[str, Any]:
        return {**{k: v for k, v in handler(self).items() if k in self.model_fields_set}, **self.task_values}

    def value(self, metric: str) -> float | None:
        """A metric by name (a bound's, a tolerance's): an elementwise field or a task metric; None where this
        output has no such metric (top-k on an output that is not (batch, classes))."""
        if metric in self.task_values:
            return self.task_values[metric]
        return getattr(self, metric) if metric in MEASURED else None

    def added_nonfinite(self) -> int:
        """NaN/Inf values in the candidate beyond those its reference has itself."""
        return self.nan + self.inf - self.reference_nan - self.reference_inf

    def negligible(self) -> bool:
        """The largest error is below NEGLIGIBLE of the output's scale: no difference, whatever the cosine."""
        return self.scale > 0 and self.max_abs <= NEGLIGIBLE * self.scale


MEASURED = ("max_abs", "mean_abs", "max_rel", "cosine", "nan", "inf", "reference_nan", "reference_inf", "scale",
            "reference_boxes")  # the fields of OutputAccuracy a bound may name


@dataclass
class Accuracy:
    """What comparing a candidate with its reference found: metrics per output over `samples`, measured on
    `runtime`, and the bounds it missed (one line each). True when it missed none."""

    runtime: str
    samples: int
    outputs: dict[str, OutputAccuracy]
    # a report's field of this type stores runtime, samples, outputs and directions (not violations)
    violations: Annotated[list[str], Field(exclude=True)] = field(default_factory=list)
    # output -> task metric -> whether higher is better, where it is known (gate.judge records it: trtflow's own
    # metrics, a callable's declared names, a tolerance's {min: x} / {max: x})
    directions: dict[str, dict[str, bool]] = field(default_factory=dict)
    # the graph the candidate ran (simulation.graph_name: file name and sha256), where known (stored only then)
    graph: Annotated[str, Field(exclude_if=lambda v: not v)] = ""
    # why this comparison cannot catch errors (the reference's outputs do not vary with its inputs, or the samples
    # are one and the same), else None (not stored)
    blind: Annotated[str | None, Field(exclude_if=lambda v: v is None)] = None

    def __bool__(self) -> bool:
        return not self.violations

    def nonfinite(self) -> int:
        """NaN and Inf values in the candidate's outputs."""
        return sum(o.nan + o.inf for o in self.outputs.values())

    def table(self) -> list[str]:
        lines = ["| output | max abs | mean abs | cosine | NaN/Inf | task metrics |", "|---|---|---|---|---|---|"]
        for name, r in self.outputs.items():
            task = ", ".join([f"{markdown.text(k)} {v:.4g}" for k, v in r.task_values.items()]
                             + ([f"reference boxes {r.reference_boxes}"] if r.reference_boxes is not None else [])
                             ) or "-"
            lines.append(f"| {markdown.code(name, cell=True)} | {r.max_abs:.4g} | {r.mean_abs:.4g} | "
                         f"{r.cosine:.6f} | {r.nan}/{r.inf} | {task} |")
        return lines


class Comparison:
    """`metrics`: the task metrics declared per output (`OutputMetrics`, by output name or '*'); `floors`: the
    least scale of some outputs (`onnx.graph.output_floors`)."""

    def __init__(self, metrics: dict[str, Any] | None = None, floors: dict[str, float] | None = None,
                 what: str = "validate") -> None:
        self.outputs: dict[str, OutputStats] = {}
        self.samples = 0
        self.metrics, self.floors, self.what = metrics or {}, floors or {}, what
        self._first_feed: str | None = None  # the first sample's inputs, hashed
        self._distinct = False  # some sample's inputs differ from the first's

    def add(self, ref: dict[str, np.ndarray], got: dict[str, np.ndarray],
            feed: dict[str, np.ndarray] | None = None) -> None:
        """One sample's outputs; `feed`, its inputs (a metric may read one, e.g. an attention mask)."""
        self.samples += 1
        if feed and not self._distinct:  # (once two samples differ, nothing more to learn)
            digest = _feed_digest(feed)
            self._first_feed = self._first_feed or digest
            self._distinct = self._distinct or digest != self._first_feed
        sample = Sample(feed or {}, ref, got)
        for name, r in ref.items():
            if name not in self.outputs:
                task = task_metrics.make(task_metrics.declared(self.metrics, name), self.what, name) or None
                self.outputs[name] = OutputStats(task, self.floors.get(name, 0.0))
            self.outputs[name].add(r, got[name], sample)

    def result(self, runtime: str) -> Accuracy:
        return Accuracy(runtime, self.samples, {n: s.result() for n, s in self.outputs.items()},
                        blind=self.blind())

    def blind(self) -> str | None:
        """Why this comparison cannot catch errors, if it cannot: its samples are one and the same input, or on
        distinct inputs the reference's outputs are all the same (a model whose output ignores its input, such as
        one with random weights, or inputs it does not respond to, like a text detector's on images without
        text). A candidate then agrees with it whatever its errors on real inputs. None with fewer than two
        samples (nothing to tell)."""
        if self.samples < 2 or not self.outputs:
            return None
        if self._first_feed is not None and not self._distinct:
            return (f"its {self.samples} samples are one and the same input: this comparison cannot catch errors "
                    f"on any other; give distinct samples")
        if not all(s.constant() for s in self.outputs.values()):
            return None
        spread = "; ".join(f"'{n}' differs by at most {s.spread:.3g} on a scale of {s.ref_max:.3g}"
                           for n, s in list(self.outputs.items())[:3])
        return (f"the reference's output does not vary with its input: this comparison cannot catch errors (over "
                f"{self.samples} distinct samples, output {spread}); a model with random or untrained weights, or "
                f"inputs it does not respond to (give samples from the deployment's distribution)")


def _feed_digest(feed: dict[str, np.ndarray]) -> str:
    h = hashlib.sha1()
    for name in sorted(feed):
        x = np.ascontiguousarray(feed[name])
        h.update(f"{name}{x.dtype}{x.shape}".encode())
        h.update(repr(x.tolist()).encode() if x.dtype.kind == "O" else x.data)
    return h.hexdigest()
