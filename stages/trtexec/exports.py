"""The JSON files trtexec writes with `--exportTimes`, `--exportProfile` and `--exportLayerInfo`, each parsed once
into typed records (trtexec's own key names stay here, as the models' aliases)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, Field, TypeAdapter, ValidationError, field_validator

from trtflow import files
from trtflow.errors import StageError
from trtflow.stages.trtexec.result import Layer

EXPORT_BYTES = 2**30  # --exportProfile of a large network with many iterations runs to hundreds of MB


@dataclass(frozen=True)
class ExportFiles:
    """Where one trtexec run writes its exports (`beside` its log's stem)."""
    times: Path  # --exportTimes
    profile: Path  # --exportProfile
    layers: Path  # --exportLayerInfo

    @classmethod
    def beside(cls, stem: Path) -> ExportFiles:
        return cls(stem.with_suffix(".times.json"), stem.with_suffix(".profile.json"),
                   stem.with_suffix(".layers.json"))


def _load(path: Path, what: str, shape: TypeAdapter[Any], expected: str) -> Any:
    try:
        data = files.read_json(path, EXPORT_BYTES)
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: not a trtexec {what} JSON ({type(exc).__name__}: {str(exc)[:120]})") from None
    try:
        return shape.validate_python(data)
    except ValidationError:
        raise StageError(f"{path}: not a trtexec {what} JSON (expected {expected})") from None


class _Iteration(BaseModel):
    """One record of --exportTimes, in milliseconds (10.x names first, then 8.x); a value that is not a number
    is left out."""
    start_enqueue: float | None = Field(None, alias="startEnqMs")
    end_enqueue: float | None = Field(None, alias="endEnqMs")
    latency: float | None = Field(None, alias="latencyMs")
    gpu_compute: float | None = Field(None, alias="computeMs")
    h2d: float | None = Field(None, validation_alias=AliasChoices("h2dMs", "inMs"))
    d2h: float | None = Field(None, validation_alias=AliasChoices("d2hMs", "outMs"))
    end_to_end: float | None = Field(None, alias="endToEndMs")

    @field_validator("*", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Times(BaseModel):
    """--exportTimes: per iteration, milliseconds of latency, GPU compute, enqueue, H2D, D2H and end-to-end
    (empty where trtexec wrote none)."""
    latency_ms: list[float] = []
    gpu_compute_ms: list[float] = []
    enqueue_ms: list[float] = []
    h2d_ms: list[float] = []
    d2h_ms: list[float] = []
    end_to_end_ms: list[float] = []


_TIMES = TypeAdapter(list[_Iteration])


def read_times(path: Path) -> Times:
    records = _load(path, "--exportTimes", _TIMES, "a list of per-iteration records")

    def column(values: list[float | None]) -> list[float]:
        return [v for v in values if v is not None]

    return Times(latency_ms=column([r.latency for r in records]),
                 gpu_compute_ms=column([r.gpu_compute for r in records]),
                 enqueue_ms=[r.end_enqueue - r.start_enqueue for r in records
                             if r.start_enqueue is not None and r.end_enqueue is not None],
                 h2d_ms=column([r.h2d for r in records]), d2h_ms=column([r.d2h for r in records]),
                 end_to_end_ms=column([r.end_to_end for r in records]))


class _ProfileRecord(BaseModel):
    """One record of --exportProfile: the iteration count (the first), or a layer's times."""
    count: int | None = None
    name: str | None = None
    total_ms: float | None = Field(None, alias="timeMs")
    average_ms: float | None = Field(None, alias="averageMs")
    median_ms: float | None = Field(None, alias="medianMs")  # before trtexec 8.4: none
    percent: float | None = Field(None, alias="percentage")


class Profile(BaseModel):
    """--exportProfile: how many iterations were profiled, and the layers slowest first."""
    count: int | None = None
    layers: list[Layer] = []


_PROFILE = TypeAdapter(list[_ProfileRecord | Any])  # records that are no object are skipped


def read_profile(path: Path) -> Profile:
    records = [r for r in _load(path, "--exportProfile", _PROFILE, "a list") if isinstance(r, _ProfileRecord)]
    count = next((r.count for r in records if r.name is None and r.count is not None), None)
    layers = [Layer(name=r.name, total_ms=r.total_ms, average_ms=r.average_ms, median_ms=r.median_ms,
                    percent=r.percent) for r in records if r.name is not None]
    layers.sort(key=lambda layer: -(layer.average_ms or 0))
    return Profile(count=count, layers=layers)


class _DetailedLayer(BaseModel):
    name: str | None = Field(None, alias="Name")
    type: str | None = Field(None, alias="LayerType")


class _LayerInfoFile(BaseModel):
    layers: list[_DetailedLayer | str | Any] = Field(alias="Layers")
    bindings: list[Any] = Field([], alias="Bindings")


class EngineLayer(BaseModel):
    name: str | None
    type: str | None = None  # None where trtexec wrote names only (no --profilingVerbosity=detailed)


class LayerInfo(BaseModel):
    """--exportLayerInfo: the engine's layers (with their types where the export is detailed), its bindings."""
    layers: list[EngineLayer]
    bindings: list[Any]
    detailed: bool


def read_layer_info(path: Path) -> LayerInfo:
    data = _load(path, "--exportLayerInfo", TypeAdapter(_LayerInfoFile), "an object with 'Layers'")
    layers = [EngineLayer(name=layer.name, type=layer.type) if isinstance(layer, _DetailedLayer)
              else EngineLayer(name=str(layer)) for layer in data.layers]
    return LayerInfo(layers=layers, bindings=data.bindings,
                     detailed=any(isinstance(layer, _DetailedLayer) for layer in data.layers))
