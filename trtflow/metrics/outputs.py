"""The `metrics:` block of a pipeline: per output, the metrics declared for it (`OutputMetrics`: a field per
built-in metric, by its module's name, and `callable`), and the computations they make."""
from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, create_model

from trtflow.metrics.builtin import BUILT_IN
from trtflow.metrics.contract import BuiltInMetric, Measure
from trtflow.metrics.user import CallableMetric
from trtflow.strict import Strict


class _Declared(Strict):
    def built_in(self) -> dict[str, BuiltInMetric]:
        """The built-in metrics declared: their key here (`topk`) -> their declaration."""
        return {key: spec for key in BUILT_IN if (spec := getattr(self, key)) is not None}

    def declarations(self) -> dict[str, BuiltInMetric | CallableMetric]:
        """Every metric declared, the built-in ones and your function: key -> declaration."""
        mine = {"callable": self.callable} if self.callable is not None else {}
        return {**self.built_in(), **mine}

    def names(self) -> set[str]:
        """The metric names the built-in metrics give and the callable declares (it may return others)."""
        out = {name for spec in self.built_in().values() for name in spec.gives()}
        return out | set(self.callable.directions()) if self.callable else out

    def code_refs(self) -> list[str]:
        """Functions of the user's it names: the metric function, a detections decoder."""
        mine = [self.callable.function] if self.callable else []
        return mine + [ref for spec in self.built_in().values() for ref in spec.code_refs()]


def _doc() -> str:
    gives = "; ".join(f"{key} -> {', '.join(cls.GIVES)}" for key, cls in BUILT_IN.items())
    return ("How one output's users judge it, beside the elementwise metrics. Names each gives (which tolerances "
            f"may bound): {gives}; callable -> the names its function returns.")


OutputMetrics = create_model(
    "OutputMetrics", __base__=_Declared, __doc__=_doc(), __module__=__name__,
    **{key: (cls | None, None) for key, cls in BUILT_IN.items()},
    callable=(CallableMetric | None, Field(None, description=(
        "package.module:function, or {function: package.module:function, higher: [names], lower: [names]}"))))

Metrics = Annotated[dict[str, OutputMetrics], Field(
    default_factory=dict, description="task-level metrics per output name, or '*' for every output",
    examples=[{"logits": {"topk": {"k": 5}}}, {"*": {"ctc": {"blank": 0}}}, {"maps": {"map_iou": {"threshold": 0.3}}}])]


def declared(metrics: dict[str, Any] | None, output: str) -> list[Any]:
    """The `OutputMetrics` entries that apply to `output`: its own and `'*'`."""
    return [m for key, m in (metrics or {}).items() if key in ("*", output)]


def measures(specs: list[Any], what: str, output: str = "*") -> list[Measure]:
    """The computations the `OutputMetrics` entries `specs` declare for `output` (`what`: the stage, for errors)."""
    return [spec.measure(f"{what}: metrics.{output}.{key}") for m in specs for key, spec in m.declarations().items()]
