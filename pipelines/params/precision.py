"""Stage `precision`: FP16 (or BF16) mixed precision, with automatic FP32 fallback."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from trtflow.metrics.outputs import Metrics
from trtflow.pipelines.row import PREPROCESS_SLOT, REFERENCE_CACHE, TENSORRT, Kind, Slot
from trtflow.pipelines.schema import MAX_SAMPLES, SampleData, StageBase, yaml_off
from trtflow.strict import Strict


class FallbackSpec(Strict):
    auto: bool = Field(True, description="keep nodes in FP32 whose activations overflow or lose accuracy")
    data_max: float = Field(512.0, gt=0, description="keep a node FP32 if |activation| exceeds this")
    init_max: float = Field(65504.0, gt=0, description="keep a node FP32 if a weight exceeds this")
    max_rel_error: float | None = Field(None, gt=0, description="keep a node FP32 if its FP16 error is larger")


class PrecisionStage(StageBase):
    kind: Literal["precision"] = Field(description="this section's kind")
    to: Literal["fp16", "bf16"] = Field("fp16", description="the lower precision the variant computes in")
    keep_io_types: bool = Field(True, description="keep the model's inputs and outputs in FP32 (Casts at the edges)")
    fallback: FallbackSpec = Field(default_factory=FallbackSpec, description="which nodes stay in FP32 besides "
                                                                             "block_ops and block_nodes")
    block_ops: list[str] = Field(default_factory=list, description="op types kept in FP32",
                                 examples=[["Softmax", "LayerNormalization"]])
    block_nodes: list[str] = Field(default_factory=list, description="nodes kept in FP32, each a regular "
                                                                     "expression matching whole node names "
                                                                     "(Python's re.fullmatch: '.*Log.*' for every "
                                                                     "name containing Log); a pattern matching "
                                                                     "nothing is an error",
                                   examples=[["/head/.*"]])
    data: SampleData = Field(default_factory=lambda: SampleData(random=True), description=(
        "the samples whose activations decide the fallback; the last `holdout` of them are the pre-flight's"))
    holdout: int = Field(8, ge=0, le=MAX_SAMPLES, description="samples for the CPU accuracy pre-flight")
    metrics: Metrics  # the pre-flight judges these too (validate's defaults for FP16); share validate's with an anchor
    preflight: Annotated[Literal["auto", "off"], BeforeValidator(yaml_off)] = Field(
        "auto", description="trial-build the FP16 variant with TensorRT (auto = when a TensorRT flavour is "
                            "installed) at a profile over the held-out samples' shapes, halved on dynamic "
                            "dimensions; a variant that does not build where the FP32 model does fails the stage")


KIND = Kind("precision", PrecisionStage,
            slots={"model": Slot("onnx", prefer=("prepare",), source_ok=True), "preprocess": PREPROCESS_SLOT},
            outputs={"model": "onnx", "report": "json"},
            libraries=("onnx", "onnxruntime", "opencv-python-headless", "scikit-image"),
            preload=("onnxruntime", "cv2"),
            shared_caches=lambda p: (REFERENCE_CACHE,),
            env=lambda p: () if p.preflight == "off" else TENSORRT,  # the trial build's verdict
            gpu=lambda p: p.preflight != "off",
            keeps_input_names=True)
