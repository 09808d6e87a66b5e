"""The numbers of one benchmark run, whoever produced them (trtexec's log, the built-in harness): one schema."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

STAT_KEYS = ("latency_ms", "gpu_compute_ms", "enqueue_ms", "h2d_ms", "d2h_ms", "end_to_end_ms")


def _unset(v: Any) -> bool:
    return v is None


class Stats(BaseModel):
    """One measure's statistics in milliseconds, those printed (or computed) only: min/max/mean/median and
    percentiles, the usual ones as fields, any other as printed ("p99.9", an extra field)."""
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, float] = Field(init=False)

    min: float | None = Field(None, exclude_if=_unset)
    max: float | None = Field(None, exclude_if=_unset)
    mean: float | None = Field(None, exclude_if=_unset)
    median: float | None = Field(None, exclude_if=_unset)
    p90: float | None = Field(None, exclude_if=_unset)
    p95: float | None = Field(None, exclude_if=_unset)
    p99: float | None = Field(None, exclude_if=_unset)


class Layer(BaseModel):
    """One row of trtexec's per-layer profile (its log's table or --exportProfile), slowest first."""
    name: str
    total_ms: float | None = None
    average_ms: float | None = None
    median_ms: float | None = None  # None before trtexec 8.4
    percent: float | None = None


class PerfRecord(BaseModel):
    """A PerfResult as a report stores it (the benchmark's cells, its baselines)."""
    tensorrt_version: str | None = None
    status: str | None = None
    throughput_qps: float | None = None
    latency_ms: Stats | None = None
    gpu_compute_ms: Stats | None = None
    enqueue_ms: Stats | None = None
    h2d_ms: Stats | None = None
    d2h_ms: Stats | None = None
    end_to_end_ms: Stats | None = None
    total_host_walltime_s: float | None = None
    total_gpu_compute_s: float | None = None
    warnings: list[str] = []
    error: str | None = None
    command: str | None = None
    layout: str | None = None
    runtime: str | None = None
    profile: list[Layer] | None = None
    has_summary: bool = False
    note: str | None = Field(None, exclude_if=lambda v: v is None)  # why there are no numbers

    def latency(self) -> Stats:
        """The latency a reader quotes: the host latency where measured, else the GPU compute time."""
        return next((s for s in (self.latency_ms, self.gpu_compute_ms) if s is not None), Stats())


@dataclass
class PerfResult:
    """One benchmark run's numbers, from trtexec's log or the built-in harness. Every measure is a dict of
    min/max/mean/median/pNN as printed, or None when there is no such line; nothing is ever filled with zeros."""
    tensorrt_version: str | None = None
    status: str | None = None  # "passed" | "failed" | None (the log has no &&&& line)
    command: str | None = None
    throughput_qps: float | None = None
    latency_ms: dict[str, float] | None = None
    gpu_compute_ms: dict[str, float] | None = None
    enqueue_ms: dict[str, float] | None = None
    h2d_ms: dict[str, float] | None = None
    d2h_ms: dict[str, float] | None = None
    end_to_end_ms: dict[str, float] | None = None
    total_host_walltime_s: float | None = None
    total_gpu_compute_s: float | None = None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    layout: str | None = None  # which trtexec layout the numbers came from
    last_line: str | None = None  # the last message before the &&&& status, for a failure without an error
    runtime: str | None = None  # what produced the numbers: trtexec, a TensorRT engine, or ONNX Runtime
    profile: list[Layer] | None = None  # trtexec's per-layer table (--dumpProfile), slowest first
    samples_ms: list[float] | None = field(default=None, repr=False)  # per-iteration latencies, when known

    @property
    def has_summary(self) -> bool:
        return self.throughput_qps is not None or any(getattr(self, k) for k in STAT_KEYS)

    def record(self) -> PerfRecord:
        return PerfRecord(**{k: getattr(self, k) for k in PerfRecord.model_fields if k not in ("has_summary", "note")},
                          has_summary=self.has_summary, note=None if self.has_summary else self.no_summary_reason())

    def to_json(self) -> dict[str, Any]:
        return self.record().model_dump()

    def no_summary_reason(self) -> str:
        if self.error and self.runtime and not self.runtime.startswith("trtexec"):
            return self.error  # the built-in harness's own words
        if self.error:
            why = f": trtexec says {self.error!r}"
        elif self.status == "failed":
            why = f": trtexec failed without an error line; its last line was {self.last_line!r}"
        else:
            why = ""
        return f"the log holds no performance summary (a failed build, --skipInference, or a cut log){why}"
