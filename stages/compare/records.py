"""What comparisons give, as records apart from the comparators that make them: `Accuracy`, the one result every
comparison of a candidate with its reference gives (metrics per output over the samples, the bounds missed, true
when none was; `accuracy.py`), its `OutputAccuracy` per output, and `Labelled`, an accuracy against the data's
labels (`labels.py`); `OutputDiff`, one output of a transformed model against the model before it (ONNX Runtime's
`ort.runner.compare`), and `Layerwise`, where a variant first drifts from the reference node by node, a `LayerRow`
per tensor (`ort.layerwise.compare`, from `tensor_stats.py`'s statistics). Types and small pure methods only: the
reports that hold them (prepare's, validate's, the precision and calibrate pre-flights', the release's) read them
without the comparators' code."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, Field, model_serializer, model_validator

from trtflow import markdown

NEGLIGIBLE = 1e-4  # an error below this share of an output's scale is not a difference, whatever the cosine


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


class Labelled(BaseModel):
    """Accuracy against the labels over `samples` labelled files: `values` by metric (top1, top<k>; or text_exact,
    cer), `main` the one the release weighs (better higher)."""
    samples: int
    values: dict[str, float]
    main: str

    def text(self) -> str:
        shown = ", ".join(f"{m} {v:.2%}" for m, v in self.values.items())
        return f"{shown} on {self.samples} labelled samples"


class OutputDiff(BaseModel):
    """One output of a model against the model before it (`runner.compare`): whether every element is within
    atol + rtol * |reference|, the largest absolute and relative difference, how many elements are NaN on one
    side only; `error` where it could not be compared (missing, another shape). Stored with the fields it has."""
    ok: bool = True
    max_abs: float | None = Field(None, exclude_if=lambda v: v is None)
    max_rel: float | None = Field(None, exclude_if=lambda v: v is None)
    nan_mismatch: int | None = Field(None, exclude_if=lambda v: v is None)
    error: str | None = Field(None, exclude_if=lambda v: v is None)

    def problem(self, rtol: float, atol: float) -> str:
        return self.error or (f"max abs {self.max_abs:.4g}, max rel {self.max_rel:.4g} beyond atol {atol:g} + "
                              f"rtol {rtol:g} * |ref|")


class LayerRow(BaseModel):
    """One tensor both models produce: how far the candidate's is from the reference's."""
    node: str
    op: str
    tensor: str
    cosine: float
    rms_rel: float
    nonfinite: int  # non-finite in the candidate where the reference is finite
    reference_nonfinite: int
    reference_max: float
    drift: float  # 1 - cosine (1 where the candidate turned finite values non-finite)
    added: float  # drift beyond the worst of the node's inputs
    over_fp16: int  # reference values beyond FP16's range
    sentinel: bool = False  # those values are one or two finite constants: a mask or sentinel, not an overflow
    range: list[float] | None = None  # the candidate's quantized range, for a Q/DQ candidate
    clipped: float | None = None  # share of the reference outside that range
    range_use: float | None = None  # the reference's largest |value| over the range's


class Layerwise(BaseModel):
    """Where a candidate goes wrong, node by node (`rows`, in the reference's order: not written to reports)."""
    samples: int
    tensors: int
    bound: float
    first_bad: LayerRow | None  # the first node (in the reference's order) whose output is past the bound
    # the first node whose output is non-finite where the reference's is finite: where a NaN or Inf is made
    first_nonfinite: LayerRow | None = None
    worst: list[LayerRow]  # the nodes adding the most drift over their inputs, the largest first
    overflow: list[LayerRow]  # reference activations beyond FP16's range
    clipping: list[LayerRow]
    sentinels: list[LayerRow] = Field(default_factory=list)  # beyond FP16's range too, but masks or sentinels
    on: str = ""  # the runtime the search ran on
    rows: list[LayerRow] = Field(default_factory=list, exclude=True)
