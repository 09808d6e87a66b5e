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
a profile up to 32 clips; and the issue's own long-input model, bench/memory.py's speech-quality model (a GRU over
the frames, random weights) on the same clips and pipeline (`speech-gru`).

With `--base REV`, each model's cold run is made a second time in the same bench run with trtflow's code at REV
(`git archive`, laid out as the wheel lays it out, first on PYTHONPATH; same interpreter and libraries), and the two
totals are printed side by side.

    python bench/floor.py [--models squeezenet ppocr-det dnsmos] [--base 9efe7f6]
"""
from __future__ import annotations

import argparse
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

from trtflow import phases
from trtflow.stages.ort.runner import CALIBRATION, CANDIDATE, FP32, PARITY

# the passes a stage cannot skip, by the role of their session: the FP32 reference's (each (model, feed) once: a
# second computation is read from the store), each candidate's, the calibration pass, parity's comparison
UNAVOIDABLE = (FP32, CANDIDATE, CALIBRATION, PARITY)
CLIPS, CLIP = 29, 144160  # DNSMOS P.835's input: 9.01 s at 16 kHz

DNSMOS_PIPELINE = {
    "version": 1, "name": "dnsmos", "model": "models/sig_bak_ovr.onnx",
    "stages": {
        "prepare": {"kind": "prepare", "target_opset": 17, "input_shapes": {"input_1": [1, CLIP]}},
        "fp16": {"kind": "precision", "to": "fp16", "data": {"tensors": "clips/*.npy"}, "holdout": 8},
        "int8": {"kind": "calibrate", "data": {"tensors": "clips/*.npy"}, "holdout": 8},
        "build": {"kind": "build", "profiles": {"clips": {"input_1": {"min": [1, CLIP], "opt": [8, CLIP],
                                                                       "max": [32, CLIP]}}}},
        # the default bounds (the regression metric, MOS within 0.1, is newer than the --base revisions this bench
        # compares with); INT8 misses them on these clips: optional, left out
        "validate": {"kind": "validate", "data": {"tensors": "clips/*.npy"}, "optional": ["fp16", "int8"]},
        "benchmark": {"kind": "benchmark"},
        "release": {"kind": "release"},
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


def _speech_gru(repo: Path) -> Path:
    """Issue #71's own long-input model: bench/memory.py's speech-quality model (Conv1d front end, a GRU over the
    frames, a score; random weights, seeded), on the same clips and pipeline as DNSMOS."""
    from bench.memory import make_audio

    pipeline = _dnsmos(repo)
    (repo / "models" / "sig_bak_ovr.onnx").unlink()
    make_audio(repo / "models" / "speech_quality.onnx")
    spec = yaml.safe_load(pipeline.read_text())
    spec["name"], spec["model"] = "speech-gru", "models/speech_quality.onnx"
    spec["stages"]["prepare"]["input_shapes"] = {"audio": [1, CLIP]}
    spec["stages"]["build"]["profiles"] = {"clips": {"audio": spec["stages"]["build"]["profiles"]["clips"]["input_1"]}}
    pipeline.write_text(yaml.safe_dump(spec, sort_keys=False))
    return pipeline


RANGE_CHECK = ("the range check (calibrate `entropy_check`): the rule's ranges, the other histogram rule's and the "
               "full ranges each run on 8 samples; no one rule wins everywhere (entropy alone: PP-OCR cls cosine 0.79)")
PREPARE_CHECKS = ("prepare's checks: the model before and after each rewrite (opset conversion, simplification) run "
                  "on its check samples and compared: a rewrite that changes the outputs is caught before anything "
                  "is built from it")
# why each piece of work above a stage's floor stays: what it buys (measured where docs/NOTES.md says so) and the
# setting that turns it off; matched against the names `Stage.above` gives, first match wins
WHY = {
    "bias_shadow.onnx": "bias correction (calibrate `bias_correction`): two passes of a shadow model measure the "
        "INT8 rounding's mean error per channel; YOLOX recall 0.924 -> 0.940, PP-OCRv4 rec lines "
        "exact 0.71 -> 0.85",
    ".judged.onnx": RANGE_CHECK,
    "entropy.onnx": RANGE_CHECK,
    "percentile.onnx": RANGE_CHECK,
    "full_range.onnx": RANGE_CHECK,
    "original.onnx": PREPARE_CHECKS,
    "simplified.onnx": PREPARE_CHECKS,
    "converted.onnx": PREPARE_CHECKS,
    "exposed.onnx": "the FP16 safeguards' magnitudes (precision `fallback.auto`; calibrate's FP16 remainder): one "
        "pass with every tensor exposed finds the nodes that overflow FP16",
    "remainder_candidate": "the FP16 remainder's check (calibrate `remainder: fp16`): the converted remainder run "
        "once before it is kept",
    "quantization pre-processing": "ONNX Runtime's quantization pre-processing, in a child process: its symbolic "
        "shape inference writes into the current directory and asserts on valid graphs; "
        "about 0.5 s of it is the child's imports",
    "ONNX Runtime probe": "a variant's first run in a child process: ONNX Runtime's CPU provider crashes on some "
        "FP16 graphs (an FP16 LSTM), which would end the stage; the child's start costs ~0.3 s",
    "Q/DQ writing": "ONNX Runtime's quantizer writing each candidate's Q/DQ model (three with the range check)",
    "calibration statistics": "the |x| histograms TensorRT's rules are read from (the tensors a Q/DQ pair may go "
        "on; made while the next chunk runs, so partly inside the calibration pass)",
    "thresholds": "the thresholds from the histograms (TensorRT's KL search, vectorized)",
    "images:": "the samples themselves: each image decoded and run through the declared preprocessing (what the "
        "engine will be fed)",
    "torchvision imported": "parity's job: the training transforms the deployed preprocessing is checked against "
        "(torchvision on PIL: importing it is most of this)",
    "training transforms: run": "parity's job: the training transforms run on each image (torchvision on PIL)",
    "the harness's processes": "each engine timed in a process of its own (a crash or a leak there is not the "
        "stage's): it starts, makes its session and warms up (the pipeline's warmup) beside its timed runs",
    "pre-flight's process": "the trial build in a process of its own (TensorRT's parser aborts the process on some "
        "models): its start-up and parsing beside the builder's seconds",
    "FP16 conversion": "the variant itself: the FP16 graph the stage writes (and its safeguard rounds)",
    "FP16 emulation graphs": "the emulation graphs validate and the pre-flights run (per-node FP16 rounding)",
    "ONNX files": "reading the inputs and writing the stage's outputs",
    "sessions": "an ONNX Runtime session per model and role",
    "plots": "the plots of the stage's Prefect artifacts (people look before they read)",
    "the rest": "not timed apart: Python around the passes (feeds, comparisons, reports), graph rewrites, hashing, "
        "the build worker's start-up",
}


def why(what: str) -> str:
    return next((reason for key, reason in WHY.items() if key in what), "not argued: a candidate for the next cut")


MODELS = {"squeezenet": _example("squeezenet-cls"), "ppocr-det": _example("ppocr-det"), "dnsmos": _dnsmos,
          "speech-gru": _speech_gru}


@dataclass
class Stage:
    name: str
    wall: float = 0.0  # inside the stage's function (its manifest)
    passes: dict[str, float] = field(default_factory=dict)  # role -> seconds
    counts: dict[str, int] = field(default_factory=dict)
    builds: float = 0.0  # TensorRT builder seconds
    measured: float = 0.0  # the benchmark's timed runs (its duration per engine, as the pipeline asks)
    phases: dict[str, float] = field(default_factory=dict)  # the stage process's phases (trtflow/phases.py)

    def floor(self) -> float:
        return self.builds + self.measured + sum(s for role, s in self.passes.items() if role in UNAVOIDABLE)

    def above(self) -> list[tuple[str, float]]:
        """What is above the floor, largest first: the other passes by their model, the phases timed in the stage,
        and the rest."""
        named = [(f"{role} x{self.counts[role]}", s) for role, s in self.passes.items() if role not in UNAVOIDABLE]
        named += [(name, s) for name, s in self.phases.items() if s >= 0.05]
        rest = self.wall - self.floor() - sum(s for _, s in named)
        return sorted(named + [("the rest (Python loops, graph surgery, hashing)", max(rest, 0.0))],
                      key=lambda item: -item[1])


def _summed(report: dict, key: str, marker: str) -> float:
    """The sum of every number under `key` in the dicts of a report that also hold `marker`."""
    total, stack = 0.0, [report]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get(key), (int, float)) and marker in item:
                total += float(item[key])
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
    return total


# where each repository folder goes in the wheel's layout (tests/test_new_kind.py copies the tree the same way)
PACKAGES = {"trtflow": "trtflow", "pipelines": "trtflow/pipelines", "flows": "trtflow/flows",
            "stages": "trtflow/stages"}


def source_at(rev: str, dst: Path) -> Path:
    """trtflow's code at `rev`, laid out as the wheel lays it out (tests/test_new_kind.py does the same for the tree
    as it is)."""
    tree = dst / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    out = dst / "src"
    for src, rel in PACKAGES.items():
        shutil.copytree(tree / src, out / rel, dirs_exist_ok=True)
    return out


def cold_total(name: str, work: Path, source: Path | None) -> float:
    """Seconds of one cold `trtflow run` of the model's whole pipeline (trtflow's code from `source`, else as
    installed), in a fresh store."""
    pipeline = MODELS[name](work / name)
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "TRTFLOW_STATE_DIR": str(work / "state"),
           "TRTFLOW_PREFECT_SERVER": "ephemeral", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    env.pop("TRTFLOW_PHASES", None)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "run", str(pipeline)], cwd=pipeline.parent,
                          env=env, capture_output=True, text=True, timeout=14400, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} ({source or 'installed'}): the cold run failed:\n{done.stdout[-2000:]}\n"
                         f"{done.stderr[-2000:]}")
    return time.perf_counter() - t0


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
        data = json.loads(report.read_text()) if report.exists() else {}
        # every engine build (records.Built) and trial build (records.TrialBuild), every timed measurement
        stage.builds = _summed(data, "seconds", "engine_bytes")
        stage.measured = _summed(data, "total_host_walltime_s", "total_host_walltime_s")
    totals, passes = phases.recorded(ledger)
    for entry in totals:
        stage = stages.get(entry["process"].removeprefix("trtflow-"))
        for phase, seconds in entry["phases"].items() if stage is not None else ():
            stage.phases[phase] = stage.phases.get(phase, 0.0) + seconds
    for entry in passes:
        stage = stages.get(entry["process"].removeprefix("trtflow-"))
        if stage is not None:
            role = entry["pass"]
            stage.passes[role] = stage.passes.get(role, 0.0) + entry["seconds"]
            stage.counts[role] = stage.counts.get(role, 0) + 1
    return list(stages.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--base", help="also a whole cold run with trtflow's code at this revision, side by side")
    args = ap.parse_args()
    console = Console(width=200)
    with tempfile.TemporaryDirectory() as tmp:
        if args.base:
            base = source_at(args.base, Path(tmp) / "base")
            sides = Table(title=f"a whole cold `trtflow run` (all stages side by side as the flow runs them), "
                                f"seconds: trtflow at {args.base} and now, same machine, same bench run")
            for col in ("model", args.base, "now", "now / base"):
                sides.add_column(col, justify="left" if col == "model" else "right")
            for name in args.models:
                old = cold_total(name, Path(tmp) / f"base-{name}", base)
                new = cold_total(name, Path(tmp) / f"now-{name}", None)
                sides.add_row(name, f"{old:.0f}", f"{new:.0f}", f"{new / old:.2f}")
            console.print(sides)
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
            console.print(f"{name}: FP32 reference passes over the run: {sum(s.counts.get(FP32, 0) for s in stages)}")
            named = {what for s in stages if s.floor() and s.wall > 1.5 * s.floor()
                     for what, sec in s.above()[:3] if sec >= 0.1}
            console.print("why what is above the floor stays, in the stages past 1.5x:")
            for what in sorted(named):
                console.print(f"  {what}: {why(what)}")


if __name__ == "__main__":
    main()
