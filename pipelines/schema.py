"""Pydantic models of the pipeline YAML: one model per stage kind.

Fields that only steer execution (retries, timeout, description, inputs) live on ``StageBase``;
everything else a stage model declares is a parameter of the stage's work and enters its cache key.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from trtflow.pipelines.units import Duration, Fraction, Size

STAGE_NAME = r"^[A-Za-z_][A-Za-z0-9_-]*$"
CUSTOM_KIND = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"  # package.module:function
ARTIFACT_TYPES = ("onnx", "preprocess", "ranges", "engines", "json", "file", "dir")

Ref = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)?$",
                           description="'stage' or 'stage.output', or 'source' for the pipeline's model")]


MAX_SAMPLES = 10_000  # calibration wants hundreds; more only costs time and memory
MAX_ELEMENTS = 2**31  # per tensor: 8 GiB of float32


def _bounded_shape(dims: list[int]) -> list[int]:
    count = 1
    for d in dims:
        count *= d
    if count > MAX_ELEMENTS:
        raise ValueError(f"shape {dims} has {count:.3g} elements, more than {MAX_ELEMENTS:.3g}")
    return dims


Dim = Annotated[int, Field(ge=1, description="a dimension (at least 1)")]
Shape = Annotated[list[Dim], Field(max_length=16), AfterValidator(_bounded_shape)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StageBase(Strict):
    description: str | None = None
    inputs: dict[str, Ref | list[Ref]] = Field(
        default_factory=dict,
        description="Which earlier outputs this stage consumes, per input slot. Omitted slots get a default: "
                    "the prepared model, the nearest parity preprocessing, the nearest build's engines.")
    retries: int = Field(0, ge=0, le=20, description="Prefect task retries")
    retry_delay: Duration = Field(0.0, description="Seconds (or '30s', '2m') between retries")
    timeout: Duration | None = Field(None, description="Fail the stage after this long ('30m')")

    EXECUTION_FIELDS: ClassVar[frozenset[str]] = frozenset({"description", "inputs", "retries", "retry_delay",
                                                            "timeout"})

    def data_globs(self) -> dict[str, tuple[str, tuple]]:
        """Files this stage reads that a parameter names by glob: input slot -> (glob, key path)."""
        data = getattr(self, "data", None)
        if isinstance(data, SampleData):
            return {k: (v, ("data", k)) for k in ("images", "tensors") if (v := getattr(data, k))}
        return {}

    def code_refs(self) -> list[str]:
        """User callables (package.module:function) named in the parameters."""
        return []

    def executes(self) -> list[str]:
        """Code outside trtflow that this stage runs: a pipeline file is code, and this is what a reviewer reads."""
        return [f"{ref} (a function of yours)" for ref in self.code_refs() if not ref.startswith("trtflow.")]

    def key_params(self) -> dict[str, Any]:
        """The parameters that enter the cache key: those not left at their default, so a trtflow release that adds
        an option with a default re-keys nothing already stored. A changed default changes the work of everyone
        who left it: bump the kind's VERSION with it (tests/test_keys.py pins every kind's key)."""
        return self.model_dump(mode="json", exclude=set(self.EXECUTION_FIELDS), exclude_defaults=True)

    def all_params(self) -> dict[str, Any]:
        """Every parameter that defines the work, defaults included: what `plan` shows when it explains a change."""
        return self.model_dump(mode="json", exclude=set(self.EXECUTION_FIELDS))


# --- sample data (precision, calibrate, prepare's checks) ------------------------------------------------

class SampleData(Strict):
    """Where sample inputs come from: images through the parity preprocessing, saved tensors, or random."""
    images: str | None = Field(None, description="glob of images, fed through the parity stage's preprocessing")
    tensors: str | None = Field(None, description="glob of .npy (single input) or .npz (one array per input)")
    random: bool = False
    samples: int = Field(8, ge=1, le=MAX_SAMPLES,
                         description="how many samples to use (at most; files beyond are ignored)")
    shapes: dict[str, Shape] = Field(default_factory=dict,
                                         description="shapes for random inputs where the model's are dynamic")
    ranges: dict[str, list[float]] = Field(
        default_factory=dict, description="per input, [low, high] of its random values (equal bounds pin a "
                                          "constant), e.g. {token_type_ids: [0, 1], sample_rate: [16000, 16000]}")
    seed: int = 0

    @model_validator(mode="after")
    def _one_of(self) -> "SampleData":
        if sum((self.images is not None, self.tensors is not None, self.random)) > 1:
            raise ValueError("give only one of 'images', 'tensors' or 'random: true'")
        for name, bounds in self.ranges.items():
            if len(bounds) != 2 or bounds[0] > bounds[1]:
                raise ValueError(f"ranges.{name}: give [low, high] with low <= high, got {bounds}")
        return self


# --- prepare --------------------------------------------------------------------------------------------------

class CheckSpec(Strict):
    """How a transformed model (simplified, converted) is compared to the original with ONNX Runtime."""
    samples: int = Field(2, ge=1, le=100, description="random input batches to compare")
    rtol: float = Field(1e-3, ge=0)
    atol: float = Field(1e-4, ge=0)
    seed: int = 0
    data: SampleData | None = Field(
        None, description="the inputs to compare on: tensors, or random with shapes and ranges (default: random, "
                          "`samples` of them, shaped by input_shapes)")

    @model_validator(mode="after")
    def _no_images(self) -> "CheckSpec":
        if self.data is not None and self.data.images is not None:
            raise ValueError("data.images needs the parity stage's preprocessing, which comes after prepare: "
                             "give data.tensors, or random data with ranges")
        return self


def _yaml_off(value: Any) -> Any:
    # YAML 1.1 reads a bare `off` as false (and `on` as true)
    return {False: "off", True: "auto"}.get(value, value) if isinstance(value, bool) else value


class PrepareStage(StageBase):
    kind: Literal["prepare"]
    target_opset: int | None = Field(None, ge=1, le=30,
                                     description="convert the default-domain opset to this version")
    simplify: bool = Field(True, description="run onnxsim (constant folding, dead-code removal)")
    check: CheckSpec = Field(default_factory=CheckSpec)
    input_shapes: dict[str, Shape] = Field(
        default_factory=dict,
        description="concrete shapes for random-input checks where an input has dynamic dimensions")
    preflight: Annotated[Literal["auto", "required", "off"], BeforeValidator(_yaml_off)] = Field(
        "auto", description="parse with TensorRT: auto = when a TensorRT flavour is installed")
    fail_on_unsupported: bool = Field(True, description="fail the stage when the TensorRT pre-flight "
                                                        "finds nodes it cannot parse, or the trial build fails")
    trial_build: bool = Field(True, description="the pre-flight also builds an engine at input_shapes (parsing "
                                                "is not building)")

    def data_globs(self) -> dict[str, tuple[str, tuple]]:
        data = self.check.data
        return {} if data is None or not data.tensors else {"tensors": (data.tensors, ("check", "data", "tensors"))}


# --- parity ---------------------------------------------------------------------------------------------------

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
    size: list[Dim] = Field(min_length=2, max_length=2, description="[height, width]; padded on the right and "
                                                                   "at the bottom")
    value: float | list[float] = Field(0.0, description="on the tensor's scale at that step (one, or per channel)")


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


# --- precision / calibrate -------------------------------------------------------------------------------------

class FallbackSpec(Strict):
    auto: bool = Field(True, description="keep nodes in FP32 whose activations overflow or lose accuracy")
    data_max: float = Field(512.0, gt=0, description="keep a node FP32 if |activation| exceeds this")
    init_max: float = Field(65504.0, gt=0, description="keep a node FP32 if a weight exceeds this")
    max_rel_error: float | None = Field(None, gt=0, description="keep a node FP32 if its FP16 error is larger")


class PrecisionStage(StageBase):
    kind: Literal["precision"]
    to: Literal["fp16", "bf16"] = "fp16"
    keep_io_types: bool = True
    fallback: FallbackSpec = Field(default_factory=FallbackSpec)
    block_ops: list[str] = Field(default_factory=list, description="op types kept in FP32")
    block_nodes: list[str] = Field(default_factory=list, description="node names (regex) kept in FP32")
    data: SampleData = Field(default_factory=lambda: SampleData(random=True))
    holdout: int = Field(8, ge=0, le=MAX_SAMPLES, description="samples for the CPU accuracy pre-flight")


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


# --- build ----------------------------------------------------------------------------------------------------

class ShapeRange(Strict):
    min: Shape
    opt: Shape
    max: Shape

    @model_validator(mode="after")
    def _ordered(self) -> "ShapeRange":
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError("min, opt and max must have the same rank")
        for i, (a, b, c) in enumerate(zip(self.min, self.opt, self.max)):
            if not a <= b <= c:
                raise ValueError(f"dimension {i}: need min <= opt <= max, got {a}, {b}, {c}")
        return self


class BuilderOptions(Strict):
    """The TensorRT builder's options, typed once: this object travels from the YAML to the build worker, which
    validates it again; `trtflow.stages.trt.config` checks it against the installed TensorRT and applies it."""
    optimization_level: int | None = Field(None, ge=0, le=5)
    workspace: Size | None = None
    aux_streams: int | None = Field(None, ge=0)
    hardware_compatibility: Literal["none", "ampere_plus", "same_compute_capability"] | None = None
    version_compatible: bool = False
    strip_plan: bool = False
    weight_streaming: bool = False
    legacy_precision: list[Literal["fp16", "int8", "tf32"]] = Field(
        default_factory=list, description="TensorRT 10 builder flags; rejected on TensorRT 11 and TensorRT-RTX")


class BuildStage(StageBase, BuilderOptions):
    kind: Literal["build"]
    backend: Literal["auto", "tensorrt", "tensorrt-rtx"] = "auto"
    profiles: dict[str, dict[str, ShapeRange]] = Field(
        default_factory=dict, description="named optimization profiles: {name: {input: {min, opt, max}}}")
    profile_mode: Literal["separate", "combined"] = Field(
        "separate", description="one engine per profile, or all profiles in one engine")
    targets: list[str] = Field(default_factory=lambda: ["native"],
                               description="'native', or compute capabilities for TensorRT-RTX (sm86, sm89, ...)")
    timing_cache: bool = True
    parallel: int = Field(2, ge=1, le=64)
    log_severity: Literal["error", "warning", "info", "verbose"] = "warning"

    def builder_options(self) -> BuilderOptions:
        return BuilderOptions.model_validate(self.model_dump(include=set(BuilderOptions.model_fields)))


# --- validate / benchmark --------------------------------------------------------------------------------------

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


class GateSpec(Strict):
    baseline: str = Field("previous", description="'previous' (last accepted run) or a path to a report.json")
    p99_regression: Fraction | None = None
    mean_regression: Fraction | None = None
    throughput_regression: Fraction | None = None


class BenchmarkStage(StageBase):
    kind: Literal["benchmark"]
    tool: Literal["auto", "trtexec", "builtin"] = Field(
        "auto", description="auto: trtexec where found, else the built-in harness (the engine on a GPU that can "
                            "run it, else its ONNX variant on ONNX Runtime, labelled as such)")
    trtexec: str | None = Field(None, description="path of trtexec (default: PATH, TENSORRT_ROOT, usual places)")
    shapes: list[Literal["min", "opt", "max"]] = Field(
        default_factory=lambda: ["opt"], min_length=1, description="which shapes of each profile to measure")
    warmup: Duration = 0.2
    duration: Duration = 3.0
    iterations: int | None = Field(None, ge=1, le=10_000_000)
    trtexec_args: list[str] = Field(default_factory=list)
    gate: GateSpec | None = None

    def executes(self) -> list[str]:
        if self.tool == "builtin":
            return []
        where = self.trtexec or "the first found on PATH, under TENSORRT_ROOT or in the usual places"
        return [f"trtexec: {where} (a program)"]

    def data_globs(self) -> dict[str, tuple[str, tuple]]:
        if self.gate is not None and self.gate.baseline != "previous":
            return {"baseline": (self.gate.baseline, ("gate", "baseline"))}
        return {}


# --- a user's own stage ---------------------------------------------------------------------------------------

class CustomStage(StageBase):
    kind: str = Field(pattern=CUSTOM_KIND, description="package.module:function")
    params: dict[str, Any] = Field(default_factory=dict)
    outputs: dict[str, Literal[ARTIFACT_TYPES]] = Field(  # type: ignore[valid-type]
        default_factory=dict, description="names and types of what the function writes")
    version: str = Field("1", description="bump to invalidate cached results when the function changes")
    env_dependent: bool = False

    def executes(self) -> list[str]:
        return [f"{self.kind} (a function of yours: the stage itself)", *super().executes()]
