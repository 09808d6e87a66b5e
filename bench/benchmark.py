"""The built-in benchmark harness's own cost per timed iteration, against a bare timing loop of the same session
calls measured in the same run: PP-OCR's classifier on ONNX Runtime (CPU), and a no-op call (where the
harness's bookkeeping is all there is).

    python bench/benchmark.py [--iterations N] [--repeat R]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

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

    from trtflow.stages.ort.harness import random_feeds, time_calls

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(MODEL), opts, providers=["CPUExecutionProvider"])
    feeds = random_feeds(sess, {"x": [1, 3, 48, 192]})
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


if __name__ == "__main__":
    main()
