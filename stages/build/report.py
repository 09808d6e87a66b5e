"""Stage `build`'s report: per engine of the build matrix what it was built from and what building it gave."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from trtflow import markdown as md
from trtflow.precisions import Precision
from trtflow.records import Recorded
from trtflow.stages.trt.records import Backend, Built, Cell, Gpu, Validity


class CellRow(Built):
    """A cell as the report lists it: what building it gave, and which cell it is."""
    name: str
    variant: str
    precision: Precision
    target: str
    profiles: list[str]  # profile names
    shapes: dict[str, dict[str, Any]]  # profile -> input -> (min, opt, max)

    @classmethod
    def of(cls, cell: Cell, built: Built) -> "CellRow":
        return cls(**built.model_dump(exclude_none=True), name=cell.name, variant=cell.variant,
                   precision=cell.precision, target=cell.target, profiles=[p.name for p in cell.profiles],
                   shapes={p.name: p.shapes for p in cell.profiles})


class BuildEnvironment(Recorded):
    """What the stage built with: the TensorRT backend, and this machine's GPUs (None: none)."""
    tensorrt: Backend
    gpu: list[Gpu] | None = None


class BuildReport(BaseModel):
    backend: Backend
    environment: BuildEnvironment
    cells: list[CellRow]
    wall_seconds: float
    parallel: int
    timing_cache: str | None
    warnings: list[str]

    @property
    def failed(self) -> list[CellRow]:
        return [c for c in self.cells if not c.ok]

    def summary(self) -> str:
        be = self.backend
        lines = [f"### build · {md.text(be.flavour)} {md.text(be.version)} · "
                 f"{len(self.cells) - len(self.failed)}/{len(self.cells)} "
                 f"engines · {self.wall_seconds:.1f} s wall ({self.parallel} in parallel)", "",
                 "| engine | variant | precision | profiles | target | status | size MB | build s | layers | peak host "
                 "MB | valid here |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in self.cells:
            v = c.validity or Validity()
            diagnostics = f" ({', '.join(v.diagnostics)})" if v.diagnostics else ""
            valid = md.text((v.validity or "?") + diagnostics) if v.checked else "unknown"
            status = (("ok (engine cache)" if c.reused else "ok") if c.ok
                      else f"**failed**: {md.text((c.error or '')[:120])}")
            lines.append(f"| {md.code(c.name, cell=True)} | {md.text(c.variant)} | {md.text(c.precision)} | "
                         f"{', '.join(md.text(n) for n in c.profiles)} | {md.text(c.target)} | "
                         f"{status} | {c.engine_bytes / 1e6:.2f} | {c.seconds:.2f} | "
                         f"{c.layers if c.layers is not None else ''} | "
                         f"{c.peak_host_memory_mb if c.peak_host_memory_mb is not None else ''} | {valid} |")
        lines += [f"\n**warning**: {md.text(w)}" for w in self.warnings]
        lines += ["", "Engines cannot run on this machine unless it has a GPU the engine targets; `valid here` is "
                      "TensorRT-RTX's own verdict (Runtime.get_engine_validity)."]
        return "\n".join(lines) + "\n"
