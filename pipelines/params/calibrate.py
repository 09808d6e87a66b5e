"""Stage `calibrate`: INT8 explicit quantization (Q/DQ) from calibration data."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from trtflow.metrics.outputs import Metrics
from trtflow.pipelines.row import PREPROCESS_SLOT, REFERENCE_CACHE, TENSORRT, Kind, Slot
from trtflow.pipelines.schema import MAX_SAMPLES, SampleData, StageBase


class CalibrateStage(StageBase):
    kind: Literal["calibrate"] = Field(description="this section's kind")
    data: SampleData = Field(description="the calibration samples (hundreds for a real model); the last `holdout` "
                                         "are kept for the INT8 pre-flight",
                             examples=[{"images": "data/*.jpg", "samples": 256}])
    method: Literal["entropy", "percentile", "minmax"] = Field(
        "percentile", description="how each activation's range is chosen: percentile (that percentile of |x|), "
                                  "entropy (TensorRT's KL rule, floored at entropy_floor), minmax (the largest |x|). "
                                  "with the range check (entropy_check), percentile 99.999 was at least as good as "
                                  "ModelOpt's entropy and max on six trained models (bench/int8.py)")
    percentile: float = Field(99.999, gt=0, le=100, description="method: percentile clips each activation at this "
                                                                "percentile of |x|")
    entropy_floor: float | None = Field(
        99.99, gt=0, le=100, description="method: entropy never clips below this percentile of |x| (TensorRT's KL "
                                         "rule alone clips heavy-tailed early activations to a few % of their "
                                         "range); null: TensorRT's rule as it is")
    entropy_check: bool = Field(
        True, description="method: entropy or percentile also quantizes with the other histogram rule and at the "
                          "full ranges, and keeps whichever stays closest to the FP32 model (mean relative error) on "
                          "(up to 8 of) the calibration samples, never the held-out ones; the method on a tie")
    bias_correction: bool = Field(
        True, description="shift each quantized node's float bias by the mean error its INT8 rounding causes per "
                          "output channel, measured on (up to 32 of) the calibration samples (empirical bias "
                          "correction; ModelOpt does not): activations piled up near a point, as after SiLU, round "
                          "with a bias that convolutions sum into a shift of every output")
    min_samples: int = Field(1, ge=1, le=MAX_SAMPLES, description="fewer calibration samples than this is an error "
                                                                  "(see on_too_few)")
    on_too_few: Literal["error", "warn"] = Field("error", description="fewer samples than min_samples: fail the "
                                                                      "stage, or warn and go on")
    quantize_ops: list[str] = Field(default_factory=lambda: ["Conv", "ConvTranspose", "Gemm", "MatMul"],
                                    description="op types quantized")
    exclude_ops: list[str] = Field(default_factory=list, description="op types left in float")
    exclude_nodes: list[str] = Field(default_factory=list, description="node names left in float (what validate's "
                                                                       "repair proposes)")
    per_channel: bool = Field(True, description="weights quantized per output channel (per tensor when false)")
    quantize_outputs: bool = Field(
        False, description="also put Q/DQ on the outputs of the quantized ops (trtflow before calibrate VERSION 5); "
                           "by default only their inputs are quantized, as ModelOpt does for TensorRT")
    float_attention: bool = Field(
        True, description="leave MatMuls between two activations (attention's QK^T and probabilities x V) in float, "
                          "as ModelOpt does")
    float_small_ops: bool = Field(
        True, description="leave Convs with fewer than 16 channels in shapes TensorRT's INT8 kernels do not take, "
                          "and Gemm/MatMul layers with fewer than 16 outputs, in float, as ModelOpt does")
    float_depthwise: bool = Field(
        True, description="leave depthwise Convs (grouped, input channels per group not a multiple of 4) in float: "
                          "TensorRT-RTX zero-pads each INT8 group to 4 channels and stores the zeros in engines of "
                          "static shapes (3 bytes per input value); false quantizes them, as ModelOpt does")
    min_weight_params: int = Field(
        0, ge=0, description="leave ops with fewer weight parameters in float: on TensorRT-RTX each quantized op "
                             "adds up to one JIT kernel whose CUDA source (~130 KB) the engine carries, and saves 3 "
                             "bytes per weight (break-even ~44K parameters)")
    remainder: Literal["fp16", "fp32"] = Field(
        "fp16", description="the precision of what is not quantized (activations, resizes, heads, the ops left in "
                            "float): TensorRT builds Q/DQ graphs strongly typed, so an FP32 remainder runs in FP32 on "
                            "the GPU. fp16 converts it as ModelOpt's PTQ does by default (opset 19 for FP16 Q/DQ "
                            "scales), keeping in FP32 the nodes the precision stage's fallback rules keep "
                            "(|activation| > 512 on up to 8 calibration samples, constants FP16 turns to 0); on six "
                            "trained models at least as accurate as ModelOpt's default (bench/int8.py)")
    holdout: int = Field(8, ge=0, le=MAX_SAMPLES, description="the last samples of `data`, kept out of the "
                                                              "calibration for the CPU accuracy pre-flight")
    trt_calibration_cache: bool = Field(False, description="also write a TensorRT <= 10 calibration cache")
    metrics: Metrics  # the INT8 pre-flight judges these too (validate's defaults for INT8)


KIND = Kind("calibrate", CalibrateStage,
            slots={"model": Slot("onnx", prefer=("prepare",), source_ok=True), "preprocess": PREPROCESS_SLOT},
            outputs={"model": "onnx", "ranges": "ranges", "report": "json"},  # (+ trt_calibration_cache)
            libraries=("onnx", "onnxruntime", "opencv-python-headless", "scikit-image"),
            preload=("onnxruntime", "onnxruntime.quantization", "cv2"),
            shared_caches=lambda p: (REFERENCE_CACHE,),
            env=lambda p: TENSORRT if p.trt_calibration_cache else (),  # the cache's header names TensorRT's version
            keeps_input_names=True)
