"""Engine build matrix wall time: serial vs parallel, and a cold vs a warm (reused) timing cache.

The matrix is the squeezenet example's: FP32, FP16 and INT8 variants (made by the precision and calibrate
stages) x two profiles (batch 1; batch 1..32) = 6 engines, built by the installed TensorRT flavour (TensorRT-RTX
on a machine without a GPU). All configurations run in the same session, median of N rounds. Beside each wall
time, the CPU seconds it took (this process and the build workers it waited for): how busy the cores were, which
says whether a serial build leaves any room for a second one beside it.

    python bench/build.py [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from trtflow.artifact import Artifact, Inputs
from trtflow.pipelines.params.build import BuildStage
from trtflow.pipelines.params.calibrate import CalibrateStage
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.stages.build import stage as build
from trtflow.stages.calibrate import stage as calibrate
from trtflow.stages.precision import stage as precision

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "squeezenet-cls" / "models" / "squeezenet1_1.onnx"
PROFILES = {"bs1": {"input": {"min": [1, 3, 224, 224], "opt": [1, 3, 224, 224], "max": [1, 3, 224, 224]}},
            "dynamic": {"input": {"min": [1, 3, 224, 224], "opt": [8, 3, 224, 224], "max": [32, 3, 224, 224]}}}


def variants(tmp: Path) -> list[Artifact]:
    random = {"random": True, "samples": 8, "shapes": {"input": [1, 3, 224, 224]}}
    fp32 = Artifact(MODEL, "onnx", "a", "fp32")
    (tmp / "fp16").mkdir()
    fp16 = precision.run(PrecisionStage.model_validate({"kind": "precision", "data": random, "holdout": 1}),
                         Inputs({"model": fp32}), tmp / "fp16").outputs["model"]
    (tmp / "int8").mkdir()
    int8 = calibrate.run(CalibrateStage.model_validate({"kind": "calibrate", "data": random, "holdout": 0}),
                         Inputs({"model": fp32}), tmp / "int8").outputs["model"]
    return [fp32, Artifact(fp16, "onnx", "b", "fp16"), Artifact(int8, "onnx", "c", "int8")]


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its children waited for (the build workers)."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


CPU: dict[str, list[float]] = {}  # configuration -> CPU seconds per round, beside its wall time


def timed_build(models: list[Artifact], parallel: int, cache_dir: Path | None, label: str = "") -> float:
    params = BuildStage.model_validate({"kind": "build", "profiles": PROFILES, "parallel": parallel,
                                        "timing_cache": cache_dir is not None})
    inputs: dict = {"models": models}
    if cache_dir is not None:
        inputs["timing_cache"] = Artifact(cache_dir, "shared-cache", "")
    with tempfile.TemporaryDirectory() as out:
        t0, cpu0 = time.perf_counter(), _cpu_seconds()
        build.run(params, Inputs(inputs), Path(out))
        CPU.setdefault(label, []).append(_cpu_seconds() - cpu0)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    times: dict[str, list[float]] = {k: [] for k in ("serial", "parallel", "cold cache", "warm cache")}
    with tempfile.TemporaryDirectory() as tmp:
        models = variants(Path(tmp))
        runtime = build.backend("auto")
        for _ in range(args.rounds):
            times["serial"].append(timed_build(models, 1, None, "serial"))
            times["parallel"].append(timed_build(models, 2, None, "parallel"))
            with tempfile.TemporaryDirectory() as cache:
                times["cold cache"].append(timed_build(models, 1, Path(cache)))
                times["warm cache"].append(timed_build(models, 1, Path(cache)))
    med = {k: statistics.median(v) for k, v in times.items()}
    table = Table(title=f"build matrix: 3 variants x 2 profiles = 6 engines, {runtime.flavour} "
                        f"{runtime.version}, median of {args.rounds}", title_justify="left")
    for col in ("configuration", "wall s", "x baseline", "CPU s", "cores busy"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    cpu = {k: statistics.median(v) for k, v in CPU.items()}
    table.add_row("serial (parallel: 1) — baseline", f"{med['serial']:.2f}", "1.00", f"{cpu['serial']:.1f}",
                  f"{cpu['serial'] / med['serial']:.2f} of {os.cpu_count()}")
    table.add_row("parallel: 2", f"{med['parallel']:.2f}", _speedup(med['serial'], med['parallel']),
                  f"{cpu['parallel']:.1f}", f"{cpu['parallel'] / med['parallel']:.2f} of {os.cpu_count()}")
    table.add_row("serial, timing cache cold — baseline", f"{med['cold cache']:.2f}", "1.00", "", "")
    table.add_row("serial, timing cache reused", f"{med['warm cache']:.2f}",
                  _speedup(med['cold cache'], med['warm cache']), "", "")
    table.caption = ("cores busy: CPU seconds (this process and the build workers) over wall seconds; a serial "
                     "build that already keeps the cores busy leaves parallel builds nothing to gain")
    Console(width=120).print(table)


def _speedup(before: float, after: float) -> str:
    """'1.30x faster' or, when it is not, '0.79x (slower)': the ratio is before / after either way."""
    ratio = before / after
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{ratio:.2f}x (slower)"


if __name__ == "__main__":
    main()

