"""One row per stage kind: everything trtflow knows about a kind, in one place.

A row names the kind's parameter model (`schema.py`), its input slots and outputs (which the stage graph wires),
the module that does its work (a `run` function and a `VERSION`), which environment facts enter its cache key
(a function of its parameters) and which shared caches outside the key it reads and updates. Adding a kind is
one row here and one module in `stages/`. A user's own stage (`kind: package.module:function`) has the row
`USER`, whose slots and outputs come from what the user declared.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from trtflow.pipelines.schema import (
    CUSTOM_KIND,
    BenchmarkStage,
    BuildStage,
    CalibrateStage,
    CustomStage,
    ParityStage,
    PrecisionStage,
    PrepareStage,
    StageBase,
    ValidateStage,
)


@dataclass(frozen=True)
class Slot:
    """An input of a stage kind and where its default comes from."""

    type: str
    many: bool = False
    required: bool = True
    prefer: tuple[str, ...] = ()  # kinds a default is taken from, nearest first; () = no default
    source_ok: bool = False  # fall back to the pipeline's model when no preferred stage exists


ANY_KIND = "*"
MODEL_MAKERS = ("prepare", "precision", "calibrate")

# Environment facts (see flows/fingerprint.py): the TensorRT flavour and version, and the GPUs with their driver.
TENSORRT = ("tensorrt",)
TENSORRT_AND_GPU = ("tensorrt", "gpu")


def _nothing(spec: Any) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Kind:
    name: str
    params: type[StageBase]
    slots: Mapping[str, Slot]
    outputs: Mapping[str, str]  # output name -> artifact type
    module: str | None  # where `run` and `VERSION` live (None for user stages: their own function)
    env: Callable[[Any], tuple[str, ...]] = _nothing  # params -> the environment facts in the key
    shared_caches: Callable[[Any], tuple[str, ...]] = _nothing  # params -> input slots of caches outside the key

    def slots_for(self, spec: StageBase) -> dict[str, Slot]:
        return dict(self.slots)

    def outputs_for(self, spec: StageBase) -> dict[str, str]:
        return dict(self.outputs)


class UserKind(Kind):
    """A user's own function: it declares its outputs; with no inputs declared it gets the previous model."""

    def slots_for(self, spec: StageBase) -> dict[str, Slot]:
        if spec.inputs:
            return {}
        return {"model": Slot("onnx", required=False, prefer=(ANY_KIND,), source_ok=True)}

    def outputs_for(self, spec: StageBase) -> dict[str, str]:
        return dict(spec.outputs)  # type: ignore[attr-defined]


class ValidateKind(Kind):
    """With `repair: true`, validate also publishes the repaired model."""

    def outputs_for(self, spec: StageBase) -> dict[str, str]:
        return {**self.outputs, **({"repaired": "onnx"} if spec.repair else {})}  # type: ignore[attr-defined]


_PREPROCESS = Slot("preprocess", required=False, prefer=("parity",))

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("prepare", PrepareStage,
         slots={"model": Slot("onnx", source_ok=True)},
         outputs={"model": "onnx", "report": "json"},
         module="trtflow.stages.prepare",
         # the pre-flight's verdict depends on the TensorRT parser's version
         env=lambda p: () if p.preflight == "off" else TENSORRT),
    Kind("parity", ParityStage,
         slots={"model": Slot("onnx", required=False, prefer=("prepare",), source_ok=True)},
         outputs={"preprocess": "preprocess", "report": "json"},
         module="trtflow.stages.parity"),
    Kind("precision", PrecisionStage,
         slots={"model": Slot("onnx", prefer=("prepare",), source_ok=True), "preprocess": _PREPROCESS},
         outputs={"model": "onnx", "report": "json"},
         module="trtflow.stages.precision"),
    Kind("calibrate", CalibrateStage,
         slots={"model": Slot("onnx", prefer=("prepare",), source_ok=True), "preprocess": _PREPROCESS},
         outputs={"model": "onnx", "ranges": "ranges", "report": "json"},  # (+ trt_calibration_cache)
         module="trtflow.stages.calibrate"),
    Kind("build", BuildStage,
         slots={"models": Slot("onnx", many=True, prefer=MODEL_MAKERS, source_ok=True)},
         outputs={"engines": "engines", "report": "json"},
         module="trtflow.stages.build",
         env=lambda p: TENSORRT_AND_GPU,
         shared_caches=lambda p: ("timing_cache",) if p.timing_cache else ()),
    ValidateKind("validate", ValidateStage,
         slots={"engines": Slot("engines", required=False, prefer=("build",)),
                "models": Slot("onnx", many=True, required=False, prefer=MODEL_MAKERS),
                "reference": Slot("onnx", prefer=("prepare",), source_ok=True),
                "preprocess": _PREPROCESS},
         outputs={"report": "json"},
         module="trtflow.stages.validate",
         env=lambda p: TENSORRT_AND_GPU),
    Kind("benchmark", BenchmarkStage,
         slots={"engines": Slot("engines", required=False, prefer=("build",)),
                "models": Slot("onnx", many=True, required=False, prefer=MODEL_MAKERS),
                "preprocess": _PREPROCESS},
         outputs={"report": "json"},
         module="trtflow.stages.benchmark",
         env=lambda p: TENSORRT_AND_GPU,
         # the accepted results a `baseline: previous` gate compares with: outside the key, like timing caches
         shared_caches=lambda p: ("baselines",) if p.gate is not None and p.gate.baseline == "previous" else ()),
)}

USER = UserKind("user", CustomStage, slots={}, outputs={}, module=None,
                env=lambda p: TENSORRT_AND_GPU if p.env_dependent else ())


def is_user_kind(kind: str) -> bool:
    return kind not in KINDS and re.match(CUSTOM_KIND, kind) is not None


def kind_named(kind: str) -> Kind | None:
    """The row for a `kind:` value from the YAML; None if it is neither built in nor package.module:function."""
    return KINDS.get(kind) or (USER if is_user_kind(kind) else None)


def kind_of(spec: StageBase) -> Kind:
    return KINDS.get(spec.kind) or USER  # type: ignore[attr-defined]
