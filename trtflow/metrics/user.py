"""Your own metric function, named in a pipeline (`callable:`): its declaration and its computation."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from pydantic import Field, model_serializer, model_validator

from trtflow.errors import StageError
from trtflow.metrics.contract import Sample
from trtflow.metrics.names import metric_direction
from trtflow.strict import CUSTOM_KIND, Strict


class CallableMetric(Strict):
    """The user's metric function, and which of the names it returns are better higher or lower (what
    `select.max_accuracy_drop` needs to weigh them; a tolerance's {min: x} / {max: x} says it too). Written as
    the function alone (`callable: pkg.mod:fn`) or with its directions (`callable: {function: pkg.mod:fn,
    higher: [face_iou], lower: [miss_rate]}`)."""
    function: str = Field(pattern=CUSTOM_KIND, description="package.module:function(reference, candidate) -> "
                                                           "{name: value}, called per batch of one output; each "
                                                           "value's mean is reported")
    higher: list[str] = Field(default_factory=list, description="names it returns that are better higher: shares "
                                                                "in [0, 1] such as an IoU or an agreement")
    lower: list[str] = Field(default_factory=list, description="names it returns that are better lower: errors, in "
                                                               "the output's units or any (shown as values, not "
                                                               "weighed as a share by select.max_accuracy_drop: "
                                                               "bound them with {max: x})")

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, data: Any) -> Any:
        return {"function": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _consistent(self) -> "CallableMetric":
        both = sorted(set(self.higher) & set(self.lower))
        if both:
            raise ValueError(f"{', '.join(both)}: both in higher and lower")
        for name in self.higher + self.lower:
            own = metric_direction(name)
            if own is not None and own != (name in self.higher):
                raise ValueError(f"{name}: trtflow's own metric, {'higher' if own else 'lower'} is better; name "
                                 f"your function's metric otherwise")
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: Any) -> Any:
        # the plain form stays a string: a pipeline that declares no directions keeps its cache keys
        return self.function if not self.higher and not self.lower else handler(self)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        return {"anyOf": [{"type": "string", "pattern": CUSTOM_KIND}, handler(core_schema)]}

    def directions(self) -> dict[str, bool]:
        return {**{n: True for n in self.higher}, **{n: False for n in self.lower}}

    def measure(self, where: str) -> UserMetric:
        from trtflow.usercode import import_callable

        return UserMetric(import_callable(self.function, where, 2), self.function)


class UserMetric:
    """The user's `package.module:function(reference, candidate) -> {name: value}`, called per batch; each name's
    mean over batches."""

    def __init__(self, func: Callable[[np.ndarray, np.ndarray], dict[str, Any]], ref: str) -> None:
        self.func, self.ref = func, ref
        self.sums: dict[str, float] = {}
        self.calls = 0

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        try:
            values = self.func(ref, got)
        except Exception as exc:  # the user's code: one line naming it, not a traceback from inside trtflow
            raise StageError(f"metric '{self.ref}' raised {type(exc).__name__}: {exc}") from None
        if not isinstance(values, dict):
            raise TypeError(f"metric '{self.ref}' returned {type(values).__name__}, not {{name: value}}")
        self.calls += 1
        for name, value in values.items():
            self.sums[str(name)] = self.sums.get(str(name), 0.0) + float(value)

    def result(self) -> dict[str, float]:
        return {name: total / self.calls for name, total in self.sums.items()} if self.calls else {}
