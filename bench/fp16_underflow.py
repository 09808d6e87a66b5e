"""FP16 at the low end on a real model (issue #51): Spotify's basic-pitch note transcriber (`nmp.onnx` from the
basic-pitch 0.4.0 wheel) adds 1e-10 before a Log; FP16 rounds it to 0, and silence (a magnitude of exactly 0)
then reaches Log as 0: -inf, then NaN in every output. trtflow's precision stage, with its FP32 fallback off (how
it behaved before: it guarded only the high end) and on (the low-end rule: a small constant FP16 rounds to 0, an
activation that reaches a Log, a divisor, Reciprocal, Pow or Sqrt below 3e-8 on the sample data), on the same
audio windows; judged as its users read it: the (frame, pitch) cells of each posteriorgram above 0.5 (notes,
onsets, contours) against FP32's, and NaN/Inf.

Audio: no recording is at hand, so the windows are synthesized (2 s of 22050 Hz: piano-like notes, harmonics with
decaying envelopes, between stretches of digital silence; basic-pitch's window is 43844 samples). A stand-in for
music, not a measurement of transcription quality: what it checks is NaN, and agreement with FP32.
Numbers are ONNX Runtime CPU running the FP16 ONNX (not a TensorRT number).

    python bench/fp16_underflow.py [--windows 6]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import int8_models  # noqa: E402

RATE, WINDOW = 22050, 43844


def windows(n: int, seed: int = 0) -> list[np.ndarray]:
    """`n` windows of synthesized notes with digital silence between them, [1, 43844, 1] float32."""
    rng = np.random.default_rng(seed)
    out = []
    t = np.arange(WINDOW) / RATE
    for _ in range(n):
        x = np.zeros(WINDOW)
        for _ in range(rng.integers(2, 5)):
            start = int(rng.integers(0, WINDOW // 2))
            length = int(rng.integers(RATE // 8, RATE // 2))
            f0 = 440.0 * 2 ** ((int(rng.integers(-24, 18))) / 12)
            span = slice(start, min(WINDOW, start + length))
            tt = t[span] - t[start]
            note = sum(np.sin(2 * np.pi * f0 * k * tt) / k for k in range(1, 5)) * np.exp(-3 * tt)
            x[span] += 0.3 * note
        out.append(x.astype(np.float32)[None, :, None])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=6)
    args = ap.parse_args()
    from trtflow.artifact import Artifact, Inputs
    from trtflow.pipelines.params.precision import PrecisionStage
    from trtflow.stages.ort.runner import session
    from trtflow.stages.precision import stage as precision

    model = int8_models.wheel("basic_pitch", "basic_pitch/saved_models") / "basic_pitch" / "saved_models" / \
        "icassp_2022" / "nmp.onnx"
    console = Console(width=150)
    table = Table(title=f"basic-pitch nmp.onnx, FP16 variant, {args.windows} synthesized audio windows (4 hold-out); "
                        f"onnxruntime CPU", title_justify="left")
    for col in ("fallback", "kept FP32", "NaN/Inf (hold-out)", "note cells = FP32", "onset cells = FP32",
                "contour cells = FP32", "op types kept FP32"):
        table.add_column(col)
    with tempfile.TemporaryDirectory(prefix="trtflow-underflow-") as tmp:
        tmp = Path(tmp)
        feeds = windows(args.windows)
        arts = []
        for i, w in enumerate(feeds):
            np.save(tmp / f"w{i}.npy", w)
            arts.append(Artifact(tmp / f"w{i}.npy", "file", f"w{i}.npy"))
        ref = session(model)
        name = ref.get_inputs()[0].name
        outs = [o.name for o in ref.get_outputs()]
        reasons: dict[str, str] = {}
        for label, auto in (("off (before)", False), ("auto (the low-end rule)", True)):
            out = tmp / label.split()[0]
            out.mkdir()
            params = PrecisionStage.model_validate({"kind": "precision", "data": {"tensors": "*.npy"}, "holdout": 4,
                                                    "fallback": {"auto": auto}, "preflight": "off"})
            result = precision.run(params, Inputs({"model": Artifact(model, "onnx", "m"), "tensors": arts}), out)
            report = json.loads(result.outputs["report"].read_text())
            cand = session(result.outputs["model"])
            bad, agree = 0, {o: [] for o in outs}
            for w in feeds[-4:]:
                r, g = ref.run(outs, {name: w}), cand.run(outs, {name: w})
                for o, a, b in zip(outs, r, g):
                    bad += int((~np.isfinite(b)).sum())
                    agree[o].append(float(((a > 0.5) == (np.nan_to_num(b, nan=0.0) > 0.5)).mean()))
            kept = report["kept_fp32"]
            import onnx
            ops = {n.name: n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node}
            counts: dict[str, int] = {}
            for n in kept:
                counts[ops.get(n, "?")] = counts.get(ops.get(n, "?"), 0) + 1
            why = ", ".join(f"{op} x{c}" for op, c in sorted(counts.items(), key=lambda kv: -kv[1]))
            reasons.update(kept)
            by_shape = {o: np.mean(agree[o]) for o in outs}
            # basic-pitch's outputs: :1 notes [.., 88], :2 onsets [.., 88], :0 contours [.., 264]
            table.add_row(label, f"{len(kept)} of {report['nodes']}", str(bad),
                          *(f"{by_shape[f'StatefulPartitionedCall:{i}']:.4f}" for i in (1, 2, 0)), why)
    console.print(table)
    for node, why in reasons.items():
        console.print(f"  kept: {node}: {why}", soft_wrap=True)


if __name__ == "__main__":
    main()
