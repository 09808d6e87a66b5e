"""How much of a `trtflow run` is trtflow's and Prefect's own overhead, rather than stage work.

Runs the example pipeline the way a user does (`trtflow run` in a fresh process, Prefect's temporary server,
a fresh artifact store), then again fully cached, and measures in the same session two baselines: the stage
functions called directly (no trtflow, no Prefect) and an empty Prefect flow in a fresh process (Prefect's
fixed start-up cost).

    python bench/overhead.py [PIPELINE.yaml] [--repeat N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "examples" / "ppocr-cls" / "pipeline.yaml"

EMPTY_FLOW = """
from prefect import flow, task
@task
def nothing(): return 1
@flow
def empty(): return nothing()
empty()
"""


ENV = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # as `trtflow run` sets it


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=ENV)
    return time.perf_counter() - t0


def stage_work(store: Path) -> float:
    """Seconds spent inside the stage functions of the runs that were not reused (from the manifests)."""
    total = 0.0
    for last in store.glob("*/last.json"):
        key = json.loads(last.read_text())["key"]
        manifest = json.loads((last.parent / key / "manifest.json").read_text())
        total += manifest["timings"]["work_seconds"]
    return total


def direct_stage_calls(pipeline: Path) -> float:
    """The same stage work, calling the stage functions directly: the floor trtflow is measured against."""
    code = f"""
import time, tempfile, pathlib
t0 = time.perf_counter()
from trtflow.flows.runner import Runner
from trtflow.flows.store import LocalStore
from trtflow.pipelines.loader import load_pipeline
from trtflow.flows import implementation
from trtflow.artifact import Artifact
r = Runner(load_pipeline({str(pipeline)!r}), store=LocalStore(pathlib.Path(tempfile.mkdtemp())))
artifacts = {{}}
for name in r.graph.order:
    node = r.graph.nodes[name]
    inputs = {{}}
    for slot, edges in node.inputs.items():
        e = edges[0]
        path = r.pipeline.model_path if e.stage == 'source' else artifacts[e.stage][e.output]
        inputs[slot] = Artifact(path, e.type, 'x')
    out = pathlib.Path(tempfile.mkdtemp())
    artifacts[name] = implementation.resolve(node.spec).run(node.spec, inputs, out).outputs
print(time.perf_counter() - t0)
"""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pipeline", nargs="?", default=str(DEFAULT))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    pipeline = Path(args.pipeline).resolve()
    trtflow = [sys.executable, "-m", "trtflow.flows.cli", "run", str(pipeline)]

    rows: dict[str, list[float]] = {k: [] for k in ("direct", "empty", "cold", "cold_work", "cached")}
    for _ in range(args.repeat):
        rows["direct"].append(direct_stage_calls(pipeline))
        rows["empty"].append(timed([sys.executable, "-c", EMPTY_FLOW]))
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "store"
            rows["cold"].append(timed(trtflow + ["--store", str(store)]))
            rows["cold_work"].append(stage_work(store))
            rows["cached"].append(timed(trtflow + ["--store", str(store)]))

    med = {k: statistics.median(v) for k, v in rows.items()}
    table = Table(title=f"trtflow overhead: {pipeline.relative_to(ROOT) if pipeline.is_relative_to(ROOT) else pipeline}"
                        f" (median of {args.repeat}, fresh process each)", title_justify="left")
    for col in ("what", "wall s", "stage work s", "outside stage work", "x direct calls"):
        table.add_column(col, justify="right" if col != "what" else "left")
    table.add_row("baseline: stage functions called directly (process incl. imports)", f"{med['direct']:.2f}",
                  "", "", "1.00")
    table.add_row("baseline: empty Prefect flow (temporary server)", f"{med['empty']:.2f}", "0", "", "")
    cold_out = med["cold"] - med["cold_work"]
    table.add_row("trtflow run, cold store", f"{med['cold']:.2f}", f"{med['cold_work']:.2f}",
                  f"{cold_out:.2f} s ({cold_out / med['cold']:.0%})", f"{med['cold'] / med['direct']:.2f}")
    table.add_row("trtflow run, everything cached", f"{med['cached']:.2f}", "0",
                  f"{med['cached']:.2f} s (100%)", f"{med['cached'] / med['direct']:.2f}")
    Console(width=160).print(table)
    print(f"trtflow's own share of the cold run beyond Prefect's start-up: "
          f"{max(cold_out - med['empty'], 0):.2f} s")


if __name__ == "__main__":
    main()
