"""Building cells: each in its own worker process (`build_worker.py`), at most `parallel` at a time, so a crash
inside TensorRT fails that cell with a report instead of the stage. The build stage builds its matrix this way,
and validate its repaired engines."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from trtflow import child, progress
from trtflow.stages.trt import plugins as trt_plugins
from trtflow.stages.trt.build_worker import REQUEST, BuildRequest
from trtflow.stages.trt.preflight import hint_for
from trtflow.stages.trt.records import BUILT, SPEC, Built, Cell

CELL_TIMEOUT_S = 3600


def build_cells(cells: list[Cell], engines: Path, parallel: int) -> list[Built]:
    """Each cell in its own worker process, `parallel` at a time, with the pipeline's plugins loaded; results in the
    order of `cells`."""
    plugins = trt_plugins.declared()  # here: the pool's threads do not see this thread's context
    with ThreadPoolExecutor(max_workers=parallel) as pool:  # threads wait; the builds are processes
        futures = [pool.submit(build_cell, c, engines / c.name, plugins) for c in cells]
        for n, _ in enumerate(as_completed(futures), 1):  # progress from this thread: listeners need its context
            progress.report("building engines", n, len(cells))
        return [f.result() for f in futures]


def build_cell(cell: Cell, cell_dir: Path, plugins: list[trt_plugins.PluginLoad] | None = None) -> Built:
    """`cell` built by a worker process in `cell_dir` (made), with `plugins` (default: the pipeline's) loaded."""
    cell_dir.mkdir()
    loads = trt_plugins.declared() if plugins is None else plugins
    request: Cell = cell
    names = (SPEC, BUILT)  # the Cell is the request and the record
    if loads:  # the record stays the Cell (the engine cache and validate read it as one); the request adds them
        (cell_dir / SPEC).write_text(cell.model_dump_json(indent=2) + "\n")
        request, names = BuildRequest.model_validate({**cell.model_dump(), "plugins": loads}), (REQUEST, BUILT)
    try:
        outcome = child.call("trtflow.stages.trt.build_worker", request, Built, cell_dir, CELL_TIMEOUT_S,
                             names=names, what=f"the build of engine {cell.name}",
                             env=trt_plugins.child_env(cell.backend, loads))
    finally:
        (cell_dir / REQUEST).unlink(missing_ok=True)
    if isinstance(outcome, child.Answered):
        built = outcome.response
    else:  # the process died inside TensorRT before it could say anything, or hung there
        built = Built(status="failed", error=f"the build process {outcome.text()}")
        built.write(cell_dir)
    for failure in built.failures:
        failure.hint = hint_for(failure)
    return built
