"""Issue #71: each stage of a cold run against its floor, the work it cannot avoid, measured in the same run.

A model's pipeline runs cold (a fresh store), one stage at a time in the pipeline's order (`trtflow run --stage`:
nothing beside it, so its inference passes are timed as they would be alone, on ONNX Runtime with the stage's own
threads). Every ONNX Runtime pass of a stage is recorded as it ends (trtflow/phases.py `timed_passes`, with the
session's role: the FP32 reference, a candidate's emulated pass, the calibration pass, or the model file's name), and
each engine build's builder seconds come from the stage's report.

A stage's floor: the passes no implementation of its job can skip, each (model, feed) once over the whole run: the
FP32 reference's outputs on each sample (`fp32 reference`; a second computation of the same outputs is waste), each
candidate's emulated pass (`*.sim.onnx`), the calibration pass (`augmented.onnx`), and the TensorRT builds (the
builder's seconds: prepare's and precision's trial builds, build's engines). What is above it is named: the other
passes by their model (FP16 magnitudes `exposed.onnx`, the range check's `*.judged.onnx`, bias correction
`bias_shadow.onnx`, prepare's checks), and the rest of the wall time (conversion, graph surgery, hashing, plots,
Python loops, process start) as `other`.

Models: the squeezenet-cls and ppocr-det examples, and a long-input model: DNSMOS P.835 (`sig_bak_ovr.onnx`, the
trained speech-quality model in the `speechmos` wheel), on 9.01 s clips at 16 kHz (144,160 samples, the model's
input) of synthesized speech-like audio (bench/memory.py `speech_like`: no real speech ships in a wheel), 29 clips,
a profile up to 32 clips.

    python bench/floor.py [--models squeezenet ppocr-det dnsmos]
"""
from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FP32 = "fp32 reference"
# the passes a stage cannot skip, by role (fnmatch patterns): the reference once per (model, feed), each candidate's
# pass, the calibration pass
UNAVOIDABLE = (FP32, "*.sim.onnx", "augmented.onnx")
CLIPS, CLIP = 29, 144160  # DNSMOS P.835's input: 9.01 s at 16 kHz

DNSMOS_PIPELINE = {
    "version": 1, "name": "dnsmos", "model": "models/sig_bak_ovr.onnx",
    "stages": {
        "prepare": {"kind": "prepare", "target_opset": 17, "input_shapes": {"input_1": [1, CLIP]}},
        "fp16": {"kind": "precision", "to": "fp16", "data": {"tensors": "clips/*.npy"}, "holdout": 8},
        "int8": {"kind": "calibrate", "data": {"tensors": "clips/*.npy"}, "holdout": 8},
        "build": {"kind": "build", "profiles": {"clips": {"input_1": {"min": [1, CLIP], "opt": [8, CLIP],
                                                                       "max": [32, CLIP]}}}},
        "validate": {"kind": "validate", "data": {"tensors": "clips/*.npy"},
                     "metrics": {"*": {"regression": {"within": 0.1}}}},
    },
}


def _dnsmos(repo: Path) -> Path:
    """The DNSMOS model from its wheel, 29 speech-like clips, and its pipeline."""
    from bench.memory import speech_like
    from tests.assets import wheel_file

    (repo / "models").mkdir(parents=True)
    shutil.copy(wheel_file("speechmos==0.0.1.1", "speechmos/dnsmos_models/sig_bak_ovr.onnx"),
                repo / "models" / "sig_bak_ovr.onnx")
    (repo / "clips").mkdir()
    for i in range(CLIPS):
        np.save(repo / "clips" / f"clip{i:02d}.npy", speech_like(CLIP, i)[None])
    (repo / "pipeline.yaml").write_text(yaml.safe_dump(DNSMOS_PIPELINE, sort_keys=False))
    return repo / "pipeline.yaml"


def _example(name: str):
    def made(repo: Path) -> Path:
        shutil.copytree(ROOT / "examples" / name, repo, ignore=shutil.ignore_patterns(".trtflow"))
        return repo / "pipeline.yaml"
    return made


MODELS = {"squeezenet": _example("squeezenet-cls"), "ppocr-det": _example("ppocr-det"), "dnsmos": _dnsmos}


@dataclass
class Stage:
    name: str
    wall: float = 0.0  # inside the stage's function (its manifest)
    passes: dict[str, float] = field(default_factory=dict)  # role -> seconds
    counts: dict[str, int] = field(default_factory=dict)
    builds: float = 0.0  # TensorRT builder seconds

    def floor(self) -> float:
        return self.builds + sum(s for role, s in self.passes.items() if _unavoidable(role))

    def above(self) -> list[tuple[str, float]]:
        """What is above the floor, largest first: each avoidable pass's role, then everything else."""
        named = [(f"{role} x{self.counts[role]}", s) for role, s in self.passes.items() if not _unavoidable(role)]
        rest = self.wall - self.floor() - sum(s for _, s in named)
        return sorted(named + [("other (Python, conversion, surgery, hashing, plots)", max(rest, 0.0))],
                      key=lambda item: -item[1])


def _unavoidable(role: str) -> bool:
    return any(fnmatch.fnmatch(role, pattern) for pattern in UNAVOIDABLE)


def _builder_seconds(report: dict) -> float:
    """The seconds of every engine build (records.Built) and trial build (records.TrialBuild) in a report."""
    total = 0.0
    stack = [report]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("seconds"), (int, float)) and "engine_bytes" in item:  # a build's record
                total += float(item["seconds"])
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
    return total


def run_cold(name: str, work: Path) -> list[Stage]:
    from bench.overhead import published
    from trtflow.flows.store import LocalStore
    from trtflow.pipelines.graph import build_graph
    from trtflow.pipelines.loader import load_pipeline

    pipeline = MODELS[name](work / name)
    order = build_graph(load_pipeline(pipeline)).order
    ledger = work / f"{name}.passes.jsonl"
    env = {**os.environ, "TRTFLOW_PHASES": str(ledger), "PREFECT_HOME": str(work / "prefect"),
           "TRTFLOW_STATE_DIR": str(work / "state"), "TRTFLOW_PREFECT_SERVER": "ephemeral",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    stages = {}
    for stage in order:
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "run", str(pipeline), "--stage", stage],
                              cwd=pipeline.parent, env=env, capture_output=True, text=True, timeout=7200, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{name}: stage {stage} failed ({time.perf_counter() - t0:.0f} s):\n"
                             f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        stages[stage] = Stage(stage)
    store = LocalStore(pipeline.parent / ".trtflow")
    for stage in stages.values():
        record = store.last(stage.name)
        directory = store.path(stage.name, record.key)
        stage.wall = published(directory).timings.work_seconds or 0.0
        report = directory / "report.json"
        stage.builds = _builder_seconds(json.loads(report.read_text())) if report.exists() else 0.0
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        entry = json.loads(line)
        stage = stages.get(str(entry.get("process", "")).removeprefix("trtflow-"))
        if stage is None or "pass" not in entry:
            continue
        role = entry["pass"]
        stage.passes[role] = stage.passes.get(role, 0.0) + entry["seconds"]
        stage.counts[role] = stage.counts.get(role, 0) + 1
    return list(stages.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = ap.parse_args()
    console = Console(width=200)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            stages = run_cold(name, Path(tmp))
            table = Table(title=f"{name}: each stage of a cold run against its floor (seconds, two-core CPU, "
                                f"ONNX Runtime CPU and TensorRT-RTX's builder)")
            for col in ("stage", "wall", "floor", "wall/floor", "inference passes", "above the floor, largest first"):
                table.add_column(col, justify="right" if col in ("wall", "floor", "wall/floor") else "left")
            for s in stages:
                ratio = f"{s.wall / s.floor():.1f}x" if s.floor() > 0 else "-"
                passes = ", ".join(f"{role} x{s.counts[role]} {sec:.2f}" for role, sec in
                                   sorted(s.passes.items(), key=lambda kv: -kv[1])[:4])
                above = "; ".join(f"{what} {sec:.1f}" for what, sec in s.above()[:3])
                table.add_row(s.name, f"{s.wall:.1f}", f"{s.floor():.1f}", ratio, passes, above)
            total_wall = sum(s.wall for s in stages)
            total_floor = sum(s.floor() for s in stages)
            table.add_row("all", f"{total_wall:.1f}", f"{total_floor:.1f}",
                          f"{total_wall / total_floor:.1f}x" if total_floor else "-", "", "")
            console.print(table)
            counted = collections.Counter()
            for s in stages:
                counted.update({r: c for r, c in s.counts.items() if r == FP32})
            console.print(f"{name}: FP32 reference passes over the run: {counted.get(FP32, 0)}")


if __name__ == "__main__":
    main()
