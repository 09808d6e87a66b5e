"""Building cells: each in its own worker process (`build_worker.py`), at most `parallel` at a time, so a crash
inside TensorRT fails that cell with a report instead of the stage. The build stage builds its matrix this way,
and validate its repaired engines."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from trtflow import child, progress
from trtflow.stages.trt.engines import BUILT, SPEC, Built, Cell
from trtflow.stages.trt.preflight import hint_for

CELL_TIMEOUT_S = 3600


def build_cells(cells: list[Cell], engines: Path, parallel: int) -> list[Built]:
    """Each cell in its own worker process, `parallel` at a time; results in the order of `cells`."""
    with ThreadPoolExecutor(max_workers=parallel) as pool:  # threads wait; the builds are processes
        futures = [pool.submit(build_cell, c, engines / c.name) for c in cells]
        for n, _ in enumerate(as_completed(futures), 1):  # progress from this thread: listeners need its context
            progress.report("building engines", n, len(cells))
        return [f.result() for f in futures]


def build_cell(cell: Cell, cell_dir: Path) -> Built:
    cell_dir.mkdir()
    outcome = child.call("trtflow.stages.trt.build_worker", cell, Built, cell_dir, CELL_TIMEOUT_S,
                         names=(SPEC, BUILT), what=f"the build of engine {cell.name}")
    if isinstance(outcome, child.Answered):
        built = outcome.response
    else:  # the process died inside TensorRT before it could say anything, or hung there
        built = Built(status="failed", error=f"the build process {outcome.text()}")
        built.write(cell_dir)
    for failure in built.failures:
        failure.hint = hint_for(failure)
    return built
