"""What an emulated FP16 or INT8 pass costs on ONNX Runtime against the FP32 pass it wraps (#71 item 5), before and
after the emulation stopped rounding the outputs of FP16 nodes that only move, select or compare FP16 values
(stages/onnx/fp16_emulation.py `SELECTING_OPS`): "before" is the same emulation with every FP16 node's outputs
rounded, built in the same run; both give bit-identical outputs (checked here on the feed, and by
tests/test_fp16_emulation_casts.py).

Models as `prepare` hands them over (simplified, opset 17): the examples' squeezenet, PP-OCR cls, PP-OCRv4 det and rec,
and the speech-quality model of bench/memory.py (Conv1d front end, a GRU) on a 9-second clip. FP16 is the precision
stage's plan (its default block_ops); INT8 is the calibrate stage's default (an FP16 remainder), calibrated on 8
seeded random samples, for the two classifiers. Median of `--runs` timed runs after one warm-up, one session per
graph, ONNX Runtime's CPU provider with trtflow's session options (graph optimizations off, as every simulation).

    python bench/emulation.py [--runs 30]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = {  # name -> (source, input shape)
    "squeezenet": ("examples/squeezenet-cls/models/squeezenet1_1.onnx", [1, 3, 224, 224]),
    "ppocr-cls": ("examples/ppocr-cls/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192]),
    "ppocr-det": ("examples/ppocr-det/models/ch_PP-OCRv4_det_infer.onnx", [1, 3, 320, 320]),
    "ppocr-rec": ("examples/ppocr-rec/models/ch_PP-OCRv4_rec_infer.onnx", [1, 3, 48, 320]),
    "speech-gru": (None, [1, 9 * 16000]),
}
INT8 = ("squeezenet", "ppocr-cls")


def prepared(name: str, work: Path) -> Path:
    from trtflow.artifact import Artifact, Inputs
    from trtflow.pipelines.params.prepare import PrepareStage
    from trtflow.stages.prepare import stage as prepare

    source, shape = MODELS[name]
    if source is None:
        from bench.memory import make_audio
        src = make_audio(work / f"{name}.src.onnx")
    else:
        src = ROOT / source
    first = onnx.load(str(src), load_external_data=False).graph.input[0].name
    out = work / name
    out.mkdir()
    params = PrepareStage.model_validate({"kind": "prepare", "target_opset": 17, "input_shapes": {first: shape},
                                          "preflight": "off"})
    return prepare.run(params, Inputs({"model": Artifact(src, "onnx", "src")}), out).outputs["model"]


def int8_variant(model: Path, shape: list[int], work: Path) -> Path:
    from trtflow.artifact import Artifact, Inputs
    from trtflow.pipelines.params.calibrate import CalibrateStage
    from trtflow.stages.calibrate import stage as calibrate

    first = onnx.load(str(model), load_external_data=False).graph.input[0].name
    out = work / "int8"
    out.mkdir()
    params = CalibrateStage.model_validate({"kind": "calibrate", "holdout": 0,
                                            "data": {"random": True, "samples": 8, "shapes": {first: shape}}})
    return calibrate.run(params, Inputs({"model": Artifact(model, "onnx", "m")}), out).outputs["model"]


def every_output_rounded():
    """The emulation as it was: every FP16 node's outputs rounded (the rule that skips selecting ops turned off)."""
    from unittest import mock

    from trtflow.stages.onnx import fp16_emulation

    return mock.patch.object(fp16_emulation, "_stays_fp16", lambda *args: False)


def timed(path: Path, feed: dict[str, np.ndarray], runs: int) -> tuple[float, list[np.ndarray]]:
    from trtflow.stages.ort.runner import session

    sess = session(path)
    outputs = sess.run(None, feed)
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        sess.run(None, feed)
        seconds.append(time.perf_counter() - started)
    return float(np.median(seconds)), outputs


def measure(name: str, runs: int, work: Path) -> list[tuple]:
    from trtflow.pipelines.params.precision import PrecisionStage
    from trtflow.stages.onnx import fp16
    from trtflow.stages.onnx.fp16_emulation import emulate, emulated

    model_path = prepared(name, work)
    model = onnx.load(str(model_path))
    shape = MODELS[name][1]
    feed = {model.graph.input[0].name: (np.random.default_rng(0).standard_normal(shape) * 2).astype(np.float32)}
    fp32, _ = timed(model_path, feed, runs)
    block_ops = set(PrecisionStage.model_validate({"kind": "precision"}).block_ops)
    half = fp16.plan(model, {}, block_ops).half
    graphs = {"fp16": lambda: emulate(model, half, True)}
    if name in INT8:
        variant = onnx.load(str(int8_variant(model_path, shape, work)))
        graphs["int8 + fp16 remainder"] = lambda: emulated(variant)
    rows = []
    for label, build in graphs.items():
        with every_output_rounded():
            before = build()
        after = build()
        onnx.save(before, str(work / f"{label}.before.onnx"))
        onnx.save(after, str(work / f"{label}.after.onnx"))
        t_before, out_before = timed(work / f"{label}.before.onnx", feed, runs)
        t_after, out_after = timed(work / f"{label}.after.onnx", feed, runs)
        same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(out_before, out_after))
        casts = [sum(n.op_type == "Cast" for n in g.graph.node) for g in (before, after)]
        rows.append((name, label, fp32, t_before, t_after, casts, same))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = ap.parse_args()

    import contextlib
    import io

    from rich.console import Console
    from rich.table import Table

    rows = []
    for name in args.models:
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
            rows += measure(name, args.runs, Path(tmp))
    table = Table(title=f"Emulated passes against the FP32 pass, ONNX Runtime CPU, median of {args.runs}",
                  title_justify="left")
    for col in ("model", "emulated", "FP32 ms", "before ms", "x FP32", "after ms", "x FP32", "Casts before -> after",
                "same outputs"):
        table.add_column(col, justify="left" if col in ("model", "emulated") else "right")
    for name, label, fp32, before, after, casts, same in rows:
        table.add_row(name, label, f"{fp32 * 1e3:.2f}", f"{before * 1e3:.2f}", f"{before / fp32:.2f}",
                      f"{after * 1e3:.2f}", f"{after / fp32:.2f}", f"{casts[0]} -> {casts[1]}", "yes" if same else "NO")
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
