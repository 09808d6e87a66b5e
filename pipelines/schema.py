"""What the parameter models of every stage kind share (`pipelines/params/<kind>.py` holds each kind's own).

Fields that only steer execution (retries, timeout, description, inputs) live on ``StageBase``;
everything else a stage model declares is a parameter of the stage's work and enters its cache key.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from trtflow.pipelines.units import Duration

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



def yaml_off(value: Any) -> Any:
    """For `auto`/`off` settings: YAML 1.1 reads a bare `off` as false (and `on` as true)."""
    return {False: "off", True: "auto"}.get(value, value) if isinstance(value, bool) else value

class Strict(BaseModel):
    # `.inf` and `.nan` are YAML floats: no count, bound or tolerance of trtflow's means anything with them
    # defer_build: a run validates the few kinds its pipeline uses; building every kind's validator at import took
    # 0.37 s of every `trtflow run`, cached ones included
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False, defer_build=True)


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

    def named_model_inputs(self) -> list[tuple[str, tuple]]:
        """Inputs of the model this stage reads that a parameter names: (input name, key path), checked against the
        pipeline's model before anything runs where that model is what the stage reads."""
        return []

    def code_refs(self) -> list[str]:
        """User callables (package.module:function) named in the parameters: a declared metric's function."""
        metrics = getattr(self, "metrics", None) or {}
        return [m.callable for m in metrics.values() if m.callable]

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
    pad: dict[str, float] = Field(
        default_factory=dict, description="validate, where it makes files into a profile's larger shape: per input, "
                                          "the value it is padded with, e.g. {input_ids: 1} (the tokenizer's pad id); "
                                          "inputs not named: integers padded with 0, floats repeat their content")
    seed: int = 0

    @model_validator(mode="after")
    def _one_of(self) -> "SampleData":
        if sum((self.images is not None, self.tensors is not None, self.random)) > 1:
            raise ValueError("give only one of 'images', 'tensors' or 'random: true'")
        for name, bounds in self.ranges.items():
            if len(bounds) != 2 or bounds[0] > bounds[1]:
                raise ValueError(f"ranges.{name}: give [low, high] with low <= high, got {bounds}")
        return self


# --- task-level accuracy (validate's gate, the precision/calibrate pre-flights) -------------------------

class TopKMetric(Strict):
    k: int = Field(5, ge=1, le=1000, description="the reference's class must be among the candidate's top k")
    axis: int = Field(-1, description="the class axis")


class CTCMetric(Strict):
    blank: int = Field(0, ge=0, description="the CTC blank's class index")
    axis: int = Field(-1, description="the class axis; the other non-batch axis is time")


class MapMetric(Strict):
    threshold: float = Field(0.5, description="a map value above this marks a region")


class EmbeddingMetric(Strict):
    axis: int = Field(-1, description="the embedding axis")
    pool: Literal["none", "mean"] = Field(
        "none", description="mean: average the axes between batch and axis first (token embeddings -> one vector "
                            "per sentence); none: each sample's whole output is its embedding")
    mask: str | None = Field(None, description="with pool: mean, the model input holding each token's mask (1 a "
                                               "real token, 0 padding): the mean over real tokens only, as "
                                               "sentence-transformers pools")


class OutputMetrics(Strict):
    """How one output's users judge it, beside the elementwise metrics. Names each gives (which tolerances may
    bound): topk -> top1, top<k>; ctc -> text_exact, cer; map_iou -> iou, iou_min; embedding -> embedding_cosine
    (worst sample), embedding_cosine_mean; callable -> the names its function returns."""
    topk: TopKMetric | None = None
    ctc: CTCMetric | None = None
    map_iou: MapMetric | None = None
    embedding: EmbeddingMetric | None = None
    callable: str | None = Field(None, pattern=CUSTOM_KIND,
                                 description="package.module:function(reference, candidate) -> {name: value}, "
                                             "called per batch of one output; each value's mean is reported")

    def names(self) -> set[str]:
        """The metric names the built-in metrics give (a callable's names are known when it runs)."""
        out: set[str] = set()
        if self.topk:
            out |= {"top1", f"top{self.topk.k}"}
        if self.ctc:
            out |= {"text_exact", "cer"}
        if self.map_iou:
            out |= {"iou", "iou_min"}
        if self.embedding:
            out |= {"embedding_cosine", "embedding_cosine_mean"}
        return out


# the direction of each metric name trtflow gives: a candidate must reach at least these, and at most the others
HIGHER_IS_BETTER = frozenset({"cosine", "text_exact", "iou", "iou_min", "embedding_cosine",
                              "embedding_cosine_mean", "top1", "top5"})
LOWER_IS_BETTER = frozenset({"cer", "max_abs", "mean_abs", "max_rel", "rtol"})


def higher_is_better(metric: str) -> bool:
    return metric in HIGHER_IS_BETTER or (metric.startswith("top") and metric[3:].isdigit())


def metric_direction(name: str) -> bool | None:
    """True: a metric of trtflow's that must be at least its bound; False: at most; None: not trtflow's."""
    if name in LOWER_IS_BETTER:
        return False
    return True if higher_is_better(name) else None


Metrics = Annotated[dict[str, OutputMetrics], Field(
    default_factory=dict, description="task-level metrics per output name, or '*' for every output")]
