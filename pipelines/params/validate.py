"""Stage `validate`: every engine (or model variant) against the FP32 reference, with repair."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from trtflow.pipelines.row import MODEL_MAKERS, PREPROCESS_SLOT, TENSORRT_AND_GPU, Kind, Slot
from trtflow.pipelines.schema import SampleData, StageBase, Strict
from trtflow.pipelines.units import Fraction


class OutputTolerance(Strict):
    """Bounds on one output's metrics against the FP32 reference (validate: defaults per precision in the README)."""
    cosine: float | None = Field(None, ge=-1, le=1, description="lowest cosine similarity")
    max_abs: float | None = Field(None, ge=0, description="largest absolute error")
    mean_abs: float | None = Field(None, ge=0, description="largest mean absolute error")
    rtol: float | None = Field(None, ge=0, description="largest relative error (report: max_rel), over elements of "
                                                      "at least 1/1000 of the output's largest magnitude")
    top1: Fraction | None = Field(None, description="lowest share of samples whose top-1 class agrees")
    top5: Fraction | None = Field(None, description="lowest share whose reference class is in the top 5")


class ValidateStage(StageBase):
    kind: Literal["validate"]
    data: SampleData = Field(default_factory=lambda: SampleData(random=True))
    runtime: Literal["auto", "onnxruntime", "tensorrt"] = Field(
        "auto", description="auto: TensorRT where a GPU can run the engine, else the variant simulated on ONNX "
                            "Runtime")
    profile_shapes: list[Literal["min", "opt", "max"]] = Field(
        default_factory=lambda: ["min", "opt", "max"], min_length=1,
        description="for random data, the shapes of each profile to check at")
    tolerances: dict[str, OutputTolerance] = Field(
        default_factory=dict, description="per output name, or '*' for all outputs")
    check_nan_inf: bool = True
    locate_first_bad_layer: bool = True
    locate_samples: int = Field(2, ge=1, le=100, description="when a candidate fails: how many samples (those whose "
                                "outputs are off the most) are compared tensor by tensor")
    repair: bool = Field(False, description="search for the nodes to keep in FP32 / leave unquantized so a "
                                            "failing FP16 / INT8 candidate passes")
    repair_rounds: int = Field(8, ge=1, le=64, description="at most this many rebuild-and-check rounds")
    repair_variant: str | None = Field(None, description="the precision/calibrate stage whose variant is repaired and "
                                                         "published as output 'repaired' (default: the only one)")


KIND = Kind("validate", ValidateStage,
            slots={"engines": Slot("engines", required=False, prefer=("build",)),
                   "models": Slot("onnx", many=True, required=False, prefer=MODEL_MAKERS),
                   "reference": Slot("onnx", prefer=("prepare",), source_ok=True),
                   "preprocess": PREPROCESS_SLOT},
            outputs={"report": "json"},
            more_outputs=lambda p: {"repaired": "onnx"} if p.repair else {},
            env=lambda p: TENSORRT_AND_GPU)
