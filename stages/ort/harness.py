"""The built-in harness where trtexec is absent and no engine can run: the candidate's ONNX variant timed on ONNX
Runtime (CPU) the way trtexec times an engine — warm-up for a while, then iterations for a duration or a count
(never fewer than `min_iterations`: percentiles need samples), each timed on the host, inputs made once. Its
numbers are labelled as ONNX Runtime's, never as TensorRT's.

Each measurement runs in its own process (`trtflow.child`'s convention: `python -m trtflow.stages.ort.harness
request.json response.json`): ONNX Runtime can crash on a variant (a ViT FP16 variant: SIGSEGV at session
creation in ONNX Runtime 1.32 with its graph optimizations on), and a crash fails that measurement, with its log,
not the stage. The session is made as every other stage makes it (`runner.session`: graph optimizations off, the
level the variant was checked with)."""
from __future__ import annotations

import contextvars
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel

from trtflow import child, files, phases
from trtflow.stages.trtexec.result import PerfResult

RUNTIME = "onnxruntime-cpu (CPUExecutionProvider; not a TensorRT number)"
PERCENTILES = (90, 95, 99)
TIMEOUT_S = 3600


def latency_stats(samples_ms: list[float]) -> dict[str, float]:
    a = np.asarray(samples_ms, dtype=np.float64)
    out = {"min": float(a.min()), "max": float(a.max()), "mean": float(a.mean()), "median": float(np.median(a))}
    out.update({f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES})
    return out


def time_calls(call: Callable[[], Any], warmup_s: float, duration_s: float, iterations: int | None,
               min_iterations: int = 1, on_first: Callable[[float], None] | None = None) -> tuple[list[float], float]:
    """(per-call milliseconds, wall seconds of the timed part) after `warmup_s` of untimed calls: `iterations`
    calls, else calls for `duration_s` and at least `min_iterations`. `on_first` hears the seconds of one call as
    soon as they are known (after the warm-up, else after the first timed call): what the whole will take."""
    warm, begun = 0, time.perf_counter()
    end = begun + warmup_s
    while time.perf_counter() < end:
        call()
        warm += 1
    if warm and on_first is not None:
        on_first((time.perf_counter() - begun) / warm)
    samples: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - t0) / 1e6)
        if not warm and len(samples) == 1 and on_first is not None:
            on_first(samples[0] / 1000)
        if iterations is not None:
            if len(samples) >= iterations:
                break
        elif time.perf_counter() - start >= duration_s and len(samples) >= min_iterations:
            break
    return samples, time.perf_counter() - start


def random_arrays(names: list[str], shapes: dict[str, list[int]], seed: int = 0) -> dict[str, np.ndarray]:
    """float32 inputs of the given shapes (an engine's runner casts them to its own types)."""
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(shapes.get(n, [1])).astype(np.float32) for n in names}


class HarnessRequest(BaseModel):
    model: str
    feeds: str  # an .npz of the inputs, by name
    warmup_s: float
    duration_s: float
    iterations: int | None = None
    min_iterations: int = 1
    chain: str | None = None  # an offloaded model: the folder of its chain, whose pieces are timed one after another


class HarnessResponse(BaseModel):
    samples_ms: list[float]
    wall_s: float
    onnxruntime: str
    pieces: int = 1  # the sessions timed together (a chain's pieces)


ESTIMATE = "first_call.json"  # the child's one call's seconds, for the parent to say what the whole will take


class FirstCall(BaseModel):
    seconds: float


def _watch_first(path: Path, on_first: Callable[[float], None], done: threading.Event) -> None:
    while not done.wait(0.05):
        if path.exists():
            on_first(FirstCall.model_validate(files.read_json(path, files.RECORD_BYTES)).seconds)
            return


def _write_first(path: Path, seconds: float) -> None:
    files.write_atomic(path, FirstCall(seconds=seconds).model_dump_json().encode())  # read while it is written


def benchmark(model: Path, feeds: dict[str, np.ndarray], warmup_s: float, duration_s: float,
              iterations: int | None, min_iterations: int, folder: Path, log: Path,
              on_first: Callable[[float], None] | None = None, chain: Path | None = None) -> PerfResult:
    """`model` (or the pieces of its `chain`, in order, what crosses each cut handed on) timed on ONNX Runtime in a
    child process (files in `folder`, the child's stderr in `log`); a
    child that fails or crashes gives a failed result saying so, in the harness's words (one killed from outside
    raises child.Killed: no measurement at all). `on_first` hears the seconds of one call while the child runs
    (`time_calls`)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "feeds.npz", **feeds)
    request = HarnessRequest(model=str(model), feeds=str(folder / "feeds.npz"), warmup_s=warmup_s,
                             duration_s=duration_s, iterations=iterations, min_iterations=min_iterations,
                             chain=str(chain) if chain else None)
    (folder / ESTIMATE).unlink(missing_ok=True)
    done = threading.Event()
    if on_first is not None:  # the listeners of progress live in this context: the watcher runs in a copy of it
        threading.Thread(target=contextvars.copy_context().run, args=(_watch_first, folder / ESTIMATE, on_first,
                                                                      done), daemon=True).start()
    started = time.perf_counter()
    try:
        outcome = child.call("trtflow.stages.ort.harness", request, HarnessResponse, folder, TIMEOUT_S,
                             what="the built-in harness (ONNX Runtime)")
    finally:
        done.set()
    if isinstance(outcome, child.TimedOut):
        return PerfResult(status="failed", runtime=RUNTIME,
                          error=f"the built-in harness (ONNX Runtime) did not finish within {TIMEOUT_S} s")
    log.write_text(outcome.stderr)
    if isinstance(outcome, child.Crashed):
        how = f"crashed ({outcome.signal})" if outcome.signal else f"failed: {outcome.last_line[:300]}"
        return PerfResult(status="failed", runtime=RUNTIME,
                          error=f"the built-in harness (ONNX Runtime on CPU) {how} (log: {log})")
    answer = outcome.response
    phases.add("the harness's processes beyond their timed runs (start-up, session, warm-up)",
               time.perf_counter() - started - answer.wall_s)
    samples = answer.samples_ms
    pieces = f", its chain's {answer.pieces} pieces one after another" if chain else ""
    return PerfResult(status="passed", throughput_qps=len(samples) / answer.wall_s, latency_ms=latency_stats(samples),
                      total_host_walltime_s=answer.wall_s, layout="built-in harness",
                      runtime=f"{RUNTIME}, onnxruntime {answer.onnxruntime}, graph optimizations off{pieces}",
                      samples_ms=samples)


def _serve(request: HarnessRequest, folder: Path) -> HarnessResponse:
    import onnxruntime as ort

    from trtflow.stages.ort.runner import session

    feeds = dict(np.load(request.feeds))
    if request.chain is not None:
        from trtflow.stages.onnx.records import read_chain
        from trtflow.stages.onnx.split import ChainSession

        chain = ChainSession(read_chain(Path(request.chain)), spin=True)
        call, pieces = partial(chain.run, feeds), len(chain.sessions)
    else:
        call, pieces = partial(session(Path(request.model), spin=True).run, None, feeds), 1
    samples, wall = time_calls(call, request.warmup_s, request.duration_s, request.iterations,
                               request.min_iterations, lambda seconds: _write_first(folder / ESTIMATE, seconds))
    return HarnessResponse(samples_ms=samples, wall_s=wall, onnxruntime=ort.__version__, pieces=pieces)


if __name__ == "__main__":
    raise SystemExit(child.serve(HarnessRequest, _serve))
