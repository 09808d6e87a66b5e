"""What the parameter models of every stage kind share (`pipelines/params/<kind>.py` holds each kind's own).

Fields that only steer execution (retries, timeout, description, inputs) live on ``StageBase``;
everything else a stage model declares is a parameter of the stage's work and enters its cache key.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer, model_validator

from trtflow.pipelines.units import Duration, Size

CUSTOM_KIND = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"  # package.module:function
ARTIFACT_TYPES = ("onnx", "preprocess", "ranges", "engines", "json", "plots", "file", "dir")  # plots: a folder of PNGs

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



def yaml_off(value: Any) -> Any:
    """For `auto`/`off` settings: YAML 1.1 reads a bare `off` as false (and `on` as true)."""
    return {False: "off", True: "auto"}.get(value, value) if isinstance(value, bool) else value

class Strict(BaseModel):
    # `.inf` and `.nan` are YAML floats: no count, bound or tolerance of trtflow's means anything with them
    # defer_build: a run validates the few kinds its pipeline uses; building every kind's validator at import took
    # 0.37 s of every `trtflow run`, cached ones included
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, defer_build=True)


class StageBase(Strict):
    description: str | None = Field(None, description="free text about the stage, for whoever reads the file (no "
                                                        "part of its key)")
    inputs: dict[str, Ref | list[Ref]] = Field(
        default_factory=dict,
        description="Which earlier outputs this stage consumes, per input slot: 'stage' or 'stage.output', 'source' "
                    "for the pipeline's model. Omitted slots get their default (the kind's inputs below)",
        examples=[{"model": "fp16"}, {"models": ["prepare", "int8"]}])
    retries: int = Field(0, ge=0, le=20, description="Prefect task retries of a crash or timeout (bad input is "
                                                     "never retried)")
    retry_delay: Duration = Field(0.0, description="how long to wait between retries", examples=["30s"])
    timeout: Duration | None = Field(None, description="Fail the stage after this long, killing what it started",
                                     examples=["30m"])

    EXECUTION_FIELDS: ClassVar[frozenset[str]] = frozenset({"description", "inputs", "retries", "retry_delay",
                                                            "timeout"})

    def data_globs(self) -> dict[str, tuple[str, tuple]]:
        """Files this stage reads that a parameter names by glob: input slot -> (glob, key path)."""
        data = getattr(self, "data", None)
        if isinstance(data, SampleData):
            return {k: (v, ("data", k)) for k in ("images", "tensors") if (v := getattr(data, k))}
        return {}

    def named_model_inputs(self) -> list[tuple[str, tuple]]:
        """Inputs of the model this stage reads that a parameter names: (input name, key path), checked against the
        pipeline's model before anything runs where that model is what the stage reads."""
        return []

    def code_refs(self) -> list[str]:
        """User callables (package.module:function) named in the parameters: a declared metric's function."""
        metrics = getattr(self, "metrics", None) or {}
        return [ref for m in metrics.values() for ref in m.code_refs()]

    def executes(self) -> list[str]:
        """Code outside trtflow that this stage runs: a pipeline file is code, and this is what a reviewer reads."""
        return [f"{ref} (a function of yours)" for ref in self.code_refs() if not ref.startswith("trtflow.")]

    def key_params(self) -> dict[str, Any]:
        """The parameters that define the work, defaults included: the cache key's, the last run's record and what
        `plan` compares, one definition (a changed default re-keys exactly the stages that leave it unset; an
        option a trtflow release adds re-keys its kind once, which is right: its code changed too)."""
        return self.model_dump(mode="json", exclude=set(self.EXECUTION_FIELDS))


# --- sample data (precision, calibrate, prepare's checks) ------------------------------------------------

class SampleData(Strict):
    """Where sample inputs come from: images through the parity preprocessing, saved tensors, or random."""
    images: str | None = Field(None, description="glob of images, relative to the pipeline file, fed through the "
                                                 "parity stage's preprocessing", examples=["data/*.jpg"])
    tensors: str | None = Field(None, description="glob of .npy (single input) or .npz (one array per input)",
                                examples=["ref/*.npz"])
    random: bool = Field(False, description="seeded random inputs (at `shapes` where the model's are dynamic, "
                                            "within `ranges`); integer inputs that index a table stay within it")
    samples: int = Field(8, ge=1, le=MAX_SAMPLES,
                         description="how many samples to use (at most; files beyond are ignored)")
    shapes: dict[str, Shape] = Field(default_factory=dict,
                                     description="shapes for random inputs where the model's are dynamic",
                                     examples=[{"input_ids": [1, 128]}])
    ranges: dict[str, list[float]] = Field(
        default_factory=dict, description="per input, [low, high] of its random values (equal bounds pin a "
                                          "constant)",
        examples=[{"token_type_ids": [0, 1], "sample_rate": [16000, 16000]}])
    pad: dict[str, float] = Field(
        default_factory=dict, description="validate, where it makes files into a profile's larger shape: per input, "
                                          "the value it is padded with (a tokenizer's pad id); inputs not named: "
                                          "integers padded with 0, floats repeat their content",
        examples=[{"input_ids": 1}])
    seed: int = Field(0, description="seed of the random inputs")

    @model_validator(mode="after")
    def _one_of(self) -> "SampleData":
        if sum((self.images is not None, self.tensors is not None, self.random)) > 1:
            raise ValueError("give only one of 'images', 'tensors' or 'random: true'")
        for name, bounds in self.ranges.items():
            if len(bounds) != 2 or bounds[0] > bounds[1]:
                raise ValueError(f"ranges.{name}: give [low, high] with low <= high, got {bounds}")
        return self


# --- task-level accuracy (validate's gate, the precision/calibrate pre-flights) -------------------------
#
# A built-in metric is declared once, here: its parameters (the YAML block), the names it gives and how each is read
# (`Gives`), its default bounds; its computation is the class of stages/compare/task_metrics.py that `MAKERS` names
# by its field in `OutputMetrics` (tests/test_metric_definitions.py checks the two give the same names).

def _per_precision(fp32: float, fp16: float, int8: float) -> dict[str, float]:
    return {"fp32": fp32, "fp16": fp16, "int8": int8}


@dataclass(frozen=True)
class Gives:
    """A metric name, and how it is read: better `higher` or lower; `weighed`: a share the release's
    max_accuracy_drop weighs (not the worst item's value, which moves in steps of one item, nor decibels or an error
    in the output's units); `bounds`: validate's default bound per precision where the metric is declared;
    `example`: the declaration that gives it, for a hint."""
    higher: bool
    weighed: bool = True
    bounds: dict[str, float] | None = None
    example: str = ""


class BuiltInMetric(Strict):
    """A built-in metric's declaration: what it gives (`GIVES`, every name it may give; `gives()`, those this
    declaration gives)."""
    GIVES: ClassVar[dict[str, Gives]] = {}
    REPORTS: ClassVar[tuple[str, ...]] = ()  # what its computation reports beside its metrics: counts, no bound

    def gives(self) -> dict[str, Gives]:
        return dict(self.GIVES)


class TopKMetric(BuiltInMetric):
    """Classification: does the candidate's top-k hold the reference's top class (gives top1, top<k>)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "top1": Gives(True, bounds=_per_precision(0.99, 0.98, 0.95), example="topk: {k: 5}"),
        "top5": Gives(True, example="topk: {k: 5}")}
    NAMED: ClassVar[re.Pattern] = re.compile(r"top[0-9]+")  # top<k>, for any k
    k: int = Field(5, ge=1, le=1000, description="the reference's class must be among the candidate's top k")
    axis: int = Field(-1, description="the class axis")

    def gives(self) -> dict[str, Gives]:
        return {"top1": self.GIVES["top1"], f"top{self.k}": Gives(True)}


class CTCMetric(BuiltInMetric):
    """Text recognition: both sides greedily CTC-decoded and compared (gives text_exact, cer)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "text_exact": Gives(True, bounds=_per_precision(0.98, 0.95, 0.9), example="ctc: {blank: 0}"),
        "cer": Gives(False, bounds=_per_precision(0.005, 0.01, 0.02), example="ctc: {blank: 0}")}
    blank: int = Field(0, ge=0, description="the CTC blank's class index")
    axis: int = Field(-1, description="the class axis; the other non-batch axis is time")
    batch_axis: int = Field(0, description="the batch axis: 1 for time-major scores [T, N, C] (an LSTM or GRU "
                                           "exported without batch_first)")


class MapMetric(BuiltInMetric):
    """A map thresholded into regions (the whole output, or one `channel` of it), or a segmentation's class
    scores whose argmax along `axis` marks each selected class's region (`classes`)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "iou": Gives(True, bounds=_per_precision(0.98, 0.95, 0.9), example="map_iou: {threshold: 0.3}"),
        "iou_min": Gives(True, weighed=False, example="map_iou: {threshold: 0.3}"),
        "iou_class_min": Gives(True, weighed=False, example="map_iou: {classes: [1, 2]}")}
    threshold: float = Field(0.5, description="a map value above this marks a region (not with classes)")
    channel: int | None = Field(None, ge=0, description="only this index along axis: one channel's map (e.g. the "
                                                         "face channel of a background/face softmax)")
    classes: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, max_length=1000,
        description="segmentation logits: each sample's class is the argmax along axis; the IoU of each of these "
                    "classes' regions, pooled (iou), for the worst sample (iou_min) and the worst class "
                    "(iou_class_min)")
    axis: int = Field(1, description="the channel or class axis (with channel or classes)")

    @model_validator(mode="after")
    def _one_selection(self) -> "MapMetric":
        if self.channel is not None and self.classes:
            raise ValueError("give channel (one channel's map, thresholded) or classes (argmax regions), not both")
        if self.classes and "threshold" in self.model_fields_set:
            raise ValueError("with classes each region is where its class is the argmax: threshold does not apply")
        return self

    def gives(self) -> dict[str, Gives]:
        return {n: g for n, g in self.GIVES.items() if n != "iou_class_min" or self.classes}


class EmbeddingMetric(BuiltInMetric):
    """Embeddings: the cosine of each sample's embedding to the reference's (gives embedding_cosine, its worst
    sample, and embedding_cosine_mean)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "embedding_cosine": Gives(True, weighed=False, bounds=_per_precision(0.999, 0.995, 0.98),
                                  example="embedding: {pool: mean}"),
        "embedding_cosine_mean": Gives(True, example="embedding: {pool: mean}")}
    axis: int = Field(-1, description="the embedding axis")
    pool: Literal["none", "mean"] = Field(
        "none", description="mean: average the axes between batch and axis first (token embeddings -> one vector "
                            "per sentence); none: each sample's whole output is its embedding")
    mask: str | None = Field(None, description="with pool: mean, the model input holding each token's mask (1 a "
                                               "real token, 0 padding): the mean over real tokens only, as "
                                               "sentence-transformers pools")


class ImageMetric(BuiltInMetric):
    """An output that is an image (super-resolution, restoration, style transfer, depth maps shown as images):
    judged as pixels, after clipping to `range`. Gives psnr (dB over every sample's pixels), pixels_within (the
    share of pixel values within `within` levels of the reference's, a level being 1/`levels` of the range), and
    ssim (scikit-image's structural similarity, the mean over samples), all better higher."""
    # an image: 95% of pixel values within one level (8-bit) of FP32's; waifu2x's INT8 moved a third by two or more
    GIVES: ClassVar[dict[str, Gives]] = {
        "psnr": Gives(True, weighed=False, bounds=_per_precision(50.0, 40.0, 35.0), example="image: {range: [0, 1]}"),
        "pixels_within": Gives(True, bounds=_per_precision(0.999, 0.99, 0.95), example="image: {range: [0, 1]}"),
        "ssim": Gives(True, bounds=_per_precision(0.999, 0.995, 0.98), example="image: {range: [0, 1]}")}
    range: tuple[float, float] = Field((0.0, 1.0), description="the values a pixel takes, [black, white] (0..1, "
                                                               "0..255, -1..1)", examples=[[0, 255]])
    layout: Literal["nchw", "nhwc"] = Field("nchw", description="where the channel axis is (a batch first)")
    levels: int = Field(255, ge=1, le=65535, description="how many steps the range is shown in (255: 8-bit)")
    within: float = Field(1.0, gt=0, description="pixels_within counts values at most this many levels from the "
                                                 "reference's")

    @model_validator(mode="after")
    def _a_range(self) -> "ImageMetric":
        if not self.range[1] > self.range[0]:
            raise ValueError(f"range: [{self.range[0]:g}, {self.range[1]:g}] is empty: give [black, white]")
        return self


class RegressionMetric(BuiltInMetric):
    """Values with no class semantics (quality scores, a box, a pose, a price): the candidate's errors against the
    reference's in the output's own units. Gives abs_err_max (the worst element's absolute error: the worst
    sample's too), abs_err_mean (over every element), sample_err_mean (each sample's worst element, the mean over
    samples) and spread_err_max (abs_err_max over the reference's spread: its largest value less its smallest over
    every sample), all better lower; with relative_above, rel_err_max and rel_err_mean. Errors in the output's
    units: bounded by validate, never weighed as a share (a regression's 0.33 is no 33% of anything)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        **{n: Gives(False, weighed=False, example="regression: {within: 0.1}")
           for n in ("abs_err_max", "abs_err_mean", "sample_err_mean")},
        "spread_err_max": Gives(False, weighed=False, bounds=_per_precision(0.001, 0.01, 0.05),
                                example="regression: {within: 0.1}"),
        **{n: Gives(False, weighed=False, example="regression: {relative_above: 1.0}")
           for n in ("rel_err_max", "rel_err_mean")}}
    within: float | None = Field(None, gt=0, description=(
        "the largest absolute error your users accept, in the output's units: a candidate passes where its "
        "abs_err_max is at most this (replacing the default bound on spread_err_max)"), examples=[0.1])
    relative_above: float | None = Field(None, ge=0, description=(
        "also the relative error |error| / |reference| (rel_err_max, rel_err_mean), over the elements whose "
        "|reference| is above this, in the output's units (0: every nonzero element)"), examples=[1.0])

    def gives(self) -> dict[str, Gives]:
        return {n: g for n, g in self.GIVES.items() if not n.startswith("rel_") or self.relative_above is not None}


class DecisionMetric(BuiltInMetric):
    """A score decided at a threshold (a one-class Sigmoid, a binary logit, multi-label scores): the share of
    elements the candidate decides as the reference does, above the threshold or not (gives decision_agree)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "decision_agree": Gives(True, bounds=_per_precision(0.99, 0.98, 0.95), example="decision: {threshold: 0.5}")}
    threshold: float = Field(0.5, description="a score above this is a positive decision (a logit's: 0)")


class CallableMetric(Strict):
    """The user's metric function, and which of the names it returns are better higher or lower (what
    `select.max_accuracy_drop` needs to weigh them; a tolerance's {min: x} / {max: x} says it too). Written as
    the function alone (`callable: pkg.mod:fn`) or with its directions (`callable: {function: pkg.mod:fn,
    higher: [face_iou], lower: [miss_rate]}`)."""
    function: str = Field(pattern=CUSTOM_KIND, description="package.module:function(reference, candidate) -> "
                                                           "{name: value}, called per batch of one output; each "
                                                           "value's mean is reported")
    higher: list[str] = Field(default_factory=list, description="names it returns that are better higher: shares "
                                                                "in [0, 1] such as an IoU or an agreement")
    lower: list[str] = Field(default_factory=list, description="names it returns that are better lower: errors, in "
                                                               "the output's units or any (shown as values, not "
                                                               "weighed as a share by select.max_accuracy_drop: "
                                                               "bound them with {max: x})")

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, data: Any) -> Any:
        return {"function": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _consistent(self) -> "CallableMetric":
        both = sorted(set(self.higher) & set(self.lower))
        if both:
            raise ValueError(f"{', '.join(both)}: both in higher and lower")
        for name in self.higher + self.lower:
            own = metric_direction(name)
            if own is not None and own != (name in self.higher):
                raise ValueError(f"{name}: trtflow's own metric, {'higher' if own else 'lower'} is better; name "
                                 f"your function's metric otherwise")
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: Any) -> Any:
        # the plain form stays a string: a pipeline that declares no directions keeps its cache keys
        return self.function if not self.higher and not self.lower else handler(self)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        return {"anyOf": [{"type": "string", "pattern": CUSTOM_KIND}, handler(core_schema)]}

    def directions(self) -> dict[str, bool]:
        return {**{n: True for n in self.higher}, **{n: False for n in self.lower}}


class BoxDecoding(Strict):
    """How a detector's outputs become boxes: a built-in decoder for a head layout, or the user's function, and
    which of them are kept (score, class-aware NMS, how many)."""
    layout: Literal["auto", "yolov5", "yolov8", "end2end"] = Field(
        "auto", description="yolov5: [N, A, 5+C] (cx, cy, w, h, objectness, C class scores); yolov8: [N, 4+C, A] "
                            "or [N, A, 4+C] (cx, cy, w, h, C class scores); end2end: [N, K, 6] after the model's "
                            "own NMS (x1, y1, x2, y2, score, class); auto: yolov8 where the output is [N, 4+C, A] "
                            "(channels first), else give it")
    decode: str | None = Field(None, pattern=CUSTOM_KIND, description=(
        "instead of a layout, package.module:function(outputs, feed) -> one (boxes [K, 4] x1 y1 x2 y2, scores "
        "[K], classes [K]) per image of the batch; outputs: every output of the model by name (heads spread "
        "over several outputs), feed: the inputs"))
    score_threshold: float = Field(0.25, description="a box scoring at most this is no detection")
    nms_iou: float = Field(0.45, ge=0, le=1, description="non-maximum suppression: a box overlapping a better one "
                                                          "of its class by more than this IoU is dropped (not for "
                                                          "end2end)")
    max_detections: int = Field(300, ge=1, le=100_000, description="per image, the best-scoring boxes kept")

    @model_validator(mode="after")
    def _layout_or_decoder(self) -> "BoxDecoding":
        if self.decode is not None and self.layout != "auto":
            raise ValueError("give layout (a built-in decoder) or decode (your function), not both")
        return self


class DetectionsMetric(BoxDecoding, BuiltInMetric):
    """A detector's boxes, decoded from its outputs, suppressed (class-aware NMS) and matched one-to-one to the
    reference's (same class, IoU at least match_iou, greedily by the candidate's score)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "det_recall": Gives(True, bounds=_per_precision(0.99, 0.95, 0.9), example="detections: {layout: yolov8}"),
        "det_precision": Gives(True, bounds=_per_precision(0.99, 0.95, 0.9), example="detections: {layout: yolov8}"),
        "det_iou": Gives(True, bounds=_per_precision(0.98, 0.95, 0.9), example="detections: {layout: yolov8}"),
        "det_f1_min": Gives(True, weighed=False, example="detections: {layout: yolov8}")}
    REPORTS: ClassVar[tuple[str, ...]] = ("reference_boxes",)
    match_iou: float = Field(0.5, gt=0, le=1, description="a candidate box matches a reference box of its class "
                                                          "overlapping it by at least this IoU")


class OutputMetrics(Strict):
    """How one output's users judge it, beside the elementwise metrics. Names each gives (which tolerances may
    bound): topk -> top1, top<k>; ctc -> text_exact, cer; map_iou -> iou, iou_min (iou_class_min with classes);
    embedding -> embedding_cosine (worst sample), embedding_cosine_mean; detections -> det_recall,
    det_precision, det_iou, det_f1_min; image -> psnr, pixels_within, ssim; regression -> abs_err_max,
    abs_err_mean, sample_err_mean, spread_err_max (rel_err_max, rel_err_mean with relative_above); decision ->
    decision_agree; callable -> the names its function returns."""
    topk: TopKMetric | None = None
    ctc: CTCMetric | None = None
    map_iou: MapMetric | None = None
    embedding: EmbeddingMetric | None = None
    detections: DetectionsMetric | None = None
    image: ImageMetric | None = None
    regression: RegressionMetric | None = None
    decision: DecisionMetric | None = None
    callable: CallableMetric | None = Field(None, description=(
        "package.module:function, or {function: package.module:function, higher: [names], lower: [names]}"))

    def names(self) -> set[str]:
        """The metric names the built-in metrics give and the callable declares (it may return others)."""
        out = {name for spec in self.built_in().values() for name in spec.gives()}
        return out | set(self.callable.directions()) if self.callable else out

    def built_in(self) -> dict[str, BuiltInMetric]:
        """The built-in metrics declared: their key here (`topk`) -> their declaration."""
        return {key: spec for key in BUILT_IN_METRICS if (spec := getattr(self, key)) is not None}

    def code_refs(self) -> list[str]:
        """Functions of the user's it names: the metric function, a detections decoder."""
        return [ref for ref in (self.callable and self.callable.function, self.detections and self.detections.decode)
                if ref]


# every built-in metric: its key in OutputMetrics -> its declaration's class
BUILT_IN_METRICS: dict[str, type[BuiltInMetric]] = {
    key: next(t for t in get_args(info.annotation) if isinstance(t, type) and issubclass(t, BuiltInMetric))
    for key, info in OutputMetrics.model_fields.items() if key != "callable"}
# the elementwise metrics every output gets
ELEMENTWISE: dict[str, Gives] = {"cosine": Gives(True), "max_abs": Gives(False), "mean_abs": Gives(False),
                                 "max_rel": Gives(False), "rtol": Gives(False)}
_GIVEN: dict[str, Gives] = {**ELEMENTWISE, **{n: g for cls in BUILT_IN_METRICS.values() for n, g in cls.GIVES.items()}}


def gives(name: str) -> Gives | None:
    """How a metric name trtflow gives is read; None for a name that is not trtflow's (a function's)."""
    if name in _GIVEN:
        return _GIVEN[name]
    return Gives(True) if TopKMetric.NAMED.fullmatch(name) else None


def metric_direction(name: str) -> bool | None:
    """True: a metric of trtflow's that must be at least its bound; False: at most; None: not trtflow's."""
    given = gives(name)
    return None if given is None else given.higher


def not_weighed(name: str) -> bool:
    """A metric of trtflow's the release's max_accuracy_drop never weighs (a worst item's, decibels, an error in
    the output's units): validate's tolerances bound it."""
    given = gives(name)
    return given is not None and not given.weighed


def default_bounds(precision: str) -> dict[str, tuple[float, bool]]:
    """validate's default bounds on the task metrics for a precision: metric -> (bound, whether at least); the
    shares first (a failure names the first bound missed: a one-class score's agreement before its error)."""
    bounded = [n for n, g in _GIVEN.items() if g.bounds is not None]
    order = sorted(bounded, key=lambda n: not _GIVEN[n].weighed)  # stable: declaration order within each
    return {n: (_GIVEN[n].bounds[precision], _GIVEN[n].higher) for n in order}


Metrics = Annotated[dict[str, OutputMetrics], Field(
    default_factory=dict, description="task-level metrics per output name, or '*' for every output",
    examples=[{"logits": {"topk": {"k": 5}}}, {"*": {"ctc": {"blank": 0}}}, {"maps": {"map_iou": {"threshold": 0.3}}}])]


# --- the TensorRT builder's options (build, and the trial builds of prepare and precision) ---------------------

class BuilderOptions(Strict):
    """The TensorRT builder's options, typed once: this object travels from the YAML to the build worker, which
    validates it again; `trtflow.stages.trt.config` checks it against the installed TensorRT and applies it."""
    optimization_level: int | None = Field(None, ge=0, le=5, description="the builder's optimization level (more: "
                                                                       "longer builds, maybe faster engines); "
                                                                       "default: TensorRT's")
    workspace: Size | None = Field(None, description="the builder's workspace memory limit; default: TensorRT's",
                                   examples=["2GiB"])
    aux_streams: int | None = Field(None, ge=0, description="most auxiliary CUDA streams an engine may use; "
                                                            "default: TensorRT's")
    hardware_compatibility: Literal["none", "ampere_plus", "same_compute_capability"] | None = Field(
        None, description="engines that run on other GPUs than the one they were built on (full TensorRT; "
                          "refused by TensorRT-RTX, which chooses GPUs with targets)")
    version_compatible: bool = Field(False, description="engines that later TensorRT versions can run (the lean "
                                                        "runtime)")
    strip_plan: bool = Field(False, description="engines without their weights (refitted before use)")
    weight_streaming: bool = Field(False, description="engines whose weights may stream from host memory")
    legacy_precision: list[Literal["fp16", "int8", "tf32"]] = Field(
        default_factory=list, description="TensorRT 10 builder flags; rejected on TensorRT 11 and TensorRT-RTX")
