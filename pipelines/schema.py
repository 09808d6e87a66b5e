"""What the parameter models of every stage kind share (`pipelines/params/<kind>.py` holds each kind's own).

Fields that only steer execution (retries, timeout, description, inputs) live on ``StageBase``;
everything else a stage model declares is a parameter of the stage's work and enters its cache key.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from trtflow.pipelines.units import Duration

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

    def named_model_inputs(self) -> list[tuple[str, tuple]]:
        """Inputs of the model this stage reads that a parameter names: (input name, key path), checked against the
        pipeline's model before anything runs where that model is what the stage reads."""
        return []

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
