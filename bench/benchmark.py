"""The built-in benchmark harness's own costs, each against a baseline measured in the same run:

1. per timed iteration, against a bare timing loop of the same session calls: PP-OCR's classifier on ONNX Runtime
   (CPU), and a no-op call (where the harness's bookkeeping is all there is);
2. per cell, its isolation: each measurement runs in its own process (a crash fails that cell, not the stage),
   against the same measurement in the stage's process (session made, inputs fed, the same iterations).

    python bench/benchmark.py [--iterations N] [--repeat R]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MODEL = ROOT / "examples" / "ppocr-cls" / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def bare(call, n: int) -> float:
    """Seconds for n calls, each timed the plainest way."""
    samples = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - t0)
    return time.perf_counter() - start


def main() -> None:
    import onnxruntime as ort

    from trtflow.stages.ort.harness import time_calls
    from trtflow.stages.ort.runner import random_input, session_shapes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(MODEL), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    shapes = session_shapes(sess.get_inputs(), {"x": [1, 3, 48, 192]})
    feeds = {i.name: random_input(i, shapes, rng) for i in sess.get_inputs()}
    cases = {"PP-OCR cls, batch 1 (onnxruntime-cpu)": lambda: sess.run(None, feeds), "no-op call": lambda: None}
    table = Table(title=f"harness overhead per timed iteration (median of {args.repeat} x {args.iterations} "
                        f"iterations, same session, same process)", title_justify="left")
    for col in ("call", "bare loop us/iter", "harness us/iter", "overhead us/iter", "x bare"):
        table.add_column(col, justify="right" if col != "call" else "left")
    for name, call in cases.items():
        n = args.iterations if name.startswith("no-op") else max(200, args.iterations // 10)
        bares, harnesses = [], []
        for _ in range(args.repeat):
            bares.append(bare(call, n) / n)
            _, wall = time_calls(call, 0.0, 0.0, n)
            harnesses.append(wall / n)
        b, h = statistics.median(bares) * 1e6, statistics.median(harnesses) * 1e6
        table.add_row(name, f"{b:.2f}", f"{h:.2f}", f"{h - b:+.2f}", f"{h / b:.3f}")
    Console(width=160).print(table)
    isolation(feeds, args.repeat)


def isolation(feeds, repeat: int, iterations: int = 20) -> None:
    """Wall time of one benchmark cell (`iterations` timed calls, no warm-up) in its own process, as the stage
    measures it, against the same cell in this process."""
    import tempfile

    from trtflow.stages.ort import harness
    from trtflow.stages.ort.runner import session

    def in_process() -> float:
        t0 = time.perf_counter()
        sess = session(MODEL)
        harness.time_calls(lambda: sess.run(None, feeds), 0.0, 0.0, iterations)
        return time.perf_counter() - t0

    def own_process(folder: Path) -> float:
        t0 = time.perf_counter()
        result = harness.benchmark(MODEL, feeds, 0.0, 0.0, iterations, 1, folder, folder / "harness.log")
        assert result.status == "passed", result.error
        return time.perf_counter() - t0

    shared, isolated = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeat):
            shared.append(in_process())
            isolated.append(own_process(Path(tmp) / str(i)))
    s, o = statistics.median(shared) * 1e3, statistics.median(isolated) * 1e3
    table = Table(title=f"one benchmark cell, PP-OCR cls batch 1, {iterations} timed iterations (median of {repeat})",
                  title_justify="left")
    for col in ("where", "ms per cell", "x in-process"):
        table.add_column(col, justify="right" if col != "where" else "left")
    table.add_row("in the stage's process (before)", f"{s:.1f}", "1.000")
    table.add_row("in its own process (a crash fails the cell only)", f"{o:.1f}", f"{o / s:.3f}")
    table.add_row("isolation cost", f"{o - s:+.1f}", "")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
