"""Memory bounded by prediction (issue #69, item 5): each stage's peak resident memory predicted from the graph
(stages/ort/memory.py) against the peak measured, on three models, under two memory budgets.

The models, each at the profile `trtflow init` proposes for it (batch 1 / 8 / 32):
  audio  a speech-quality model made here in torch and exported (Conv1d x4, a GRU over the frames, a score: the
         shape of the issue's model), on 16 kHz audio up to 9.01 s (144,160 samples), synthesized (voiced harmonics
         with vibrato and noise; no speech corpus ships in a wheel here)
  det    PP-OCRv4's text detector (examples/ppocr-det), images up to 640 x 640
  rec    PP-OCRv4's text recognizer (examples/ppocr-rec), lines 48 high, up to 1280 wide
Per model, precision (FP16) and calibrate (INT8) on samples of the opt shape (one row each, as a file gives them),
then validate on a batch at the profile's max against the FP32 reference, both variants as candidates (random
inputs there: the shape is what costs). Every stage runs in a process of its own; its peak is that process's VmHWM,
its prediction the largest the budget planned (the process's resident memory then, and the run's estimate).

Budgets: `50%` (the default: half the memory available when a run starts, for the run to add) and a size the
process must stay under (per model, small enough that validate's max batch runs in parts). The table says, per
stage and budget: the largest shape run and the rows per run, the budget, predicted and measured peaks, and the wall
time against the default budget's (what the parts cost). `init est.` is the run time `trtflow init` extrapolates
from one timed FP32 pass (pipelines/init/cost.py) for the same sample counts.

    python bench/memory.py [--models audio det rec] [--keep DIR]
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SR = 16000
TIMEOUT_S = 3600


@dataclass(frozen=True)
class Model:
    input: str
    opt: list[int]  # one row at the opt shape: what precision and calibrate run on
    max: list[int]  # the profile's max: what validate runs
    tight: str  # the second budget: the process's resident memory stays under it
    samples: int = 5  # files: precision and calibrate each hold one out


MODELS = {
    "audio": Model("audio", [1, 96000], [32, 144160], "1GiB"),
    "det": Model("x", [1, 3, 320, 320], [32, 3, 640, 640], "2GiB"),
    "rec": Model("x", [1, 3, 48, 320], [32, 3, 48, 1280], "3.5GiB"),
}
STAGES = ("precision", "calibrate", "validate")


def make_audio(path: Path) -> Path:
    """The speech-quality model: Conv1d 1->32 (stride 1), 32->64, 64->64 (stride 2), 64->128 (stride 4), a GRU of
    64 over the frames, their mean, a score in 1..5. Random weights, seeded; exported with torch's TorchScript
    exporter at opset 17, batch and samples dynamic."""
    import torch
    from torch import nn

    class SpeechQuality(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.front = nn.Sequential(nn.Conv1d(1, 32, 9, padding=4), nn.ReLU(),
                                       nn.Conv1d(32, 64, 9, stride=2, padding=4), nn.ReLU(),
                                       nn.Conv1d(64, 64, 9, stride=2, padding=4), nn.ReLU(),
                                       nn.Conv1d(64, 128, 9, stride=4, padding=4), nn.ReLU())
            self.gru = nn.GRU(128, 64, batch_first=True)
            self.head = nn.Linear(64, 1)

        def forward(self, audio: torch.Tensor) -> torch.Tensor:
            frames, _ = self.gru(self.front(audio.unsqueeze(1)).transpose(1, 2))
            return torch.sigmoid(self.head(frames.mean(1))) * 4 + 1

    torch.manual_seed(0)
    model = SpeechQuality().eval()
    torch.onnx.export(model, (torch.randn(1, SR),), str(path), input_names=["audio"], output_names=["mos"],
                      dynamic_axes={"audio": {0: "batch", 1: "samples"}, "mos": {0: "batch"}}, opset_version=17,
                      dynamo=False)
    return path


def speech_like(n: int, seed: int) -> np.ndarray:
    """n samples at 16 kHz: a voiced source (harmonics of a pitch gliding around 100-220 Hz), syllable-rate
    amplitude and a noise floor, each clip at its own level and signal-to-noise ratio (clips alike give the score
    output nearly one value, on which ONNX Runtime's histogram collector fails: 'Too many bins for data range')."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SR
    pitch = rng.uniform(100, 220) + 40 * np.sin(2 * np.pi * 0.5 * t + seed)
    phase = 2 * np.pi * np.cumsum(pitch) / SR
    voiced = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t) ** 2)
    return (rng.uniform(0.05, 0.8) * voiced + rng.uniform(0.001, 0.3) * rng.standard_normal(n)).astype(np.float32)


def prepare(name: str, work: Path) -> tuple[Path, list[Path]]:
    """The model's file and its sample files (one row at the opt shape each)."""
    spec = MODELS[name]
    work.mkdir(parents=True, exist_ok=True)
    if name == "audio":
        model = make_audio(work / "speech_quality.onnx")
    else:  # PaddlePaddle's export at opset 11/12, converted as prepare's target_opset: 17 converts it
        import onnx
        from onnx import version_converter

        source = next((ROOT / "examples" / f"ppocr-{name}" / "models").glob("*.onnx"))
        model = work / source.name
        onnx.save(version_converter.convert_version(onnx.load(str(source)), 17), str(model))
    rng = np.random.default_rng(0)
    files = []
    for i in range(spec.samples):
        x = speech_like(spec.opt[1], i)[None] if name == "audio" else \
            rng.standard_normal(spec.opt).astype(np.float32)
        files.append(work / f"sample{i}.npy")
        np.save(files[-1], x)
    return model, files


# ------------------------------------------------------------------------------------------- one stage (child)

def child(request: dict) -> dict:
    """Run one stage in this process and say what it cost."""
    from trtflow import procfs
    from trtflow.artifact import Artifact, Inputs
    from trtflow.stages.ort import memory

    kind, out = request["stage"], Path(request["out"])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    model = Artifact(Path(request["model"]), "onnx", "prep", "prepare")
    tensors = [Artifact(Path(p), "file", Path(p).name) for p in request["files"]]
    spec = MODELS[request["name"]]
    if kind == "validate":
        from trtflow.pipelines.params.validate import ValidateStage as Params
        from trtflow.stages.validate import stage as module
        params = {"data": {"random": True, "samples": 1, "shapes": {spec.input: spec.max}},
                  "locate_first_bad_layer": False}
        inputs = {"reference": model, "models": [Artifact(Path(p), "onnx", f"v{i}", v)
                                                  for i, (v, p) in enumerate(request["variants"].items())]}
    elif kind == "precision":
        from trtflow.pipelines.params.precision import PrecisionStage as Params
        from trtflow.stages.precision import stage as module
        params = {"to": "fp16", "data": {"tensors": "*.npy", "samples": spec.samples}, "holdout": 1,
                  "preflight": "off"}
        inputs = {"model": model, "tensors": tensors}
    else:
        from trtflow.pipelines.params.calibrate import CalibrateStage as Params
        from trtflow.stages.calibrate import stage as module
        params = {"data": {"tensors": "*.npy", "samples": spec.samples}, "holdout": 1}
        inputs = {"model": model, "tensors": tensors}
    start = time.perf_counter()
    error = None
    try:
        result = module.run(Params.model_validate({"kind": kind, **params}), Inputs(inputs), out)
        made = str(result.outputs.get("model", ""))
    except Exception as exc:  # noqa: BLE001 - a refusal (or a verdict) is a row of the table too
        error, made = f"{type(exc).__name__}: {str(exc).splitlines()[0]}", ""
        if getattr(exc, "result", None) is not None:  # a failed verdict still measured
            error = "failed verdict (measured all the same)"
    seconds = time.perf_counter() - start
    top = memory.PLANNED[0] if memory.PLANNED else None
    largest = max(memory.PLANNED, key=lambda p: p.whole.inputs, default=None)
    return {"peak": procfs.peak_resident(), "predicted": memory.predicted_peak(),
            "cap": top.room.cap if top is not None else None,
            "shape": largest.whole.shown() if largest else "", "rows": largest.rows if largest else None,
            "batch": largest.whole.shapes and max(s[0] for s in largest.whole.shapes.values()) if largest else None,
            "seconds": seconds, "error": error, "model": made}


def run_child(request: dict, budget: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTFLOW_")}
    env["TRTFLOW_MEMORY_BUDGET"] = budget
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(request)], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["crashed"])[-1], "peak": 0, "predicted": 0,
                "cap": None, "shape": "", "rows": None, "batch": None, "seconds": 0.0, "model": ""}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -------------------------------------------------------------------------------------------------- the table

def init_estimate(name: str, model: Path) -> dict[str, float]:
    """init's run time estimate for the bench's sample counts: one FP32 pass at the opt row, timed, times the
    passes pipelines/init/cost.py counts."""
    import onnx

    from trtflow.pipelines.init.cost import FIXED_S, FP16, INT8, Counts
    from trtflow.pipelines.init.cost import seconds as estimated
    from trtflow.pipelines.init.model import read_model
    from trtflow.pipelines.init.profile import InputProfile, ProfilePlan
    from trtflow.stages.ort.runner import session, whole

    spec = MODELS[name]
    facts = read_model(model)
    (tensor,) = facts.inputs
    dims = tuple((1, 8, 32) if i == 0 else (o, o, m) for i, (o, m) in enumerate(zip(spec.opt, spec.max)))
    plan = ProfilePlan((InputProfile(tensor, dims, ()),), None)
    sess = session(model)
    x = np.random.default_rng(0).standard_normal(spec.opt).astype(np.float32)
    whole(sess, {spec.input: x})  # as init does: the second pass timed
    start = time.perf_counter()
    whole(sess, {spec.input: x})
    took = time.perf_counter() - start
    nodes = len(onnx.load(str(model), load_external_data=False).graph.node)
    found = estimated(plan, Counts(spec.samples, 1, spec.samples, 1, 1), took, nodes)
    # the bench's validate runs one batch at the max only, with no FP32 candidate (init's: min, opt and max)
    _, base, per_node = next(f for f in FIXED_S if f[0] == "validate")
    found["validate"] = base + per_node * nodes + took * spec.max[0] * (
        np.prod(spec.max[1:]) / np.prod(spec.opt[1:])) * (1 + FP16 + INT8)
    return found


def gib(size: float | None) -> str:
    return "-" if not size else f"{size / 2**30:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--keep", type=Path, help="keep the work here (default: a temporary folder, removed)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    from rich.console import Console
    from rich.table import Table

    work = args.keep or Path(tempfile.mkdtemp(prefix="trtflow-bench-memory-"))
    rows = []
    try:
        for name in args.models:
            model, files = prepare(name, work / name)
            estimate = init_estimate(name, model)
            variants: dict[str, str] = {}
            for budget in ("50%", MODELS[name].tight):
                for stage in STAGES:
                    request = {"name": name, "stage": stage, "model": str(model), "files": [str(f) for f in files],
                               "out": str(work / name / f"{stage}-{budget}"), "variants": variants}
                    got = run_child(request, budget)
                    if budget == "50%" and stage != "validate" and got["model"]:
                        variants["fp16" if stage == "precision" else "int8"] = got["model"]
                    rows.append((name, stage, budget, got, estimate.get(stage)))
                    print(f"{name} {stage} {budget}: {got}", file=sys.stderr)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)

    base = {(n, s): g for n, s, b, g, _ in rows if b == "50%"}
    table = Table(title="Peak resident memory per stage, predicted (stages/ort/memory.py) and measured (VmHWM), "
                        "GiB; wall against the default budget's")
    for column in ("model", "stage", "largest run", "rows/run", "budget", "cap GiB", "predicted", "measured",
                   "within", "wall s", "x wall", "init est. s", "note"):
        table.add_column(column, justify="left" if column in ("model", "stage", "largest run", "budget", "note")
                         else "right")
    for name, stage, budget, got, est in rows:
        within = "-" if got["cap"] is None else ("yes" if got["peak"] <= got["cap"] else "NO")
        b = base[(name, stage)]
        table.add_row(name, stage, got["shape"], f"{got['rows']}/{got['batch']}" if got["rows"] else "-", budget,
                      gib(got["cap"]), gib(got["predicted"]), gib(got["peak"]), within, f"{got['seconds']:.1f}",
                      f"{got['seconds'] / b['seconds']:.2f}" if b["seconds"] else "-",
                      f"{est:.1f}" if est is not None and budget == "50%" else "", got["error"] or "")
    Console(width=250).print(table)


if __name__ == "__main__":
    main()
