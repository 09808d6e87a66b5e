"""What the Prefect server is asked while a stage runs: every HTTP request the server answers during one pipeline
run, counted by the server itself (Prefect's app behind a counting ASGI middleware), as task-run reads per
running stage per second.

The pipeline has two stages: a short one, then one that sleeps SECONDS (a long build stands for it). Runs the
current tree, and with --before a trtflow source tree of an earlier commit (a `git worktree` of it: the bench
arranges its folders as the installed package is arranged and puts them first on PYTHONPATH), each against a fresh
server in the same session.

    python bench/api_reads.py [--before /tmp/old-trtflow] [--seconds 4]
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = """version: 1
name: api-reads
model: model.onnx
stages:
  first: {{kind: "tests.stage_fns:copy_model", outputs: {{model: onnx}}}}
  long: {{kind: "tests.stage_fns:interval", outputs: {{report: json}}, inputs: {{model: first}},
         params: {{tag: long, seconds: {seconds}, log: '{log}'}}}}
"""
SCRIPT = """
import sys
from trtflow.flows.pipeline_flow import pipeline_flow
if __name__ == "__main__":  # (trees before the __main__ fix re-imported this script in every stage's process)
    print([o["status"] for o in pipeline_flow(sys.argv[1])])
"""
REQUEST = re.compile(r'^(GET|POST|PATCH|PUT|DELETE) (/api/[^ ?"]*)')
# Prefect's own logging setup silences uvicorn's access log: the server is Prefect's app behind an ASGI middleware
# that writes one line per request it answers
SERVER = """
import sys, uvicorn
from prefect.server.api.server import create_app
app = create_app()
log = open(sys.argv[2], "a", buffering=1)
async def counted(scope, receive, send):
    if scope["type"] == "http":
        log.write(scope["method"] + " " + scope["path"] + "\\n")
    await app(scope, receive, send)
uvicorn.run(counted, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def package_tree(source: Path, into: Path) -> Path:
    """`source` (a trtflow checkout) arranged as the installed package: trtflow/{pipelines,flows,stages}."""
    pkg = into / "trtflow"
    shutil.copytree(source / "trtflow", pkg)
    for name in ("pipelines", "flows", "stages"):
        (pkg / name).symlink_to(source / name, target_is_directory=True)
    (into / "tests").symlink_to(source / "tests", target_is_directory=True)
    return into


def serve(home: Path) -> tuple[subprocess.Popen, str, Path]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = home / "requests.log"
    log.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(log)], env=env,
                            stdout=open(home / "server.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    import httpx
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"the server did not start: {(home / 'server.log').read_text()[-2000:]}")


def measure(tree: Path, seconds: float, work: Path) -> dict:
    home = work / "home"
    home.mkdir(parents=True)
    proc, url, log = serve(home)
    try:
        repo = work / "repo"
        repo.mkdir()
        shutil.copy(ROOT / "examples" / "ppocr-cls" / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx", repo / "model.onnx")
        (repo / "pipeline.yaml").write_text(PIPELINE.format(seconds=seconds, log=work / "intervals.txt"))
        (work / "run.py").write_text(SCRIPT)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}, "PREFECT_API_URL": url,
               "PREFECT_HOME": str(home), "PYTHONPATH": str(tree), "TRTFLOW_TEST_CALLS": str(work / "calls.txt")}
        before = len(log.read_bytes().splitlines())
        done = subprocess.run([sys.executable, str(work / "run.py"), str(repo / "pipeline.yaml")], env=env,
                              capture_output=True, text=True, timeout=600, cwd=repo)
        if done.returncode != 0:
            raise SystemExit(f"the run failed: {done.stderr[-2000:]}")
        time.sleep(2)  # the last log and event batches
        lines = log.read_text(errors="replace").splitlines()[before:]
    finally:
        proc.terminate()
        proc.wait(30)
    requests = collections.Counter(f"{m.group(1)} {re.sub(r'[0-9a-f-]{36}', '{id}', m.group(2))}"
                                   for m in map(REQUEST.search, lines) if m)
    _, start, end = (work / "intervals.txt").read_text().split()
    return {"requests": requests, "stage_s": float(end) - float(start)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, help="a trtflow checkout of an earlier commit")
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()
    trees = {"current": ROOT}
    if args.before:
        trees = {"before": args.before, **trees}
    results = {}
    with tempfile.TemporaryDirectory(prefix="trtflow-api-reads-") as tmp:
        for label, source in trees.items():
            work = Path(tmp) / label
            work.mkdir()
            tree = package_tree(source, work / "src") if label != "current" else ROOT
            results[label] = measure(tree, args.seconds, work)
    table = Table(title=f"Prefect server requests during one run with a {args.seconds:g} s stage")
    table.add_column("tree")
    table.add_column("requests", justify="right")
    table.add_column("task-run reads", justify="right")
    table.add_column("reads / running stage / s", justify="right")
    table.add_column("requests vs current", justify="right")
    current = sum(results["current"]["requests"].values())
    for label, r in results.items():
        reads = sum(v for k, v in r["requests"].items() if k.startswith("GET /api/task_runs/"))
        total = sum(r["requests"].values())
        table.add_row(label, str(total), str(reads), f"{reads / r['stage_s']:.2f}", f"{total / current:.1f}x")
    Console().print(table)
    for label, r in results.items():
        print(f"{label}: " + ", ".join(f"{k} x{v}" for k, v in r["requests"].most_common(8)))


if __name__ == "__main__":
    main()
