"""What the parameter models of every stage kind share (`pipelines/params/<kind>.py` holds each kind's own).

Fields that only steer execution (retries, timeout, description, inputs) live on ``StageBase``;
everything else a stage model declares is a parameter of the stage's work and enters its cache key.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from trtflow.pipelines.units import Duration, Size
from trtflow.strict import Strict

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
