"""Stage `calibrate`: INT8 explicit quantization (Q/DQ) from calibration data."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from trtflow.pipelines.row import PREPROCESS_SLOT, Kind, Slot
from trtflow.pipelines.schema import MAX_SAMPLES, SampleData, StageBase


class CalibrateStage(StageBase):
    kind: Literal["calibrate"]
    data: SampleData
    method: Literal["entropy", "percentile", "minmax"] = "entropy"
    percentile: float = Field(99.99, gt=0, le=100)
    entropy_floor: float | None = Field(
        99.99, gt=0, le=100, description="method: entropy never clips below this percentile of |x| (TensorRT's KL "
                                         "rule alone clips heavy-tailed early activations to a few % of their "
                                         "range); null: TensorRT's rule as it is")
    entropy_check: bool = Field(
        True, description="method: entropy also quantizes at the full ranges and keeps whichever tracks the FP32 "
                          "model better on (up to 8 of) the calibration samples, never the held-out ones")
    min_samples: int = Field(1, ge=1, le=MAX_SAMPLES)
    on_too_few: Literal["error", "warn"] = "error"
    quantize_ops: list[str] = Field(default_factory=lambda: ["Conv", "ConvTranspose", "Gemm", "MatMul"])
    exclude_ops: list[str] = Field(default_factory=list)
    exclude_nodes: list[str] = Field(default_factory=list)
    per_channel: bool = True
    min_weight_params: int = Field(
        0, ge=0, description="leave ops with fewer weight parameters in float: on TensorRT-RTX each quantized op "
                             "adds a kernel of ~150 KB to the engine, which saves 3 bytes per weight (48000 "
                             "makes MobileNet-style INT8 engines smaller than FP32)")
    holdout: int = Field(8, ge=0, le=MAX_SAMPLES)
    trt_calibration_cache: bool = Field(False, description="also write a TensorRT <= 10 calibration cache")


KIND = Kind("calibrate", CalibrateStage,
            slots={"model": Slot("onnx", prefer=("prepare",), source_ok=True), "preprocess": PREPROCESS_SLOT},
            outputs={"model": "onnx", "ranges": "ranges", "report": "json"},  # (+ trt_calibration_cache)
            keeps_input_names=True)
