"""Each engine's past measurements on this machine: the noise a ranking must beat is measured the way it happens,
across runs, not only within one.

On a shared machine the same engine measured in two runs moves more than its iterations spread within one run (a
neighbour's load comes and goes between runs). The benchmark appends every cell it measured to
`shared/benchmark/history/<machine>/<engine>.json` (the store's shared caches, outside the key, synced to every
machine of a remote store like the baselines beside it) and gives each cell the spread of its last `RUNS` runs
here; the release replaces a shipped engine only by a margin beyond it.

`<machine>` is a digest of this machine's name in the fleet (`TRTFLOW_MACHINE`, else the host name; a name never
becomes a path), `<engine>` the engine file's digest: a rebuilt engine starts a history of its own. Entries measured
on another runtime or GPU than this run's (`MeasuredOn`) are not weighed.
"""
from __future__ import annotations

import hashlib
import socket
import statistics
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, TypeAdapter, ValidationError

from trtflow import files, settings
from trtflow.pipelines.params.benchmark import HISTORY
from trtflow.stages.benchmark.report import MeasuredOn, Measurement, RunSpread

RUNS = 10  # runs kept per cell and machine: the spread is of these
FOLDER = HISTORY.path("history")


class Past(BaseModel):
    """One cell of one run, as the history keeps it."""
    at: str
    environment: MeasuredOn
    samples_per_s: float | None = None
    p99_ms: float | None = None


_HISTORY = TypeAdapter(dict[str, list[Past]])  # a history file: cell -> its runs, oldest first


def machine() -> str:
    """This machine in a fleet (`$TRTFLOW_MACHINE`, else the host name: a container's changes each run), as a
    digest."""
    return hashlib.sha256((settings.MACHINE.get() or socket.gethostname()).encode()).hexdigest()[:16]


def path(shared: Path, engine_id: str) -> Path:
    return shared / FOLDER / machine() / f"{engine_id}.json"


def read(file: Path) -> dict[str, list[Past]]:
    """The history in `file`; empty where there is none, or it cannot be read (a cache: it starts again)."""
    try:
        return _HISTORY.validate_python(files.read_json(file, files.RECORD_BYTES, follow=False))
    except (OSError, ValueError, TypeError, ValidationError):
        return {}


def add(file: Path, cells: list[Measurement]) -> None:
    """This run's cells appended to the history in `file` (the last RUNS kept), and each cell given the spread of
    the runs of it measured here in the same environment, this one included."""
    history = read(file)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for cell in cells:
        if not cell.ok:
            continue
        runs = history.setdefault(cell.cell, [])
        runs.append(Past(at=now, environment=cell.environment, samples_per_s=cell.samples_per_s,
                         p99_ms=cell.result.latency().p99))
        del runs[:-RUNS]
        cell.run_spread = spread([r for r in runs if not r.environment.differs(cell.environment)])
    file.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(file, _HISTORY.dump_json(history, indent=1))


def spread(runs: list[Past]) -> RunSpread:
    """How far the runs of one cell lie apart: (largest - smallest) / median, of the throughput and of the p99."""
    def of(values: list[float]) -> float | None:
        if len(values) < 2:
            return None
        mid = statistics.median(values)
        return (max(values) - min(values)) / mid if mid > 0 else None
    rates, p99s = [r.samples_per_s for r in runs if r.samples_per_s], [r.p99_ms for r in runs if r.p99_ms]
    return RunSpread(runs=len(runs), throughput=of(rates), p99=of(p99s),
                     median_samples_per_s=statistics.median(rates) if rates else None,
                     median_p99_ms=statistics.median(p99s) if p99s else None)
