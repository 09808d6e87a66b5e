"""Stage `build`: one TensorRT engine per model variant x optimization profile x target, and the builder's options."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trtflow.names import Name
from trtflow.pipelines.row import MODEL_MAKERS, TENSORRT_AND_GPU, Kind, SharedArea, Slot
from trtflow.pipelines.schema import BuilderOptions, Shape, StageBase
from trtflow.strict import Strict


class ShapeRange(Strict):
    """One input's shapes in a profile: min <= opt <= max in every dimension, one rank."""
    min: Shape = Field(description="the smallest shape the engine takes")
    opt: Shape = Field(description="the shape TensorRT tunes its kernels for")
    max: Shape = Field(description="the largest shape the engine takes")

    @model_validator(mode="after")
    def _ordered(self) -> "ShapeRange":
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError("min, opt and max must have the same rank")
        for i, (a, b, c) in enumerate(zip(self.min, self.opt, self.max)):
            if not a <= b <= c:
                raise ValueError(f"dimension {i}: need min <= opt <= max, got {a}, {b}, {c}")
        return self


class BuildStage(StageBase, BuilderOptions):
    kind: Literal["build"] = Field(description="this section's kind")
    backend: Literal["auto", "tensorrt", "tensorrt-rtx"] = Field(
        "auto", description="the TensorRT flavour that builds: auto prefers full TensorRT")
    profiles: dict[Name, dict[str, ShapeRange]] = Field(
        default_factory=dict, description="named optimization profiles: {name: {input: {min, opt, max}}}; every "
                                          "dynamic dimension of every model needs one (checked before building)",
        examples=[{"bs1": {"input": {"min": [1, 3, 224, 224], "opt": [1, 3, 224, 224], "max": [1, 3, 224, 224]}},
                   "dynamic": {"input": {"min": [1, 3, 224, 224], "opt": [8, 3, 224, 224],
                                         "max": [32, 3, 224, 224]}}}])
    profile_mode: Literal["separate", "combined"] = Field(
        "separate", description="one engine per profile, or all profiles in one engine")
    targets: list[Name] = Field(default_factory=lambda: ["native"],
                               description="'native', or compute capabilities for TensorRT-RTX (sm86, sm89, ...)",
                               examples=[["sm86", "sm89"]])
    timing_cache: bool = Field(True, description="keep the builder's timing cache in the store's shared/ and reuse "
                                                 "it in later builds (no part of any key)")
    engine_cache: bool = Field(True, description="take a cell's engine from the store's engine cache when nothing it "
                                                 "depends on changed (model, profiles, target, TensorRT, options, "
                                                 "GPU and driver): a changed variant rebuilds only its own engines")
    parallel: int = Field(2, ge=1, le=64, description="engines built at a time, each in a process of its own")
    log_severity: Literal["error", "warning", "info", "verbose"] = Field(
        "warning", description="the least severe TensorRT message kept in each engine's build.log")

    def named_model_inputs(self) -> list[tuple[str, tuple]]:
        return [(name, ("profiles", pname, name)) for pname, shapes in self.profiles.items() for name in shapes]

    def builder_options(self) -> BuilderOptions:
        return BuilderOptions.model_validate(self.model_dump(include=set(BuilderOptions.model_fields)))


TIMING_CACHES = SharedArea("timing-", 1 << 30)  # a TensorRT timing cache per flavour and version, on every machine

KIND = Kind("build", BuildStage,
            slots={"models": Slot("onnx", many=True, prefer=MODEL_MAKERS, source_ok=True)},
            outputs={"engines": "engines", "report": "json"},
            libraries=("onnx", "onnxruntime"),
            preload=("onnxruntime",),
            env=lambda p: TENSORRT_AND_GPU,
            gpu=lambda p: True,
            shared_caches=lambda p: (("timing_cache",) if p.timing_cache else ())
            + (("engine_cache",) if p.engine_cache else ()),
            result_caches=("engine_cache",),  # --force builds every engine again
            shared=(TIMING_CACHES,))
