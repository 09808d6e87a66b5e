"""Stage `parity`: the deploy-time preprocessing, declared step by step, and the training transforms it must match."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trtflow.pipelines.row import Kind, Slot
from trtflow.pipelines.schema import MAX_SAMPLES, Dim, StageBase
from trtflow.pipelines.units import Fraction
from trtflow.strict import CUSTOM_KIND, Strict

Interp = Literal["nearest", "linear", "cubic", "area", "lanczos"]


class ReadSpec(Strict):
    color: Literal["rgb", "bgr", "gray"] = Field("rgb", description="the channel order the image is decoded to")
    depth: Literal[8, 16] = Field(8, description="bits per channel it is decoded with")


Rounding = Literal["floor", "round", "ceil"]


class ResizeSpec(Strict):
    """A resize to `size`, to a `shorter` side or to a `height` (exactly one of them)."""
    size: list[Dim] | None = Field(None, min_length=2, max_length=2, description="[height, width]")
    shorter: int | None = Field(None, gt=0, description="resize so the shorter side has this length")
    height: int | None = Field(None, gt=0, description="resize to this height, the width keeping the aspect ratio "
                                                      "(text lines)")
    max_width: int | None = Field(None, gt=0, description="with 'height': wider results are squeezed to this width")
    round: Rounding | None = Field(None, description="how the side computed from the aspect ratio is rounded "
                                                     "(default floor, as torchvision; PaddleOCR: ceil)")
    interp: Interp = Field("linear", description="OpenCV's interpolation")
    antialias: bool = Field(False, description="resample as PIL (and torchvision's Resize on PIL images) do when "
                                               "shrinking, pixel for pixel")

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
    """The centre of the image, at `size`."""
    size: int | list[Dim] = Field(description="side, or [height, width]")
    round: Rounding = Field("round", description="how the offset (size - crop) / 2 is rounded (torchvision: round)")

    @model_validator(mode="after")
    def _pair(self) -> "CenterCropSpec":
        if isinstance(self.size, list) and len(self.size) != 2:
            raise ValueError("size: give one side or [height, width]")
        return self


class PadSpec(Strict):
    """Padding to `size`, before or after `layout: chw`."""
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
    """A resize to fit inside `size` keeping the aspect ratio, centred, the rest filled with `pad`."""
    size: list[Dim] = Field(min_length=2, max_length=2, description="[height, width]")
    pad: float = Field(114, description="the fill value")
    interp: Interp = Field("linear", description="OpenCV's interpolation")


class CropSpec(Strict):
    """A fixed window of the image."""
    top: int = Field(ge=0, description="the window's first row")
    left: int = Field(ge=0, description="the window's first column")
    height: int = Field(gt=0, description="its height in pixels")
    width: int = Field(gt=0, description="its width in pixels")


class NormalizeSpec(Strict):
    """(x - mean) / std per channel."""
    mean: list[float] = Field(min_length=1, description="one, or one per channel, on the tensor's scale at that "
                                                        "step")
    std: list[float] = Field(min_length=1, description="one, or one per channel")


def _scale(value: Any) -> float:
    if isinstance(value, str) and "/" in value:
        num, den = value.split("/", 1)
        return float(num) / float(den)
    return float(value)


class PreprocessStep(Strict):
    """One step; exactly one key is set, e.g. ``{resize: {shorter: 256}}``."""
    read: Literal["rgb", "bgr", "gray"] | ReadSpec | None = Field(
        None, description="decode the file (the first step): its colour order, or {color, depth} for 16-bit images")
    resize: ResizeSpec | None = None
    letterbox: LetterboxSpec | None = None
    center_crop: int | list[int] | CenterCropSpec | None = Field(
        None, description="the centre: a side, [height, width], or {size, round}", examples=[224])
    crop: CropSpec | None = None
    pad: PadSpec | None = None
    color: Literal["rgb2bgr", "bgr2rgb", "gray2rgb", "rgb2gray"] | None = Field(
        None, description="convert the channels (OpenCV's cvtColor)")
    dtype: Literal["float32", "float16", "uint8"] | None = Field(None, description="cast the tensor")
    scale: float | str | None = Field(None, description="multiply: a number or a fraction", examples=["1/255"])
    normalize: NormalizeSpec | None = None
    layout: Literal["chw", "hwc"] | None = Field(None, description="the order of the tensor's axes from here on")
    batch: bool | None = Field(None, description="true: add a leading batch dimension of 1")

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
    """What training feeds the model, to compare the deploy steps with: exactly one of these."""
    torchvision: list[str] | None = Field(None, description="torchvision transforms, e.g. 'Resize(256)'")
    callable: str | None = Field(None, pattern=CUSTOM_KIND, description="package.module:function(path) -> array")
    tensors: str | None = Field(None, description="glob of .npy/.npz saved by the training code")

    @model_validator(mode="after")
    def _one_of(self) -> "TrainingRef":
        if sum(x is not None for x in (self.torchvision, self.callable, self.tensors)) != 1:
            raise ValueError("give exactly one of 'torchvision', 'callable' or 'tensors'")
        return self


class ParityTolerances(Strict):
    """How far the deploy tensor may be from the training tensor, per image, and the model's outputs on both."""
    max_abs: float = Field(0.02, ge=0, description="largest absolute difference of an element")
    mean_abs: float = Field(0.005, ge=0, description="largest mean absolute difference")
    min_psnr: float | None = Field(None, description="lowest PSNR in dB")
    top1: Fraction | None = Field(None, description="required top-1 agreement of model outputs, e.g. 99%")


class ParityStage(StageBase):
    kind: Literal["parity"] = Field(description="this section's kind")
    images: str = Field(description="glob of sample images, relative to the pipeline file",
                        examples=["data/*.jpg"])
    deploy: list[PreprocessStep] = Field(min_length=1, description=(
        "the deploy-time preprocessing, step by step, each step one key; written as the `preprocess` output that "
        "the other stages (and a release's Triton preprocessing) run"), examples=[[
            {"read": "rgb"}, {"resize": {"shorter": 256, "antialias": True}}, {"center_crop": 224},
            {"scale": "1/255"}, {"normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}},
            {"layout": "chw"}, {"batch": True}]])
    training: TrainingRef = Field(examples=[{"torchvision": ["Resize(256)", "CenterCrop(224)", "ToTensor()"]},
                                            {"callable": "mypkg.data:preprocess"}])
    tolerances: ParityTolerances = Field(default_factory=ParityTolerances, examples=[{"top1": "100%"}])
    on_mismatch: Literal["error", "warn"] = Field("error", description="outside the tolerances: fail the stage (with "
                                                                       "the likely cause and its fix), or warn")
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
            outputs={"preprocess": "preprocess", "report": "json"},
            # onnx, onnxruntime: the model run on the preprocessed images; OpenCV: the deploy preprocessing;
            # torchvision and Pillow: a training reference declared as torchvision transforms
            libraries=("onnx", "onnxruntime", "opencv-python-headless", "pillow", "torchvision", "scikit-image"),
            preload=("onnxruntime", "cv2"))
