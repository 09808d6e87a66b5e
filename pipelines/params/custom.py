"""A user's own stage (`kind: package.module:function`): its parameters, outputs and version are declared."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from trtflow.names import Name
from trtflow.pipelines.row import ANY_KIND, TENSORRT_AND_GPU, Kind, Slot
from trtflow.pipelines.schema import ARTIFACT_TYPES, StageBase
from trtflow.strict import CUSTOM_KIND


class CustomStage(StageBase):
    kind: str = Field(pattern=CUSTOM_KIND, description="your function, run(params, inputs, out_dir) -> "
                                                       "StageResult", examples=["mypkg.checks:count_nodes"])
    params: dict[str, Any] = Field(default_factory=dict, description="anything your function reads (as "
                                                                     "params.params); part of the stage's key",
                                   examples=[{"threshold": 3}])
    outputs: dict[Name, Literal[ARTIFACT_TYPES]] = Field(  # type: ignore[valid-type]
        default_factory=dict, description="names and types of what the function writes",
        examples=[{"report": "json"}])
    version: str = Field("1", description="bump to invalidate cached results when the function changes")
    env_dependent: bool = Field(False, description="its result depends on the machine: TensorRT's flavour and "
                                                   "version and the GPUs with their driver enter its key")

    def executes(self) -> list[str]:
        return [f"{self.kind} (a function of yours: the stage itself)", *super().executes()]


class UserKind(Kind):
    """A user's own function: it declares its outputs; with no inputs declared it gets the previous model."""

    def slots_for(self, spec: StageBase) -> dict[str, Slot]:
        if spec.inputs:
            return {}
        return {"model": Slot("onnx", required=False, prefer=(ANY_KIND,), source_ok=True)}

    def outputs_for(self, spec: StageBase) -> dict[str, str]:
        return dict(spec.outputs)  # type: ignore[attr-defined]


KIND = UserKind("user", CustomStage, slots={}, outputs={}, module=None,
                env=lambda p: TENSORRT_AND_GPU if p.env_dependent else (), gpu=lambda p: p.env_dependent)
