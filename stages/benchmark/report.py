"""Stage `benchmark`'s report: per cell (engine or variant x profile x shape point) the numbers and the runtime
that produced them, the regression gate's verdict, GPU telemetry."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trtflow import markdown as md
from trtflow.precisions import Precision
from trtflow.records import Recorded
from trtflow.stages.trt.records import TelemetrySummary
from trtflow.stages.trtexec.result import Layer, PerfRecord


class MeasuredOn(Recorded):
    """What a baseline must share with a measurement to be compared with it."""
    runtime: str | None = None  # the runtime's name (with ONNX Runtime's version and settings, its whole label)
    tensorrt: str | None = None  # the version trtexec printed
    gpu: str | None = None  # each GPU with its driver, or "none"
    host: str | None = None  # the CPU, for ONNX Runtime's numbers

    def differs(self, other: MeasuredOn) -> list[str]:
        """The fields whose values differ (one side's absent field counts as null)."""
        mine, theirs = self.model_dump(mode="json"), other.model_dump(mode="json")
        return [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]


class RunSpread(BaseModel):
    """How far this cell's runs on this machine lie apart (`history.spread`): (largest - smallest) / median."""
    runs: int = 1  # how many runs in the same environment, this one included
    throughput: float | None = None  # None: fewer than two runs
    p99: float | None = None
    median_samples_per_s: float | None = None  # over those runs: what a ranking over time compares
    median_p99_ms: float | None = None


class Measurement(BaseModel):
    cell: str
    candidate: str
    variant: str
    precision: Precision
    profile: str | None
    point: str  # "min", "opt" or "max"
    shapes: dict[str, list[int]]
    environment: MeasuredOn
    result: PerfRecord
    slowest_layers: list[Layer] = []
    iterations: int | None = None
    batch: int = 1  # axis 0 of the inputs: throughput_qps counts batches, samples_per_s samples
    samples_per_s: float | None = None
    run_spread: RunSpread | None = None  # across this machine's runs of the same engine (benchmark/history.py)
    samples_ms: list[float] | None = Field(None, exclude=True)  # per iteration: the plot's, not the report's

    @property
    def ok(self) -> bool:
        return self.result.has_summary


class Baseline(BaseModel):
    """What the gate compares a cell with: a cell of an earlier run (its baseline file, or a report's cell)."""
    cell: str
    environment: MeasuredOn
    result: PerfRecord


class BaselineReport(BaseModel):
    """A benchmark report.json given as `gate.baseline`: only what the gate reads."""
    cells: list[Baseline]


class Gate(BaseModel):
    baseline: str | None = None  # what the cells were compared with (None: no gate)
    violations: list[str] = []
    skipped: list[str] = []
    skipped_lines: list[str] = []


class BenchmarkReport(BaseModel):
    tool: str
    trtexec: str | None
    trtexec_looked: list[str]
    tensorrt_version: str | None
    cells: list[Measurement]
    telemetry: TelemetrySummary
    gate: Gate
    warnings: list[str]
    not_measured: dict[str, str] = {}  # candidate -> why it was left out (it failed validation)
    plots: list[str] = Field([], exclude=True)

    def summary(self) -> str:
        lines = [f"# benchmark: {len(self.cells)} measurement(s) by {md.text(self.tool)}", ""]
        if self.tool != "trtexec":
            looked = ', '.join(md.text(p) for p in self.trtexec_looked) or 'nowhere: tool: builtin'
            lines += [f"trtexec was not found (looked in: {looked}); numbers below name the runtime that produced "
                      "them.", ""]
        lines += ["| cell | runtime | batches/s | samples/s | mean (ms) | p99 (ms) | iterations | samples/s across "
                  "this machine's runs | status |", "|---|---|---|---|---|---|---|---|---|"]
        for c in self.cells:
            res = c.result
            lat = res.latency()
            lines.append(f"| {md.text(c.cell)} | {md.text(res.runtime or '-')} | {_num(res.throughput_qps)} | "
                         f"{_num(c.samples_per_s)} | {_num(lat.mean)} | {_num(lat.p99)} | "
                         f"{c.iterations or '-'} | {_across(c.run_spread)} | "
                         f"{'ok' if c.ok else 'failed: ' + md.text(res.note)} |")
        if self.not_measured:
            lines += ["", "**not measured** (they failed validation and must not be deployed):"]
            lines += [f"- {md.code(n)}: {md.text(why)}" for n, why in self.not_measured.items()]
        g = self.gate
        if g.baseline:
            lines += ["", f"**gate** against {md.text(g.baseline)}: "
                      + ("passed" if not g.violations else f"{len(g.violations)} regression(s)")]
            lines += [f"- regression: {md.text(v)}" for v in g.violations]
            lines += [f"- skipped: {md.text(s)}" for s in g.skipped]
        tele = self.telemetry
        lines += ["", "**GPU telemetry**: " + (md.text(tele.why or "none") if not tele.available else
                                               f"{tele.samples or 0} samples, throttled: "
                                               f"{', '.join(md.text(r) for r in tele.throttled or []) or 'no'}")]
        for c in [c for c in self.cells if c.slowest_layers][:1]:
            lines += ["", f"**slowest layers** of {md.text(c.cell)}:", "", "| layer | average (ms) | share |",
                      "|---|---|---|"]
            lines += [md.row([layer.name, layer.average_ms, f"{layer.percent}%"])
                      for layer in c.slowest_layers]
        lines += [f"\n{md.image('latency', p)}" for p in self.plots]
        if self.warnings:
            lines += ["", "Warnings:"] + [f"- {md.text(w)}" for w in self.warnings]
        return "\n".join(lines) + "\n"


def _across(s: RunSpread | None) -> str:
    if s is None or s.throughput is None:
        return "first run"
    return f"{s.throughput:.1%} apart over {s.runs} runs"


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, (int, float)) else "-"
