"""How much of a `trtflow run` is trtflow's and Prefect's own overhead, rather than stage work.

Runs the example pipeline the way a user does (`trtflow run` in a fresh process, a fresh artifact store), with
Prefect's temporary server and with trtflow's background server, then again fully cached: first the full way (the
run that finds every result in place, and records so), then as the no-op it is from then on (flows/noop.py: the
record's witness checked by stat calls, no import of Prefect, pydantic or ONNX). It measures in the same session
the baselines: the stage functions called directly (no trtflow, no Prefect) and an empty Prefect flow in a fresh
process (Prefect's fixed start-up cost), with its temporary server and against a running one.

Where the cold run's time goes, per phase (`TRTFLOW_PHASES`, trtflow/phases.py: each process adds up its phases'
seconds), and the import time of the command line's modules (`python -X importtime`).

Then, on the cached store, what issue #11's integrity checks cost: the check of every published file on reuse
(size, mtime and ctime against the manifest; and hashing every file instead) as a share of the fully cached run, and `trtflow verify` (re-hash
everything) in MB/s against `sha256sum` over the same files.

    python bench/overhead.py [PIPELINE.yaml ...] [--repeat N]     (default: every example)
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
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = [ROOT / "examples" / "ppocr-cls" / "pipeline.yaml", ROOT / "examples" / "squeezenet-cls" / "pipeline.yaml"]

EMPTY_FLOW = """
from prefect import flow, task
@task
def nothing(): return 1
@flow
def empty(): return nothing()
empty()
"""


ENV = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}  # as `trtflow run` sets it


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=env or ENV)
    return time.perf_counter() - t0


def phase_totals(path: Path) -> dict[str, float]:
    """The phases' seconds summed over the processes that wrote them to `path` (trtflow/phases.py)."""
    totals: dict[str, float] = {}
    from trtflow import phases

    for entry in phases.recorded(path)[0]:
        for name, seconds in entry["phases"].items():
            totals[name] = totals.get(name, 0.0) + seconds
    return totals


def import_seconds(module: str) -> float:
    """The cumulative import time of `module` in a fresh interpreter (`-X importtime`), median of 3."""
    times = []
    for _ in range(3):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                              text=True, check=True, cwd=ROOT, env=ENV)
        line = next(ln for ln in reversed(done.stderr.splitlines()) if ln.rstrip().endswith(f"| {module}"))
        times.append(int(line.split("|")[1]) / 1e6)
    return statistics.median(times)


def stage_work(store: Path) -> float:
    """Seconds spent inside the stage functions of the runs that were not reused (from the manifests)."""
    from trtflow.flows.store import LocalStore

    local = LocalStore(store)
    total = 0.0
    for last in store.glob("*/last.json"):
        record = local.last(last.parent.name)
        total += published(local.path(last.parent.name, record.key)).timings.work_seconds
    return total


def published(directory: Path):
    """The manifest of the result published in `directory`."""
    from trtflow.flows.manifest import Manifest
    from trtflow.flows.store import MANIFEST

    return Manifest.parse(json.loads((directory / MANIFEST).read_text()), directory.name)


def direct_stage_calls(pipeline: Path) -> float:
    """The same stage work, calling the stage functions directly: the floor trtflow is measured against."""
    code = f"""
import time, tempfile, pathlib
t0 = time.perf_counter()
from trtflow.flows.runner import Runner
from trtflow.flows.store import LocalStore
from trtflow.pipelines.loader import load_pipeline
from trtflow.flows import implementation
from trtflow.artifact import Artifact, Inputs
r = Runner(load_pipeline({str(pipeline)!r}), store=LocalStore(pathlib.Path(tempfile.mkdtemp())))
artifacts = {{}}
for name in r.graph.order:
    node = r.graph.nodes[name]
    inputs = Inputs()
    for slot, edges in node.inputs.items():
        arts = [Artifact(r.pipeline.model_path if e.stage == 'source' else artifacts[e.stage][e.output], e.type,
                         'x', e.stage) for e in edges]
        inputs[slot] = arts if node.many.get(slot) else arts[0]
    for slot, (pattern, keypath) in node.spec.data_globs().items():
        inputs[slot] = r._data_files(name, pattern, keypath)
    out = pathlib.Path(tempfile.mkdtemp())
    artifacts[name] = implementation.resolve(node.spec).run(node.spec, inputs, out).outputs
print(time.perf_counter() - t0)
"""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True, text=True)
    return time.perf_counter() - t0


def reuse_check_seconds(store: Path, rehash: bool, repeat: int = 20) -> float:
    """Seconds to check every file of every published result as a cached run does (its stamp: size, mtime,
    ctime), or by hashing every file (the alternative); median of `repeat`."""
    from trtflow.flows.store import MANIFEST, check_files

    manifests = [(d, published(d)) for d in store.glob("*/*") if (d / MANIFEST).is_file()]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for directory, manifest in manifests:
            assert check_files(directory, manifest.files, rehash=rehash) is None
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def verify_vs_sha256sum(store: Path) -> tuple[float, float, float, float]:
    """(MB hashed, MB/s of `trtflow verify` as a command and of its hashing alone, MB/s of sha256sum on the same
    files), page cache warm for all."""
    from trtflow.flows.store import MANIFEST, LocalStore

    files = [str(d / rel) for d in store.glob("*/*") if (d / MANIFEST).is_file()
             for rel in published(d).files]  # what verify hashes
    size = sum(Path(f).stat().st_size for f in files) / 2**20
    subprocess.run(["sha256sum", *files], check=True, stdout=subprocess.DEVNULL)  # warm the page cache
    verify = min(timed([sys.executable, "-m", "trtflow.flows.cli", "verify", "--store", str(store)])
                 for _ in range(3))
    shasum = min(timed(["sha256sum", *files]) for _ in range(3))
    inside = []
    for _ in range(3):
        t0 = time.perf_counter()
        LocalStore(store).verify()
        inside.append(time.perf_counter() - t0)
    return size, size / verify, size / min(inside), size / shasum


def overhead(pipeline: Path, repeat: int) -> None:
    trtflow = [sys.executable, "-m", "trtflow.flows.cli", "run", str(pipeline)]
    keys = ("direct", "empty", "empty_bg", "cold", "cold_work", "cold_bg", "cold_bg_work", "cached", "noop",
            "check", "rehash")
    rows: dict[str, list[float]] = {k: [] for k in keys}
    phase_runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        # this bench's own Prefect database and trtflow state: the user's are not touched
        base = {**ENV, "PREFECT_HOME": f"{tmp}/prefect-home", "TRTFLOW_STATE_DIR": f"{tmp}/state"}
        base.pop("PREFECT_API_URL", None)
        ephemeral = {**base, "TRTFLOW_PREFECT_SERVER": "ephemeral"}
        background = {**base, "TRTFLOW_PREFECT_SERVER": "background"}
        first_start = timed([sys.executable, "-m", "trtflow.flows.cli", "server", "start"], background)
        url = json.loads(Path(f"{tmp}/state/prefect-server.json").read_text())["url"]
        try:
            for i in range(repeat):
                rows["direct"].append(direct_stage_calls(pipeline))
                rows["empty"].append(timed([sys.executable, "-c", EMPTY_FLOW], ephemeral))
                rows["empty_bg"].append(timed([sys.executable, "-c", EMPTY_FLOW], {**base, "PREFECT_API_URL": url}))
                store = Path(tmp) / f"store{i}"
                rows["cold"].append(timed(trtflow + ["--store", str(store)], ephemeral))
                rows["cold_work"].append(stage_work(store))
                store = Path(tmp) / f"store-bg{i}"
                measured = Path(tmp) / f"phases{i}.jsonl"
                rows["cold_bg"].append(timed(trtflow + ["--store", str(store)],
                                             {**background, "TRTFLOW_PHASES": str(measured)}))
                phase_runs.append(phase_totals(measured))
                rows["cold_bg_work"].append(stage_work(store))
                rows["cached"].append(timed(trtflow + ["--store", str(store)], background))  # records the no-op
                time.sleep(2)  # its Prefect record is posted by a detached process: not on the next run's time
                rows["noop"].append(min(timed(trtflow + ["--store", str(store)], background) for _ in range(3)))
                time.sleep(2)
                rows["check"].append(reuse_check_seconds(store, rehash=False))
                rows["rehash"].append(reuse_check_seconds(store, rehash=True))
            mb, verify_rate, hash_rate, sha_rate = verify_vs_sha256sum(store)
        finally:
            subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "server", "stop"], env=background,
                           stdout=subprocess.DEVNULL, check=False)

    med = {k: statistics.median(v) for k, v in rows.items()}
    name = pipeline.relative_to(ROOT) if pipeline.is_relative_to(ROOT) else pipeline
    table = Table(title=f"trtflow overhead: {name} (median of {repeat}, fresh process each)", title_justify="left")
    for col in ("what", "wall s", "stage work s", "outside stage work", "x direct calls"):
        table.add_column(col, justify="right" if col != "what" else "left")
    table.add_row("baseline: stage functions called directly (process incl. imports)", f"{med['direct']:.2f}",
                  "", "", "1.00")
    table.add_row("baseline: empty Prefect flow, temporary server", f"{med['empty']:.2f}", "0", "", "")
    table.add_row("baseline: empty Prefect flow, running server", f"{med['empty_bg']:.2f}", "0", "", "")
    for label, run, work in (("trtflow run, cold store, Prefect's temporary server", "cold", "cold_work"),
                             ("trtflow run, cold store, trtflow's background server", "cold_bg", "cold_bg_work")):
        outside = med[run] - med[work]
        table.add_row(label, f"{med[run]:.2f}", f"{med[work]:.2f}", f"{outside:.2f} s ({outside / med[run]:.0%})",
                      f"{med[run] / med['direct']:.2f}")
    table.add_row("trtflow run, everything cached, the full way (no flow run; records the no-op)",
                  f"{med['cached']:.2f}", "0", f"{med['cached']:.2f} s (100%)", f"{med['cached'] / med['direct']:.2f}")
    table.add_row("trtflow run, nothing changed since (the no-op record holds)", f"{med['noop']:.3f}", "0",
                  f"{med['noop']:.3f} s (100%)", f"{med['noop'] / med['direct']:.3f}")
    table.add_row("once per machine: starting the background server", f"{first_start:.2f}", "", "", "")
    console = Console(width=160)
    console.print(table)
    print(f"RATIOS {name}: cold run / direct stage calls = {med['cold_bg'] / med['direct']:.2f} (background server), "
          f"{med['cold'] / med['direct']:.2f} (temporary server); no-op run / empty Prefect flow on the running "
          f"server = {med['noop'] / med['empty_bg']:.3f} ({med['noop']:.3f} s / {med['empty_bg']:.2f} s; the "
          f"cached run the full way: {med['cached'] / med['empty_bg']:.2f})")
    phases_table(name, phase_runs, med["cold_bg"], repeat)
    print(f"outside stage work, cold run: {med['cold_bg'] - med['cold_bg_work']:.2f} s with the background server "
          f"(the empty flow against it: {med['empty_bg']:.2f} s), {med['cold'] - med['cold_work']:.2f} s with "
          f"Prefect's temporary server (the empty flow: {med['empty']:.2f} s)")

    integrity = Table(title=f"store integrity: {name}", title_justify="left")
    for col in ("what", "value", "against"):
        integrity.add_column(col, justify="right" if col != "what" else "left")
    integrity.add_row("checking every published file on reuse (size, mtime, ctime)", f"{med['check'] * 1e3:.2f} ms",
                      f"{med['check'] / med['cached']:.2%} of the cached run ({med['cached']:.2f} s)")
    integrity.add_row(f"the alternative: hashing every published file ({mb:.1f} MB) on reuse",
                      f"{med['rehash'] * 1e3:.2f} ms",
                      f"{med['rehash'] / med['cached']:.2%} of the cached run; {mb / med['rehash']:.0f} MB/s")
    integrity.add_row(f"trtflow verify: the command (re-hash {mb:.1f} MB, incl. Python start-up)",
                      f"{verify_rate:.0f} MB/s", f"sha256sum {sha_rate:.0f} MB/s (x{verify_rate / sha_rate:.2f})")
    integrity.add_row("trtflow verify: its hashing (LocalStore.verify)", f"{hash_rate:.0f} MB/s",
                      f"sha256sum {sha_rate:.0f} MB/s (x{hash_rate / sha_rate:.2f})")
    console.print(integrity)


def phases_table(name: Any, runs: list[dict[str, float]], wall: float, repeat: int) -> None:
    """Where the cold run (background server) spends its time: each phase's seconds (median over the runs, summed
    over processes and stages; stages that run side by side add up), and what is Prefect's: the flow run's wall
    less its stage task bodies."""
    names = sorted({k for r in runs for k in r}, key=lambda k: -statistics.median(r.get(k, 0.0) for r in runs))
    med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in names}
    table = Table(title=f"where a cold run's time goes: {name} (background server, median of {repeat})",
                  title_justify="left")
    for col in ("phase", "s", "share of the cold run"):
        table.add_column(col, justify="right" if col != "phase" else "left")
    for k in names:
        table.add_row(k, f"{med[k]:.2f}", f"{med[k] / wall:.0%}")
    flow, bodies = med.get("flow run (wall)"), med.get("stage task bodies (the rest of the flow run is Prefect's)")
    if flow is not None and bodies is not None:
        table.add_row("= Prefect's own: flow and task engine, API calls (flow run wall - stage task bodies)",
                      f"{flow - bodies:.2f}", f"{(flow - bodies) / wall:.0%}")
    table.add_row("the cold run's wall (`trtflow run`)", f"{wall:.2f}", "100%")
    Console(width=160).print(table)
    imports = Table(title="import time of the command line (python -X importtime, median of 3)", title_justify="left")
    for col in ("module", "s"):
        imports.add_column(col, justify="right" if col != "module" else "left")
    for module in ("trtflow.flows.noop", "trtflow.flows.cli", "trtflow.flows.cli.app", "trtflow.flows.runner",
                   "trtflow.flows.pipeline_flow"):
        imports.add_row(module, f"{import_seconds(module):.3f}")
    Console(width=160).print(imports)


def verify_at_scale(megabytes: int) -> None:
    """The examples' stores hold a few MB, where start-up dominates: one synthetic result of `megabytes` MB
    (four engine-sized random files, published through the store) shows the hashing rate itself."""
    from trtflow.flows.manifest import Manifest
    from trtflow.flows.store import LocalStore

    with tempfile.TemporaryDirectory() as tmp:
        store = LocalStore(Path(tmp) / "store")
        store.ensure_writable()
        staging = store.staging("build", "0" * 32)
        for i in range(4):
            (staging / f"engine{i}.plan").write_bytes(os.urandom(megabytes * 2**20 // 4))
        store.publish("build", "0" * 32, staging, Manifest(status="ok", key="0" * 32, outputs={}))
        mb, verify_rate, hash_rate, sha_rate = verify_vs_sha256sum(store.root)
    table = Table(title=f"trtflow verify at scale: one result of {mb:.0f} MB (page cache warm)", title_justify="left")
    for col in ("what", "MB/s", "x sha256sum"):
        table.add_column(col, justify="right" if col != "what" else "left")
    table.add_row("baseline: sha256sum on the same files", f"{sha_rate:.0f}", "1.00")
    table.add_row("trtflow verify (the command)", f"{verify_rate:.0f}", f"{verify_rate / sha_rate:.2f}")
    table.add_row("trtflow verify (its hashing, LocalStore.verify)", f"{hash_rate:.0f}", f"{hash_rate / sha_rate:.2f}")
    Console(width=160).print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pipelines", nargs="*", default=[str(p) for p in DEFAULTS])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--verify-mb", type=int, default=1024, help="size of the synthetic result verify re-hashes (0: not measured)")
    args = ap.parse_args()
    if args.verify_mb:
        verify_at_scale(args.verify_mb)
    for pipeline in args.pipelines:
        overhead(Path(pipeline).resolve(), args.repeat)


if __name__ == "__main__":
    main()
