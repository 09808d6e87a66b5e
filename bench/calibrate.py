"""INT8 calibration: the `calibrate` stage against calling onnxruntime's quantize_static directly, same model,
same data, same settings, in the same run; and peak memory (RSS) at 100 vs 1000 samples.

The model is PP-OCR's text-direction classifier as `prepare` hands it over (opset 17, weights as initializers);
samples are seeded random tensors of its input shape, generated one at a time on both sides. Each measurement
runs in a fresh process so peak RSS is its own.

    python bench/calibrate.py [--samples 100 1000] [--method entropy]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPE = [1, 3, 48, 192]
# the stage as a pipeline declares it by default, and as quantize_static works: one rule's ranges, no range check
# between rules, no bias correction, the unquantized remainder left FP32
KINDS = {"trtflow": {}, "trtflow-calibration": {"entropy_check": False, "bias_correction": False, "remainder": "fp32"}}
SETTINGS = dict(ActivationSymmetric=True, WeightSymmetric=True, QuantizeBias=False, AddQDQPairToWeight=False,
                DedicatedQDQPair=False)


def prepared_model(directory: Path) -> Path:
    """The example model through the real `prepare` stage (opset 17, simplified, weights as initializers)."""
    from trtflow.artifact import Artifact, Inputs
    from trtflow.pipelines.params.prepare import PrepareStage
    from trtflow.stages.prepare import stage as prepare

    src = ROOT / "examples" / "ppocr-cls" / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    out = directory / "prepared"
    out.mkdir()
    params = PrepareStage.model_validate({"kind": "prepare", "target_opset": 17, "input_shapes": {"x": SHAPE},
                                          "preflight": "off"})
    return prepare.run(params, Inputs({"model": Artifact(src, "onnx", "src")}), out).outputs["model"]


def worker(kind: str, model: Path, samples: int, method: str, out: Path) -> dict:
    t0 = time.perf_counter()
    if kind in KINDS:
        from trtflow.artifact import Artifact, Inputs
        from trtflow.pipelines.params.calibrate import CalibrateStage
        from trtflow.stages.calibrate import stage as calibrate
        params = CalibrateStage.model_validate({"kind": "calibrate", "method": method, "holdout": 0, **KINDS[kind],
                                                "data": {"random": True, "samples": samples, "shapes": {"x": SHAPE}}})
        calibrate.run(params, Inputs({"model": Artifact(model, "onnx", "m")}), out)
    else:
        import contextlib
        import io

        from onnxruntime.quantization import (
            CalibrationDataReader,
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )
        from onnxruntime.quantization.shape_inference import quant_pre_process

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.i = 0

            def get_next(self):
                if self.i >= samples:
                    return None
                rng = np.random.default_rng([0, self.i])  # the same samples the stage generates
                self.i += 1
                return {"x": rng.standard_normal(SHAPE).astype(np.float32)}

        pre = out / "pre.onnx"
        quant_pre_process(str(model), str(pre))
        with contextlib.redirect_stdout(io.StringIO()):
            quantize_static(str(pre), str(out / "model.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                            per_channel=True, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                            op_types_to_quantize=["Conv", "ConvTranspose", "Gemm", "MatMul"],
                            calibrate_method={"entropy": CalibrationMethod.Entropy, "minmax": CalibrationMethod.MinMax,
                                              "percentile": CalibrationMethod.Percentile}[method],
                            extra_options=SETTINGS)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "samples_per_s": samples / seconds,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


LABELS = {"direct": "onnxruntime quantize_static, called directly",
          "trtflow": "trtflow calibrate stage, its defaults",
          "trtflow-calibration": "trtflow calibrate stage, as quantize_static works"}


def measure(kind: str, model: Path, samples: int, method: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, __file__, "--worker", kind, "--model", str(model), "--method", method,
                               "--samples", str(samples), "--out", tmp], capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--method", default="entropy", choices=["entropy", "minmax", "percentile"])
    ap.add_argument("--worker")
    ap.add_argument("--model")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.model), args.samples[0], args.method, Path(args.out))))
        return

    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory() as tmp:
        model = prepared_model(Path(tmp))
        rows = [(n, kind, measure(kind, model, n, args.method)) for n in args.samples
                for kind in ("direct", *KINDS)]
    table = Table(title=f"INT8 calibration ({args.method}), PP-OCR cls {SHAPE}, fresh process each",
                  title_justify="left")
    for col in ("samples", "what", "seconds", "samples/s", "x direct", "peak RSS MB"):
        table.add_column(col, justify="right" if col not in ("what",) else "left")
    base = {n: r for n, k, r in rows if k == "direct"}
    for n, kind, r in rows:
        label = LABELS[kind]
        table.add_row(str(n), label, f"{r['seconds']:.1f}", f"{r['samples_per_s']:.1f}",
                      f"{r['samples_per_s'] / base[n]['samples_per_s']:.2f}", f"{r['peak_rss_mb']:.0f}")
    if args.method == "entropy":
        table.caption = ("not the same algorithm: onnxruntime's entropy with its defaults is the full range; the stage "
                         "runs TensorRT's KL search on 2048-bin histograms and checks the result against the full "
                         "ranges (a second quantization): run --method minmax for like against like")
    Console(width=130).print(table)


if __name__ == "__main__":
    main()
