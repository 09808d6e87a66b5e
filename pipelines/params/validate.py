"""Stage `validate`: every engine (or model variant) against the FP32 reference, with repair."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping

from pydantic import ConfigDict, Field, model_validator

from trtflow.metrics.builtin import BUILT_IN
from trtflow.metrics.builtin.detections import BoxDecoding
from trtflow.metrics.names import examples, metric_direction
from trtflow.metrics.outputs import Metrics
from trtflow.names import StageName
from trtflow.pipelines.row import MODEL_MAKERS, PREPROCESS_SLOT, REFERENCE_CACHE, TENSORRT_AND_GPU, Kind, Slot
from trtflow.pipelines.schema import SampleData, StageBase
from trtflow.pipelines.units import Fraction
from trtflow.strict import Strict

Number = int | float  # not float alone: a bound written as an integer stays one in the stage's key
TaskBound = Annotated[Number | dict[Literal["min", "max"], Number], Field(
    description="a bound on any other metric a declared metric gives (`metrics:`): a number for trtflow's own ("
                + ", ".join(n for cls in BUILT_IN.values() for n in cls.GIVES if n not in ("top1", "top5"))
                + ", top<k>; a regression's errors in the output's units), {min: x} (at least) or {max: x} (at most) "
                  "for your function's", examples=[0.95, {"min": 0.9}])]


class OutputTolerance(Strict):
    """Bounds on one output's metrics against the FP32 reference (validate: defaults per precision in docs/pipeline.md)."""
    cosine: float | None = Field(None, ge=-1, le=1, description="lowest cosine similarity")
    max_abs: float | None = Field(None, ge=0, description="largest absolute error")
    mean_abs: float | None = Field(None, ge=0, description="largest mean absolute error")
    rtol: float | None = Field(None, ge=0, description="largest relative error (report: max_rel), over elements of "
                                                      "at least 1/1000 of the output's largest magnitude")
    top1: Fraction | None = Field(None, description="lowest share of samples whose top-1 class agrees")
    top5: Fraction | None = Field(None, description="lowest share whose reference class is in the top 5")
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, TaskBound] = Field(init=False)  # typed: the JSON Schema and docs/reference.md show it

    @model_validator(mode="before")
    @classmethod
    def _task_bounds(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            if name in cls.model_fields:
                continue
            if metric_direction(name) is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{name}: give a number, got {value!r}")
            elif not (isinstance(value, dict) and len(value) == 1 and set(value) <= {"min", "max"}
                      and isinstance(next(iter(value.values())), (int, float))):
                raise ValueError(f"{name}: not one of trtflow's metrics; for a metric your function returns give "
                                 f"{{min: x}} (at least) or {{max: x}} (at most)")
        return data

    def given(self) -> dict[str, tuple[float, bool]]:
        """Every bound given: metric -> (value, whether the metric must be at least the value)."""
        out = {}
        for name, value in self.model_dump(exclude_none=True).items():
            metric = METRIC_OF.get(name, name)
            if isinstance(value, dict):
                (side, v), = value.items()
                out[metric] = (float(v), side == "min")
            else:
                out[metric] = (float(value), bool(metric_direction(metric)))
        return out


_EXAMPLE = examples()
METRIC_OF = {"rtol": "max_rel"}  # tolerance key -> metric it bounds, where the names differ

class TextLabels(Strict):
    """How a CTC recognizer's output becomes text to compare with the labels: class 0 is the blank, class i the
    charset's i-th character (PaddleOCR's convention), then a space where `space`."""
    charset: str = Field(description="the characters, one per line: a file relative to the pipeline file, or "
                                     "`model:KEY` for the ONNX model's metadata entry KEY (PaddleOCR models exported "
                                     "by RapidOCR carry theirs as `model:character`)",
                         examples=["model:character", "models/ppocr_keys_v1.txt"])
    space: bool = Field(True, description="a space after the charset's characters (PaddleOCR's use_space_char)")
    axis: int = Field(-1, description="the class axis of the output ([N, T, C]: -1)")


class BoxLabels(BoxDecoding):
    """How a detector's outputs become boxes to score against COCO-format labels (pycocotools' COCOeval: mAP at
    IoU 0.5:0.95 and at 0.5): decoded as the detections metric decodes them (`layout`, or `decode` giving boxes in
    the tensor's pixels), then taken back through the preprocessing (resize, letterbox, crop, pad) to the image as
    read, where the labels are drawn."""
    score_threshold: float = Field(0.001, description="a box scoring at most this is left out (mAP wants the "
                                                      "low-scoring boxes too: 0.001, as COCO evaluations use)")
    nms_iou: float = Field(0.6, ge=0, le=1, description="class-aware non-maximum suppression: a box overlapping a "
                                                        "better one of its class by more than this IoU is dropped "
                                                        "(not for end2end)")
    max_detections: int = Field(100, ge=1, le=100_000, description="per image, the best-scoring boxes kept "
                                                                   "(COCO's 100)")
    category_ids: list[int] = Field(default_factory=list, max_length=100000, description=(
        "the labels' category id of each model class, in class order; default: the file's categories sorted by "
        "id (a COCO-trained 80-class detector's order)"))


class MaskLabels(Strict):
    """How a segmentation output becomes a class per pixel to score against mask images (mean IoU over the
    classes present): the argmax along `axis`, or a one-channel map above `threshold` (classes 0 and 1). The
    map is taken back through the preprocessing to the image as read, where the masks are drawn."""
    axis: int = Field(1, description="the class axis ([N, C, H, W]: 1)")
    threshold: float | None = Field(None, description="a one-channel probability map: class 1 where above this")
    ignore: int = Field(255, ge=0, le=65535, description="the mask value of pixels not scored")


class LabelsSpec(Strict):
    """Ground truth for validate's data: each sample file's true class, its true text, its boxes or its mask, to
    report every candidate's (and FP32's) accuracy against it beside their agreement with FP32."""
    file: str = Field(description="relative to the pipeline file: a CSV of `file,label` rows (a header row is "
                                  "allowed; quote a text holding commas) or a JSON object {file: label}; files by "
                                  "name, as data globs them; with boxes: a COCO-format JSON (images by file_name, "
                                  "annotations with bbox [x, y, w, h]); with masks: a glob of one-channel PNGs, one "
                                  "per image with its name (any extension), each pixel its class",
                      examples=["data/labels.csv", "data/instances.json", "data/masks/*.png"])
    output: str = Field(description="the output holding the class scores (batch first, classes last), a text "
                                    "recognizer's per-step scores (with text:), a detector's head (with boxes:) or "
                                    "a segmentation map (with masks:)", examples=["logits"])
    classes: list[str] = Field(default_factory=list, max_length=100000, description=(
        "class names in index order, where the labels give names (e.g. ['0', '180']); default: labels are class "
        "indices"))
    k: int = Field(5, ge=1, le=1000, description="top-k accuracy besides top-1")
    text: TextLabels | None = Field(None, description="the labels are text read by a CTC recognizer: exact-match "
                                                      "share (text_exact) and character error rate (cer)")
    boxes: BoxLabels | None = Field(None, description="the labels are COCO-format boxes: map (mAP at IoU "
                                                      "0.5:0.95) and map50")
    masks: MaskLabels | None = Field(None, description="the labels are per-pixel class masks: miou (mean IoU over "
                                                       "the classes present) and pixel_accuracy")

    @model_validator(mode="after")
    def _one_kind(self) -> "LabelsSpec":
        given = [k for k in ("text", "boxes", "masks") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of text, boxes or masks, not {' and '.join(given)}")
        if given and ("classes" in self.model_fields_set or "k" in self.model_fields_set):
            raise ValueError(f"classes and k are for class labels, not with {given[0]}")
        return self

    def charset_file(self) -> str | None:
        """The charset file a text label block names (None: none, or the model's metadata)."""
        return None if self.text is None or self.text.charset.startswith("model:") else self.text.charset


class ValidateStage(StageBase):
    kind: Literal["validate"] = Field(description="this section's kind")
    data: SampleData = Field(default_factory=lambda: SampleData(random=True), description=(
        "the samples every candidate and the FP32 reference run on, made into each profile's shapes"),
        examples=[{"images": "data/*.jpg", "samples": 32}])
    runtime: Literal["auto", "onnxruntime", "tensorrt"] = Field(
        "auto", description="auto: TensorRT where a GPU can run the engine, else the variant simulated on ONNX "
                            "Runtime")
    profile_shapes: list[Literal["min", "opt", "max"]] = Field(
        default_factory=lambda: ["min", "opt", "max"], min_length=1,
        description="the shapes of each profile to check at: random data is drawn at them; files are made into them "
                    "where a profile is dynamic (images through the preprocessing set for that size, tensors cut, "
                    "padded or repeated, batches filled with more files)")
    metrics: Metrics
    tolerances: dict[str, OutputTolerance] = Field(
        default_factory=dict, description="per output name, or '*' for all outputs (an output's own entry over "
                                          "'*' over the defaults per precision)",
        examples=[{"logits": {"top1": "99%", "cosine": 0.999}}, {"*": {"text_exact": 0.95}}])
    check_nan_inf: bool = Field(True, description="a NaN or Inf the reference does not have fails the candidate")
    locate_first_bad_layer: bool = Field(True, description="when a candidate fails: compare every intermediate "
                                                           "tensor with the reference's to find where it goes wrong")
    locate_samples: int = Field(2, ge=1, le=100, description="when a candidate fails: how many samples (those whose "
                                "outputs are off the most) are compared tensor by tensor")
    repair: bool = Field(False, description="search for the nodes to keep in FP32 / leave unquantized so a "
                                            "failing FP16 / INT8 candidate passes")
    repair_rounds: int = Field(8, ge=1, le=64, description="at most this many rebuild-and-check rounds")
    repair_max_giveback: Fraction = Field(
        0.25, description="a repair giving back more than this share of the variant's FP16/INT8 nodes is no repair: "
                          "the stage fails saying the precision is not viable at these tolerances")
    repair_variant: str | None = Field(None, description="the precision/calibrate stage whose variant is repaired and "
                                                         "published as output 'repaired' (default: the only one)")
    labels: LabelsSpec | None = Field(None, description=(
        "ground truth for the data: each candidate's and FP32's top-1 / top-k accuracy against it, in the report "
        "and the card (select.accuracy: labels weighs it in the release)"),
        examples=[{"file": "data/labels.csv", "output": "logits", "classes": ["0", "180"]}])
    optional: list[StageName] = Field(default_factory=list, description=(
        "model variants (their precision/calibrate stages) that may fail: a failing optional variant is excluded "
        "from benchmark and release, its verdict and reason kept, and the run goes on; every other variant must "
        "pass (without it, any failure fails the stage)"))

    def data_globs(self) -> dict[str, tuple[str, tuple]]:
        globs = super().data_globs()
        if self.labels is not None:
            globs["labels"] = (self.labels.file, ("labels", "file"))
            if self.labels.charset_file() is not None:
                globs["charset"] = (self.labels.charset_file(), ("labels", "text", "charset"))
        return globs

    def code_refs(self) -> list[str]:
        decode = self.labels and self.labels.boxes and self.labels.boxes.decode
        return super().code_refs() + ([decode] if decode else [])

    @model_validator(mode="after")
    def _labels_need_files(self) -> "ValidateStage":
        if self.labels is not None and not (self.data.images or self.data.tensors):
            raise ValueError("labels: name the true class of sample files: give data.images or data.tensors")
        return self

    @model_validator(mode="after")
    def _bounded_metrics_exist(self) -> "ValidateStage":
        for output, tol in self.tolerances.items():
            declared = [m for key, m in self.metrics.items() if key in ("*", output) or output == "*"]
            names = set().union(*(m.names() for m in declared)) if declared else set()
            custom = any(m.callable for m in declared)
            said = {n: d for m in declared if m.callable for n, d in m.callable.directions().items()}
            bounds = tol.given()
            for name in tol.model_extra or {}:
                if name not in names and not (custom and metric_direction(name) is None):
                    raise ValueError(f"tolerances.{output}.{name}: no metric declared for '{output}' gives "
                                     f"'{name}'; declare it under metrics.{output} (e.g. "
                                     f"{_EXAMPLE.get(name, 'callable: package.module:function')})")
                if name in said and said[name] != bounds[name][1]:
                    raise ValueError(f"tolerances.{output}.{name}: {{{'min' if bounds[name][1] else 'max'}: x}}, "
                                     f"but your callable declares {name} {'higher' if said[name] else 'lower'} is "
                                     f"better")
        return self

    def undirected(self) -> str | None:
        """The output (its `metrics:` key) whose function's metrics nothing says the direction of (which way is a
        loss): a callable declaring no names as higher/lower, with no {min: x}/{max: x} tolerance on its output
        either."""
        for output, m in self.metrics.items():
            if m.callable is None or m.callable.directions():
                continue
            bounded = [name for key, tol in self.tolerances.items() if key in ("*", output) or output == "*"
                       for name in tol.model_extra or {} if metric_direction(name) is None]
            if not bounded:
                return output
        return None

    def unbounded_errors(self) -> tuple[str, list[str]] | None:
        """The output (its `metrics:` key) and the names its function returns better lower that no {max: x}
        tolerance bounds: errors in their own units, which release's max_accuracy_drop does not weigh as a share
        (0.33 MOS is no 33% drop), so nothing would bound them."""
        for output, m in self.metrics.items():
            bounded = {name for key, tol in self.tolerances.items() if key in ("*", output) or output == "*"
                       for name in tol.model_extra or {}}
            unbounded = [name for name in (m.callable.lower if m.callable else []) if name not in bounded]
            if unbounded:
                return output, unbounded
        return None


def _wiring(spec: ValidateStage, upstream: Mapping[str, StageBase]) -> tuple[str, tuple[str, ...], str] | None:
    """repair and optional settings that cannot work with the variants the pipeline feeds this stage."""
    low = [n for n, up in upstream.items() if up.kind in ("precision", "calibrate")]
    unknown = [v for v in spec.optional if v not in low]
    if unknown:
        return (f"optional names {', '.join(unknown)}, not a precision or calibrate stage this stage checks",
                ("optional",), f"name some of: {', '.join(low)}" if low else "add a precision/calibrate stage")
    if spec.repair_variant is not None and spec.repair_variant not in low:
        return (f"repair_variant '{spec.repair_variant}' is not a precision or calibrate stage this stage checks",
                ("repair_variant",), f"name one of: {', '.join(low)}" if low else "add a precision/calibrate stage")
    if not spec.repair:
        return None
    if not low:
        return ("repair: true, but no precision or calibrate stage feeds this stage: there is no FP16/INT8 variant "
                "to repair", ("repair",), "remove repair, or validate FP16/INT8 variants")
    if len(low) > 1 and spec.repair_variant is None:
        return (f"repair: true with several FP16/INT8 variants ({', '.join(low)}): repair works on one",
                ("repair_variant",), f"set repair_variant: to one of {', '.join(low)}")
    return None


KIND = Kind("validate", ValidateStage,
            slots={"engines": Slot("engines", required=False, prefer=("build",)),
                   "models": Slot("onnx", many=True, required=False, prefer=MODEL_MAKERS),
                   "reference": Slot("onnx", prefer=("prepare",), source_ok=True),
                   "preprocess": PREPROCESS_SLOT},
            outputs={"report": "json", "plots": "plots"},  # plots: each candidate's errors and first bad layers
            libraries=("onnx", "onnxruntime", "opencv-python-headless", "scikit-image", "pycocotools"),
            preload=("onnxruntime", "cv2", "matplotlib.pyplot"),
            shared_caches=lambda p: (REFERENCE_CACHE,),
            # the repaired variant, and its engines (built at the failing engines' profiles and targets)
            more_outputs=lambda p: {"repaired": "onnx", "engines": "engines"} if p.repair else {},
            env=lambda p: TENSORRT_AND_GPU,
            gpu=lambda p: True,
            # the candidates that pass, those never to deploy, optional variants left out
            wiring=_wiring)
