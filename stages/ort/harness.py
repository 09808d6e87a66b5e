"""The built-in harness where trtexec is absent and no engine can run: the candidate's ONNX variant timed on ONNX
Runtime (CPU) the way trtexec times an engine — warm-up for a while, then iterations for a duration or a count,
each timed on the host, inputs made once. Its numbers are labelled as ONNX Runtime's, never as TensorRT's."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trtflow.stages.trtexec.result import PerfResult

RUNTIME = "onnxruntime-cpu (CPUExecutionProvider; not a TensorRT number)"
PERCENTILES = (90, 95, 99)


def latency_stats(samples_ms: list[float]) -> dict[str, float]:
    a = np.asarray(samples_ms, dtype=np.float64)
    out = {"min": float(a.min()), "max": float(a.max()), "mean": float(a.mean()), "median": float(np.median(a))}
    out.update({f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES})
    return out


def time_calls(call: Callable[[], Any], warmup_s: float, duration_s: float, iterations: int | None
               ) -> tuple[list[float], float]:
    """(per-call milliseconds, wall seconds of the timed part) after `warmup_s` of untimed calls."""
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        call()
    samples: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - t0) / 1e6)
        if iterations is not None:
            if len(samples) >= iterations:
                break
        elif time.perf_counter() - start >= duration_s:
            break
    return samples, time.perf_counter() - start


def random_feeds(sess: Any, shapes: dict[str, list[int]], seed: int = 0) -> dict[str, np.ndarray]:
    from trtflow.stages.ort.runner import random_input, session_shapes

    rng = np.random.default_rng(seed)
    shapes = session_shapes(sess.get_inputs(), shapes)
    return {i.name: random_input(i, shapes, rng) for i in sess.get_inputs()}


def random_arrays(names: list[str], shapes: dict[str, list[int]], seed: int = 0) -> dict[str, np.ndarray]:
    """float32 inputs of the given shapes (an engine's runner casts them to its own types)."""
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(shapes.get(n, [1])).astype(np.float32) for n in names}


def benchmark(model: Path, shapes: dict[str, list[int]], warmup_s: float, duration_s: float,
              iterations: int | None) -> PerfResult:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    feeds = random_feeds(sess, shapes)
    samples, wall = time_calls(lambda: sess.run(None, feeds), warmup_s, duration_s, iterations)
    return PerfResult(status="passed", throughput_qps=len(samples) / wall, latency_ms=latency_stats(samples),
                      total_host_walltime_s=wall, layout="built-in harness", runtime=f"{RUNTIME}, onnxruntime "
                      f"{ort.__version__}", samples_ms=samples)
