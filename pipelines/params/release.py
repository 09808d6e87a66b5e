"""Stage `release`: per build target, the engine to deploy (chosen by a declared rule among those that passed
validation), as a Triton model repository and a model card."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping

from pydantic import Field

from trtflow import names
from trtflow.artifact import CLAIM_BYTES
from trtflow.names import ModelName, Name
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.pipelines.row import MODEL_MAKERS, PREPROCESS_SLOT, Kind, SharedArea, Slot
from trtflow.pipelines.schema import SampleData, StageBase
from trtflow.pipelines.units import Duration, Fraction
from trtflow.strict import Strict


class Select(Strict):
    """How the engine to ship is chosen among a target's engines."""
    require: Literal["validated", "built"] = Field(
        "validated", description="validated: only engines the validate stage passed (needs a validate stage); "
                                 "built: any engine that built. An engine validate failed is never chosen")
    prefer: Literal["throughput", "p99_latency", "size"] = Field(
        "throughput", description="throughput: the most samples/s measured; p99_latency: the lowest p99 latency at "
                                  "the smallest batch measured (declare benchmark shapes: [min, opt] to compare "
                                  "engines at batch 1); size: the smallest engine")
    max_accuracy_drop: Fraction | None = Field(
        None, ge=0, le=1, description="the most a candidate may lose against the FP32 reference on any task metric "
                                      "declared and measured by validate over all samples (top-1/top-5 agreement, "
                                      "text exact, CER, IoU, mean embedding cosine, detections' recall, precision "
                                      "and IoU, a decision's agreement, your function's better higher; the cosine "
                                      "where an output has none). The worst item's metrics (iou_min, iou_class_min, "
                                      "embedding_cosine, det_f1_min) move in steps of one image, and errors in an "
                                      "output's units (a regression's, your function's better lower) are no share: "
                                      "they are not weighed, validate's tolerances bound them", examples=["1%"])
    accuracy: Literal["fp32", "labels"] = Field(
        "fp32", description="what max_accuracy_drop weighs: fp32: the agreement with the FP32 reference on the task "
                            "metrics; labels: top-1 accuracy against validate's labels, below FP32's own (an "
                            "engine without labelled accuracy may not ship)")
    variants: list[str] = Field(default_factory=list, description="only engines of these model variants (stage "
                                                                  "names); default: all")
    profiles: list[Name] = Field(default_factory=list, description="only engines of these build profiles; "
                                                                  "default: all")
    lost_variant: Literal["keep_previous", "replace"] = Field(
        "keep_previous", description="when the engine a target's previous version shipped belongs to an optional "
                                     "variant validate left out of this run (a rebuild where INT8 no longer passes): "
                                     "keep_previous: no new version for that target, the previous one stays the one "
                                     "served and the card says why; replace: ship the best engine that passed")
    contract: Literal["fixed", "allow_change"] = Field(
        "fixed", description="fixed: only engines whose serving contract (input/output names, types, dims, profile "
                             "ranges, max_batch_size, batching) is the previous version's of the same model and "
                             "target may ship (the others are listed with what would change; with none left the "
                             "release fails, naming it); allow_change: any engine may (the card shows the change)")
    min_gain: Fraction = Field(
        0.05, ge=0, le=10, description="the least another engine must beat the one the previous version shipped "
                                       "by (on the preferred measure) to replace it; the margin applied is the "
                                       "largest of this and the benchmark's spread, within its run and across this "
                                       "machine's runs of the two engines", examples=["10%"])
    min_runs: int = Field(
        3, ge=1, le=10, description="how many benchmark runs of both engines on this machine (the benchmark's "
                                    "history keeps 10) another engine needs before it can replace the one the "
                                    "previous version shipped; they are compared by the median of their runs. "
                                    "Before that, the challenger's lead is reported and the shipped engine stays "
                                    "(a re-run of the benchmark, or the nightly schedule, adds runs); 1: replace on "
                                    "one run's numbers, beyond the margin", examples=[1])
    rollback: Literal["refuse", "allow"] = Field(
        "refuse", description="when the chosen engine is an earlier version's and a later version was released "
                              "(an older configuration run again): refuse: the release fails, naming both "
                              "versions; allow: ship it as a new version that says it rolls back (card, event, "
                              "console)")


class TritonSpec(Strict):
    """The Triton model repository written for the chosen engine(s)."""
    model_name: ModelName | None = Field(None, description="default: the pipeline's name")
    instances: int = Field(1, ge=1, le=64, description="model instances per GPU (per optimization profile)")
    max_batch_size: int | None = Field(None, ge=0, le=1 << 20, description=(
        "default: the largest batch every profile takes, where every input and output has a dynamic first "
        "dimension; 0: no batch dimension (e.g. an output whose first dimension counts detections, not samples); "
        "a smaller number caps it"))
    dynamic_batching: bool = Field(True, description="let Triton batch requests up to max_batch_size (only where "
                                                     "the engine's first dimension is a batch)")
    max_queue_delay: Duration = Field(0.0001, le=60, description="how long Triton may hold a request to batch it")
    gpus: list[Annotated[int, Field(ge=0, le=255)]] = Field(default_factory=list, description="GPU indices of the instance groups; default: all")
    preprocess: bool = Field(False, description="also a Python-backend model running the parity stage's "
                                                "preprocessing (trtflow's own steps, copied beside it: numpy, "
                                                "OpenCV and scipy, pinned in its requirements.txt) and an ensemble "
                                                "taking encoded images")
    warmup: bool = Field(True, description="model_warmup: a request per optimization profile at its opt shape, "
                                           "from the stage's `data` (the validation samples), before the model "
                                           "is ready")
    optimization: dict[str, Any] = Field(default_factory=dict, description=(
        "Triton's `optimization` block as is, checked with Triton's schema"),
        examples=[{"cuda": {"graphs": True}}])
    response_cache: bool = Field(False, description="Triton's response cache for this model (the server needs "
                                                    "--cache-config)")
    parameters: dict[str, str] = Field(default_factory=dict, description="Triton's `parameters` of the model "
                                                                         "(string values)")


class ReleaseStage(StageBase):
    kind: Literal["release"] = Field(description="this section's kind")
    select: Select = Field(default_factory=Select, examples=[{"require": "validated", "prefer": "throughput",
                                                              "max_accuracy_drop": "1%"}])
    triton: TritonSpec = Field(default_factory=TritonSpec, examples=[{"instances": 2, "max_queue_delay": "100us",
                                                                      "preprocess": True}])
    data: SampleData = Field(default_factory=lambda: SampleData(random=True, samples=1),
                             description="the samples Triton warms the model up with (triton.warmup): the "
                                         "validation images or tensors; default random")


def _unbounded_errors(upstream: Mapping[str, StageBase]) -> tuple[str, tuple[str, ...], str] | None:
    """A function's metrics better lower that nothing bounds: max_accuracy_drop weighs shares lost, and they are
    errors in their own units."""
    for name, up in upstream.items():
        found = up.unbounded_errors() if isinstance(up, ValidateStage) else None
        if found is not None:
            output, errors = found
            return (f"select.max_accuracy_drop weighs shares lost, and stages.{name}.metrics.{output}.callable "
                    f"declares {', '.join(errors)} better lower: errors in their own units, which it does not weigh "
                    f"(a MOS error of 0.33 is no 33% drop) and nothing bounds", ("select", "max_accuracy_drop"),
                    f"bound them in stages.{name}.tolerances.{output} with {{max: x}}, x in their units (e.g. "
                    f"{errors[0]}: {{max: 0.1}})")
    return None


def _wiring(spec: ReleaseStage, upstream: Mapping[str, StageBase]) -> tuple[str, tuple[str, ...], str] | None:
    kinds = {up.kind for up in upstream.values()}
    if "build" not in kinds:
        return ("a release ships engines, and no build stage feeds this stage", (), "add a build stage before it")
    if spec.select.require == "validated" and "validate" not in kinds:
        return ("select.require: validated, but no validate stage feeds this stage: nothing says which engines are "
                "fit to deploy", ("select", "require"), "add a validate stage before it, or set require: built")
    if spec.select.max_accuracy_drop is not None and "validate" not in kinds:
        return ("select.max_accuracy_drop needs the accuracy a validate stage measures", ("select",
                                                                                          "max_accuracy_drop"),
                "add a validate stage before it, or remove max_accuracy_drop")
    if spec.select.max_accuracy_drop is not None:
        for name, up in upstream.items():
            output = up.undirected() if isinstance(up, ValidateStage) else None
            if output is not None:
                ref = up.metrics[output].callable.function
                return (f"select.max_accuracy_drop weighs every metric validate measures, and nothing says which "
                        f"way the metrics of stages.{name}.metrics.{output}.callable ({ref}) are better",
                        ("select", "max_accuracy_drop"),
                        f"declare them there: callable: {{function: {ref}, higher: [...], lower: [...]}}, or bound "
                        f"them in stages.{name}.tolerances with {{min: x}} / {{max: x}}")
        unbounded = _unbounded_errors(upstream)
        if unbounded is not None:
            return unbounded
    makers = [n for n, up in upstream.items() if up.kind in MODEL_MAKERS] + ["source"]
    unknown = [v for v in spec.select.variants if names.unrepaired(v) not in makers]
    if unknown:
        return (f"select.variants names {', '.join(unknown)}, not a model variant this stage's engines are built "
                f"from", ("select", "variants"), f"name some of: {', '.join(makers)}")
    if spec.triton.preprocess and "parity" not in kinds:
        return ("triton.preprocess: true, but no parity stage declares the preprocessing", ("triton", "preprocess"),
                "add a parity stage before it, or remove preprocess")
    if spec.select.prefer != "size" and "benchmark" not in kinds:
        return (f"select.prefer: {spec.select.prefer} needs a benchmark stage's numbers", ("select", "prefer"),
                "add a benchmark stage before it, or prefer: size")
    return None


# the versions released so far, per model and target: a record per version, created once by a claim, kept for
# every machine of a remote store
RELEASES = SharedArea("releases/", CLAIM_BYTES, claimed=True)

KIND = Kind("release", ReleaseStage,
            slots={"engines": Slot("engines", prefer=("build",)),
                   # validate's verdict and accuracy, and its repaired engines (candidates like the others)
                   "validation": Slot("json", required=False, prefer=("validate",)),
                   "repaired": Slot("engines", required=False, prefer=("validate",)),
                   "benchmark": Slot("json", required=False, prefer=("benchmark",)),
                   # the pictures the card shows: validate's of each shipped engine, benchmark's latencies
                   "validation_plots": Slot("plots", required=False, prefer=("validate",)),
                   "benchmark_plots": Slot("plots", required=False, prefer=("benchmark",)),
                   # what the card shows: the variants' own reports (nodes left in higher precision), the
                   # preprocessing as declared and parity's verdict on it
                   "variant_reports": Slot("json", many=True, required=False, prefer=("precision", "calibrate")),
                   "parity": Slot("json", required=False, prefer=("parity",)),
                   # prepare's report: what was changed in the model (its rewrites), for the card
                   "preparation": Slot("json", required=False, prefer=("prepare",)),
                   "preprocess": PREPROCESS_SLOT},
            outputs={"triton": "dir", "card": "file", "report": "json"},
            # scikit-image: the selection reads how each metric is weighed from its declaration, which shares its
            # module with its computation (trtflow/metrics/builtin/image.py computes SSIM)
            libraries=("onnx", "onnxruntime", "opencv-python-headless", "scikit-image"),
            preload=("cv2",),
            # the versions released so far, per model and target: outside the key, like benchmark baselines
            shared_caches=lambda p: ("releases",),
            shared=(RELEASES,),
            ships_plugins=True,  # their libraries go into the Triton repository (stages/release/stage.py)
            wiring=_wiring)
