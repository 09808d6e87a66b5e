"""Stage `parity`: the deploy-time preprocessing, declared step by step, and the training transforms it must match."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trtflow.pipelines.row import Kind, Slot
from trtflow.pipelines.schema import CUSTOM_KIND, MAX_SAMPLES, Dim, StageBase, Strict
from trtflow.pipelines.units import Fraction

Interp = Literal["nearest", "linear", "cubic", "area", "lanczos"]


class ReadSpec(Strict):
    color: Literal["rgb", "bgr", "gray"] = "rgb"
    depth: Literal[8, 16] = 8


Rounding = Literal["floor", "round", "ceil"]


class ResizeSpec(Strict):
    size: list[Dim] | None = Field(None, min_length=2, max_length=2, description="[height, width]")
    shorter: int | None = Field(None, gt=0, description="resize so the shorter side has this length")
    height: int | None = Field(None, gt=0, description="resize to this height, the width keeping the aspect ratio "
                                                      "(text lines)")
    max_width: int | None = Field(None, gt=0, description="with 'height': wider results are squeezed to this width")
    round: Rounding | None = Field(None, description="how the side computed from the aspect ratio is rounded "
                                                     "(default floor, as torchvision; PaddleOCR: ceil)")
    interp: Interp = "linear"
    antialias: bool = False

    @model_validator(mode="after")
    def _one_of(self) -> "ResizeSpec":
        if sum(x is not None for x in (self.size, self.shorter, self.height)) != 1:
            raise ValueError("give exactly one of 'size', 'shorter' or 'height'")
        if self.max_width is not None and self.height is None:
            raise ValueError("'max_width' goes with 'height'")
        if self.round is not None and self.size is not None:
            raise ValueError("'round' applies to 'shorter' or 'height', not to 'size'")
        return self


class CenterCropSpec(Strict):
    size: int | list[Dim] = Field(description="side, or [height, width]")
    round: Rounding = Field("round", description="how the offset (size - crop) / 2 is rounded (torchvision: round)")

    @model_validator(mode="after")
    def _pair(self) -> "CenterCropSpec":
        if isinstance(self.size, list) and len(self.size) != 2:
            raise ValueError("size: give one side or [height, width]")
        return self


class PadSpec(Strict):
    size: list[Dim] | Literal["square"] = Field(
        description="[height, width], or square: the longer side (a detector padding to a square before its resize)")
    value: float | list[float] = Field(0.0, description="on the tensor's scale at that step (one, or per channel)")
    place: Literal["top_left", "center", "bottom_right"] = Field(
        "top_left", description="where the image sits: top_left pads on the right and at the bottom (PaddleOCR, "
                                "NudeNet), center on every side (the odd pixel at the bottom and right), "
                                "bottom_right on the left and at the top")

    @field_validator("size")
    @classmethod
    def _two(cls, v: Any) -> Any:
        if isinstance(v, list) and len(v) != 2:
            raise ValueError("size: give [height, width] or square")
        return v


class LetterboxSpec(Strict):
    size: list[Dim] = Field(min_length=2, max_length=2, description="[height, width]")
    pad: float = 114
    interp: Interp = "linear"


class CropSpec(Strict):
    top: int = Field(ge=0)
    left: int = Field(ge=0)
    height: int = Field(gt=0)
    width: int = Field(gt=0)


class NormalizeSpec(Strict):
    mean: list[float] = Field(min_length=1)
    std: list[float] = Field(min_length=1)


def _scale(value: Any) -> float:
    if isinstance(value, str) and "/" in value:
        num, den = value.split("/", 1)
        return float(num) / float(den)
    return float(value)


class PreprocessStep(Strict):
    """One step; exactly one key is set, e.g. ``{resize: {shorter: 256}}``."""
    read: Literal["rgb", "bgr", "gray"] | ReadSpec | None = None
    resize: ResizeSpec | None = None
    letterbox: LetterboxSpec | None = None
    center_crop: int | list[int] | CenterCropSpec | None = None
    crop: CropSpec | None = None
    pad: PadSpec | None = None
    color: Literal["rgb2bgr", "bgr2rgb", "gray2rgb", "rgb2gray"] | None = None
    dtype: Literal["float32", "float16", "uint8"] | None = None
    scale: float | str | None = Field(None, description="multiply, e.g. 1/255")
    normalize: NormalizeSpec | None = None
    layout: Literal["chw", "hwc"] | None = None
    batch: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "PreprocessStep":
        set_keys = [k for k in type(self).model_fields if getattr(self, k) is not None]
        if len(set_keys) != 1:
            raise ValueError("each preprocessing step has exactly one key, e.g. {resize: {shorter: 256}}")
        if self.scale is not None:
            try:
                _scale(self.scale)
            except (ValueError, ZeroDivisionError):
                raise ValueError(f"invalid scale {self.scale!r} (expected a number or a fraction like 1/255)")
        return self


class TrainingRef(Strict):
    torchvision: list[str] | None = Field(None, description="torchvision transforms, e.g. 'Resize(256)'")
    callable: str | None = Field(None, pattern=CUSTOM_KIND, description="package.module:function(path) -> array")
    tensors: str | None = Field(None, description="glob of .npy/.npz saved by the training code")

    @model_validator(mode="after")
    def _one_of(self) -> "TrainingRef":
        if sum(x is not None for x in (self.torchvision, self.callable, self.tensors)) != 1:
            raise ValueError("give exactly one of 'torchvision', 'callable' or 'tensors'")
        return self


class ParityTolerances(Strict):
    max_abs: float = Field(0.02, ge=0)
    mean_abs: float = Field(0.005, ge=0)
    min_psnr: float | None = Field(None, description="dB")
    top1: Fraction | None = Field(None, description="required top-1 agreement of model outputs, e.g. 99%")


class ParityStage(StageBase):
    kind: Literal["parity"]
    images: str = Field(description="glob of sample images, relative to the pipeline file")
    deploy: list[PreprocessStep] = Field(min_length=1)
    training: TrainingRef
    tolerances: ParityTolerances = Field(default_factory=ParityTolerances)
    on_mismatch: Literal["error", "warn"] = "error"
    max_images: int = Field(64, ge=1, le=MAX_SAMPLES,
                            description="compare at most this many of the matched images")

    def data_globs(self) -> dict[str, tuple[str, tuple]]:
        globs = {"images": (self.images, ("images",))}
        if self.training.tensors:
            globs["training_tensors"] = (self.training.tensors, ("training", "tensors"))
        return globs

    def code_refs(self) -> list[str]:
        return [self.training.callable] if self.training.callable else []


KIND = Kind("parity", ParityStage,
            slots={"model": Slot("onnx", required=False, prefer=("prepare",), source_ok=True)},
            outputs={"preprocess": "preprocess", "report": "json"})
