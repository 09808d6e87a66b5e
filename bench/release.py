"""What a release costs beyond what any release must do (copy the engine it ships).

Runs the squeezenet-cls example into a fresh store (or takes `--store` holding its results), then times, on the
same inputs: copying the shipped engine (the baseline), the whole release stage function (the choice among the 6
engines, the Triton repository with its config read back through Triton's schema and checked, the model card),
and its two parts on their own: the Triton config of one engine (make, print, parse back, check) and the model
card (Markdown, and HTML with the pictures inlined). Median of `--repeat` runs each.

    python bench/release.py [--store DIR] [--repeat N]
"""
from __future__ import annotations

import argparse
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
PIPELINE = ROOT / "examples" / "squeezenet-cls" / "pipeline.yaml"


def median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, help="a store holding the example's results (default: run it)")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    store = args.store or Path(tempfile.mkdtemp(prefix="trtflow-bench-release-"))
    if args.store is None:
        subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "run", str(PIPELINE), "--store", str(store)],
                       check=True, stdout=subprocess.DEVNULL, cwd=ROOT)

    from trtflow.flows import implementation
    from trtflow.flows.runner import Runner
    from trtflow.flows.store import LocalStore
    from trtflow.pipelines.loader import load_pipeline
    from trtflow.stages.release import card
    from trtflow.stages.release import stage as release
    from trtflow.stages.release.report import ReleaseReport
    from trtflow.stages.release.triton import config as triton_config
    from trtflow.stages.trt.engines import built_engines

    runner = Runner(load_pipeline(str(PIPELINE)), store=LocalStore(store))
    produced = {}
    for item in runner.plan():
        if item.name == "release":
            continue
        if item.action != "reuse":
            raise SystemExit(f"{item.name} is not up to date in {store}: {item.reason}")
        produced[item.name] = runner.store.lookup(item.name, item.key).manifest
    spec = runner.graph.nodes["release"].spec
    inputs = runner.inputs_for("release", produced)
    inputs.pop("releases")  # no ledger: every repetition releases version 1
    impl = implementation.resolve(spec)
    scratch = Path(tempfile.mkdtemp(prefix="trtflow-bench-out-"))

    def out_dir() -> Path:
        return Path(tempfile.mkdtemp(dir=scratch))

    report_dir = out_dir()
    impl.run(spec, inputs, report_dir)
    report = ReleaseReport.read(report_dir / "report.json")
    chosen = report.targets[0].chosen
    engine = next(e for e in built_engines(inputs.one("engines").path) if e.cell.name == chosen.name)

    def config() -> None:
        made = triton_config.make("m", engine, spec.triton)
        assert not triton_config.problems(triton_config.parse(triton_config.to_text(made)), engine)

    plots = release._plots(inputs, release.ValidateReport.read(inputs.one("validation").path), report.targets)
    rows = [
        ("copy the shipped engine (baseline)", median_seconds(
            lambda: shutil.copyfile(engine.plan, out_dir() / "model.plan"), args.repeat)),
        ("release stage, whole (6 engines weighed)", median_seconds(
            lambda: impl.run(spec, inputs, out_dir()), args.repeat)),
        ("  Triton config: make, parse back, check", median_seconds(config, args.repeat)),
        (f"  model card: Markdown + HTML, {len(plots)} pictures inlined", median_seconds(
            lambda: card.write(report, plots, out_dir()), args.repeat)),
    ]
    shutil.rmtree(scratch, ignore_errors=True)
    base = rows[0][1]
    table = Table(title=f"release of squeezenet-cls ({chosen.name}, {chosen.engine_bytes / 1e6:.1f} MB engine); "
                        f"median of {args.repeat}", title_justify="left")
    for col in ("what", "ms", "x baseline"):
        table.add_column(col, justify="left" if col == "what" else "right")
    for what, seconds in rows:
        table.add_row(what, f"{seconds * 1000:.2f}", f"{seconds / base:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
