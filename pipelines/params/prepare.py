"""Stage `prepare`: opset conversion, simplification and the TensorRT pre-flight."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from trtflow.pipelines.row import TENSORRT, Kind, Slot
from trtflow.pipelines.schema import SampleData, Shape, StageBase, yaml_off
from trtflow.strict import CUSTOM_KIND, Strict


class CheckSpec(Strict):
    """How a transformed model (simplified, converted) is compared to the original with ONNX Runtime."""
    samples: int = Field(2, ge=1, le=100, description="random input batches to compare")
    rtol: float = Field(1e-3, ge=0, description="an output element matches where |new - original| <= atol + rtol "
                                                "x |original|")
    atol: float = Field(1e-4, ge=0, description="the absolute part of that bound")
    seed: int = Field(0, description="seed of the random inputs")
    data: SampleData | None = Field(
        None, description="the inputs to compare on: tensors, or random with shapes and ranges (default: random, "
                          "`samples` of them, shaped by input_shapes)")

    @model_validator(mode="after")
    def _no_images(self) -> "CheckSpec":
        if self.data is not None and self.data.images is not None:
            raise ValueError("data.images needs the parity stage's preprocessing, which comes after prepare: "
                             "give data.tensors, or random data with ranges")
        return self


class PrepareStage(StageBase):
    kind: Literal["prepare"] = Field(description="this section's kind")
    target_opset: int | None = Field(None, ge=1, le=30,
                                     description="convert the default-domain opset to this version")
    simplify: bool = Field(True, description="run onnxsim (constant folding, dead-code removal)")
    check: CheckSpec = Field(default_factory=CheckSpec)
    input_shapes: dict[str, Shape] = Field(
        default_factory=dict,
        description="concrete shapes for the checks and the trial build where an input has dynamic dimensions "
                    "(otherwise 1 for axis 0 and 64 elsewhere)", examples=[{"input": [1, 3, 224, 224]}])
    preflight: Annotated[Literal["auto", "required", "off"], BeforeValidator(yaml_off)] = Field(
        "auto", description="parse with the installed TensorRT flavour's ONNX parser: auto: when a flavour is "
                            "installed (the report says when it did not run); required: fail without one; off: never")
    fail_on_unsupported: bool = Field(True, description="fail the stage when the TensorRT pre-flight "
                                                        "finds nodes it cannot parse, or the trial build fails")
    trial_build: bool = Field(True, description="the pre-flight also builds an engine at input_shapes (parsing "
                                                "is not building)")
    rewrites: Literal["auto", "none"] | list[Annotated[str, Field(pattern=CUSTOM_KIND)]] = Field(
        "auto", description="replace nodes TensorRT's parser refuses with nodes it takes, each checked on ONNX "
                            "Runtime and by the parser before it is kept: auto: trtflow's rules; none: never; a "
                            "list of your functions (package.module:function, an onnx.ModelProto in and out), "
                            "applied first and checked the same way, then trtflow's rules",
        examples=["auto", ["mymodels.fix:drop_nms"]])
    offload: Literal["none", "onnxruntime"] = Field(
        "none", description="what runs the nodes TensorRT still refuses after rewrites and plugins: none: the stage "
                            "fails naming them; onnxruntime: the model is cut at the parser's partition, each "
                            "TensorRT piece proved by a trial build, and ONNX Runtime runs the rest in FP32 "
                            "(validate and benchmark run the chain; the release serves it as a Triton ensemble)")

    def code_refs(self) -> list[str]:
        return list(self.rewrites) if isinstance(self.rewrites, list) else []

    def data_globs(self) -> dict[str, tuple[str, tuple]]:
        data = self.check.data
        return {} if data is None or not data.tensors else {"tensors": (data.tensors, ("check", "data", "tensors"))}


KIND = Kind("prepare", PrepareStage,
            slots={"model": Slot("onnx", source_ok=True)},
            outputs={"model": "onnx", "report": "json"},
            libraries=("onnx", "onnxruntime", "onnxsim", "opencv-python-headless"),
            preload=("onnxsim", "onnxruntime", "cv2"),
            # the pre-flight's verdict depends on the TensorRT parser's version
            env=lambda p: () if p.preflight == "off" else TENSORRT,
            gpu=lambda p: p.preflight != "off",  # the trial build, on the GPU where there is one
            keeps_input_names=True)
