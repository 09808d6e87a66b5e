"""What a built-in metric module holds (`builtin/<key>.py`): `METRIC`, its declaration's class, a `BuiltInMetric`
whose fields are the metric's parameters, whose `GIVES` says every name it may give and how each is read, and whose
`measure` makes its computation, a `Measure`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from trtflow.strict import Strict


@dataclass(frozen=True)
class Sample:
    """One comparison step: the inputs fed, and every output of the reference and of the candidate by name (a
    metric of one output may need the others: a detector's scores and boxes in separate outputs)."""
    feed: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    candidate: dict[str, np.ndarray]


def per_precision(fp32: float, fp16: float, int8: float) -> dict[str, float]:
    return {"fp32": fp32, "fp16": fp16, "int8": int8}


@dataclass(frozen=True)
class Gives:
    """A metric name, and how it is read: better `higher` or lower; `weighed`: a share the release's
    max_accuracy_drop weighs (not the worst item's value, which moves in steps of one item, nor decibels or an error
    in the output's units); `bounds`: validate's default bound per precision where the metric is declared;
    `example`: the declaration that gives it, for a hint."""
    higher: bool
    weighed: bool = True
    bounds: dict[str, float] | None = None
    example: str = ""


class Measure(Protocol):
    """A metric's computation: folds in one batch of one output at a time (arrays batch first, and the `Sample`
    they came from), and gives its named values."""

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None: ...

    def result(self) -> dict[str, float]: ...


class BuiltInMetric(Strict):
    """A built-in metric's declaration: what it gives (`GIVES`, every name it may give; `gives()`, those this
    declaration gives; `REPORTS`, what its computation reports beside them: counts, no bound) and its computation
    (`measure(where)`, `where` the declaration's key path for errors: "validate: metrics.y.topk")."""
    GIVES: ClassVar[dict[str, Gives]] = {}
    REPORTS: ClassVar[tuple[str, ...]] = ()

    def gives(self) -> dict[str, Gives]:
        return dict(self.GIVES)

    def default_bounds(self, precision: str) -> dict[str, tuple[float, bool]]:
        """validate's default bounds on what this declaration gives, for a precision: name -> (bound, whether the
        metric must be at least the bound)."""
        return {n: (g.bounds[precision], g.higher) for n, g in self.gives().items() if g.bounds is not None}

    def code_refs(self) -> list[str]:
        """Functions of the user's it names (`package.module:function`): they enter the key of what reads it."""
        return []

    def measure(self, where: str) -> Measure:
        raise NotImplementedError(f"{type(self).__name__} has no computation")
