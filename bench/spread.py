"""How much the same engines' numbers move between runs on a busy machine, against how much they move within one
run: the two spreads the release's selection rule weighs (issue #50).

The squeezenet example (three variants x two profiles: six engines) is run once in full (release included), then
again N - 1 times with its benchmark forced, nothing else changed, with a CPU burner beside it (`--burners`,
default 1: a shared two-core machine). Per engine, from the benchmark's own reports:

- within-run spread: (p90 - median) / median of its iterations' latency, the median over the N runs (what the
  release weighed before);
- run-to-run spread: (largest - smallest) / median of its samples/s over the N runs (what the history adds);
- the margin the release now applies: the largest of select.min_gain (5%) and both.

Then, per run, what the release shipped (engine, version, exit code, the margin it weighed): the rule holds when
every forced re-run ships the first run's engine as the same version and exits 0.

Numbers are the built-in harness on ONNX Runtime (CPU): no GPU here, not TensorRT numbers.

    python bench/spread.py [--runs N] [--burners B] [--duration 0.5s | --quick]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
MIN_GAIN = 0.05  # select.min_gain's default


def trtflow(*args: str, cwd: Path, may_fail: bool = False) -> int:
    done = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", *args], cwd=cwd, capture_output=True,
                          text=True)
    if done.returncode != 0 and not may_fail:
        sys.exit(f"trtflow {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.returncode


def report(store: Path, stage: str) -> dict:
    key = json.loads((store / stage / "last.json").read_text())["key"]
    return json.loads((store / stage / key / "report.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--burners", type=int, default=1, help="CPU-bound processes running beside the benchmark")
    ap.add_argument("--duration", default="0.5s", help="the benchmark's duration per cell (the example's: 0.5s)")
    ap.add_argument("--quick", action="store_true",
                    help="the suite's settings (tests/test_example.py): 0.1s per cell, no warm-up, 5 iterations")
    args = ap.parse_args()
    console = Console(width=160)
    settings = ["--set", f"stages.benchmark.duration={'0.1s' if args.quick else args.duration}",
                "--set", "stages.benchmark.gate=null"]
    if args.quick:
        settings += ["--set", "stages.benchmark.warmup=0", "--set", "stages.benchmark.min_iterations=5"]
    with tempfile.TemporaryDirectory(prefix="trtflow-spread-") as tmp:
        work = Path(tmp) / "squeezenet-cls"
        shutil.copytree(ROOT / "examples" / "squeezenet-cls", work, ignore=shutil.ignore_patterns(".trtflow"))
        shutil.copy(ROOT / "examples" / "trtflow.schema.json", Path(tmp) / "trtflow.schema.json")
        started = time.perf_counter()
        trtflow("run", "pipeline.yaml", *settings, cwd=work)  # builds the engines and releases version 1
        runs = [report(work / ".trtflow", "benchmark")]
        shipped = [(0, report(work / ".trtflow", "release")["targets"][0])]
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
        try:
            for _ in range(args.runs - 1):
                code = trtflow("run", "pipeline.yaml", "--force", "benchmark", *settings, cwd=work, may_fail=True)
                runs.append(report(work / ".trtflow", "benchmark"))
                shipped.append((code, report(work / ".trtflow", "release")["targets"][0] if code == 0 else None))
        finally:
            for b in burners:
                b.kill()
                b.wait()
        elapsed = time.perf_counter() - started
    rates: dict[str, list[float]] = {}
    within: dict[str, list[float]] = {}
    for r in runs:
        for c in r["cells"]:
            lat = c["result"].get("latency_ms") or c["result"].get("gpu_compute_ms") or {}
            if c.get("samples_per_s") and lat.get("median"):
                rates.setdefault(c["cell"], []).append(c["samples_per_s"])
                within.setdefault(c["cell"], []).append(max(0.0, (lat["p90"] - lat["median"]) / lat["median"]))
    runtime = runs[-1]["cells"][0]["result"]["runtime"] if runs[-1]["cells"] else "?"
    table = Table(title=f"the same engines in {len(runs)} runs (first one quiet, then {args.burners} CPU burner(s) "
                        f"beside), duration {'0.1s (--quick)' if args.quick else args.duration} per cell, "
                        f"{os.cpu_count()} cores; {runtime}",
                  title_justify="left")
    for col in ("cell", "samples/s (median)", "within-run spread", "run-to-run spread", "x within", "margin applied"):
        table.add_column(col, justify="left" if col == "cell" else "right")
    ratios = []
    for cell in sorted(rates):
        mid = statistics.median(rates[cell])
        across = (max(rates[cell]) - min(rates[cell])) / mid
        inside = statistics.median(within[cell])
        ratio = across / inside if inside > 0 else float("inf")
        ratios.append(ratio)
        table.add_row(cell, f"{mid:.1f}", f"{inside:.1%}", f"{across:.1%}", f"{ratio:.1f}x",
                      f"{max(MIN_GAIN, inside, across):.1%}")
    console.print(table)
    console.print(f"run-to-run spread / within-run spread: median {statistics.median(ratios):.1f}x over "
                  f"{len(ratios)} engines; {elapsed:.0f} s in all")
    first = shipped[0][1]
    releases = Table(title="what the release shipped after each run (run 1 in full, then the benchmark forced)",
                     title_justify="left")
    for col in ("run", "exit", "engine shipped", "version", "same as run 1", "selection"):
        releases.add_column(col, justify="left" if col in ("engine shipped", "selection") else "right")
    held = 0
    for n, (code, target) in enumerate(shipped, 1):
        same = target is not None and (target["chosen"]["name"], target["version"]) == \
            (first["chosen"]["name"], first["version"])
        held += same and code == 0 and n > 1
        releases.add_row(str(n), str(code), target["chosen"]["name"] if target else "-",
                         str(target["version"]) if target else "-", "yes" if same else "NO",
                         (target or {}).get("stability") or "(the incumbent ranked first)" if target else "")
    console.print(releases)
    console.print(f"the forced re-runs shipped run 1's engine as version {first['version']} and exited 0 in {held} of "
                  f"{len(shipped) - 1}")


if __name__ == "__main__":
    main()
