"""INT8 on trained models: trtflow's `calibrate` stage (its default recipe) against NVIDIA ModelOpt's ONNX PTQ
(`modelopt.onnx.quantization.quantize`, int8, entropy and max), same prepared model, same calibration samples,
judged on held-out samples by the model's task metric against FP32, all on ONNX Runtime's CPU provider with graph
optimizations off (Q/DQ executed as fake quantization). trtflow's calibrate is given the `metrics:` block a user
declares for the model (int8_models' `declare`): its range check decides by it on the calibration samples.

Models and data: bench/int8_models.py (trained models from wheels; text images and sentences made from real
photos and real prose). Each model is first put through trtflow's `prepare` stage (opset 17, onnxsim); both
quantizers start from that file. ModelOpt runs in its own process (it patches ONNX Runtime's quantization
modules) with `high_precision_dtype="fp32"` (what is left unquantized stays FP32, as in trtflow's output),
`calibration_eps=["cpu"]` and `calibration_shapes` set to the samples' shape.

Needs ModelOpt 0.47 without its [onnx] extra (`pip install --no-deps
nvidia-modelopt==0.47.*` plus its listed dependencies and antlr4-python3-runtime); scikit-image (more photos)
is used when installed.

    python bench/int8.py [MODEL ...] [--calib 12] [--eval N] [--json out.json] [--fresh]
    python bench/int8.py ppocr_cls --sweep 4 8 16 32    # the task metric against the number of calibration samples
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import int8_models

FRESH = False  # --fresh: quantize with ModelOpt again instead of reusing its cached models
RUNTIME = "onnxruntime-cpu, graph optimizations off (Q/DQ as fake quantization)"
COMPUTE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def prepared(bench: int8_models.Bench, work: Path) -> Path:
    """The model through trtflow's prepare stage, as a pipeline would hand it to calibrate (cached)."""
    out = int8_models.CACHE / "prepared" / f"{bench.name}.onnx"
    if out.exists():
        return out
    from trtflow.artifact import Artifact, Inputs
    from trtflow.pipelines.params.prepare import PrepareStage
    from trtflow.stages.prepare import stage as prepare

    params = PrepareStage.model_validate({"kind": "prepare", "target_opset": 17, "input_shapes": bench.shapes,
                                          "preflight": "off"})
    (work / "prepare").mkdir()
    result = prepare.run(params, Inputs({"model": Artifact(bench.model, "onnx", "src")}), work / "prepare")
    out.parent.mkdir(parents=True, exist_ok=True)
    m = onnx.load(str(result.outputs["model"]))
    onnx.save(m, str(out))
    return out


def save_samples(samples: list[dict[str, np.ndarray]], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, s in enumerate(samples):
        p = folder / f"s{i:03d}.npz"
        np.savez(p, **s)
        paths.append(p)
    return paths


def run_trtflow(model: Path, calib: list[Path], out: Path, **params: Any) -> dict:
    from trtflow.artifact import Artifact, Inputs
    from trtflow.pipelines.params.calibrate import CalibrateStage
    from trtflow.stages.calibrate import stage as calibrate

    out.mkdir(parents=True)
    p = CalibrateStage.model_validate({"kind": "calibrate", "holdout": 0,
                                       "data": {"tensors": "*.npz", "samples": len(calib)}, **params})
    t0 = time.perf_counter()
    result = calibrate.run(p, Inputs({"model": Artifact(model, "onnx", "m"),
                                      "tensors": [Artifact(f, "file", f.name) for f in calib]}), out)
    report = json.loads(result.outputs["report"].read_text())
    return {"model": str(result.outputs["model"]), "seconds": time.perf_counter() - t0,
            "left_in_float": report.get("left_in_float", {})}


def modelopt_worker(model: str, calib: list[str], method: str, shapes: dict[str, list[int]], out: str,
                    dtype: str = "fp32") -> dict:
    """ModelOpt's ONNX PTQ, in this (child) process; `dtype`: its high_precision_dtype (the remainder's)."""
    from modelopt.onnx.quantization import quantize

    feeds = [dict(np.load(f)) for f in calib]
    data = {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}
    shape = ",".join(f"{k}:{'x'.join(map(str, v))}" for k, v in shapes.items())
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        quantize(onnx_path=model, quantize_mode="int8", calibration_method=method, calibration_data=data,
                 calibration_eps=["cpu"], calibration_shapes=shape, override_shapes=shape,
                 high_precision_dtype=dtype, output_path=out, log_level="ERROR")
    return {"model": out, "seconds": time.perf_counter() - t0}


def run_modelopt(model: Path, calib: list[Path], method: str, shapes: dict[str, list[int]], out: Path,
                 dtype: str = "fp32") -> dict:
    """ModelOpt's Q/DQ model of `model` (kept in the cache: the samples are seeded, the same on every run; --fresh
    makes them again)."""
    done = out.with_suffix(".json")
    if done.exists() and out.exists() and not FRESH:
        return json.loads(done.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    request = json.dumps({"model": str(model), "calib": [str(c) for c in calib], "method": method,
                          "shapes": shapes, "out": str(out), "dtype": dtype})
    # ModelOpt keys dicts by id() of protobuf objects, unstable with protobuf's upb backend (shared FIELD_NOTES):
    # its pure-Python backend keeps them stable (seen: the same run giving text exact 0.96 and 0.71 without it)
    env = {**os.environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python"}
    proc = subprocess.run([sys.executable, __file__, "--modelopt-worker", request], capture_output=True, text=True,
                          cwd=out.parent, env=env, check=False)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    done.write_text(proc.stdout.strip().splitlines()[-1])
    return json.loads(done.read_text())


def left_in_float(path: Path) -> tuple[int, int]:
    """(compute ops reading no DequantizeLinear output, compute ops): Conv/ConvTranspose/Gemm/MatMul."""
    m = onnx.load(str(path), load_external_data=False)
    dq = {o for n in m.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    ops = [n for n in m.graph.node if n.op_type in COMPUTE_OPS]
    return sum(not any(i in dq for i in n.input) for n in ops), len(ops)


def evaluate(bench: int8_models.Bench, ref_outputs: list[list[np.ndarray]], model: Path,
             held: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """The task metric of `model` as validate simulates an INT8 variant: Q/DQ as fake quantization, and an FP16
    remainder (trtflow's or ModelOpt's) rounded to FP16 node by node."""
    from trtflow.stages.ort.simulation import simulate

    with tempfile.TemporaryDirectory() as tmp:
        sess = simulate(model, onnx.ModelProto(), "int8").session(Path(tmp))
    if bench.metric is None:
        return _declared(bench, sess, ref_outputs, held)
    metric = bench.metric()
    for feed, ref in zip(held, ref_outputs):
        got = sess.run(None, feed)
        metric.add(bench.view(ref, feed), bench.view(got, feed))
    return metric.result()


def _declared(bench: int8_models.Bench, sess: Any, ref_outputs: list[list[np.ndarray]],
              held: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """The task values of the metrics the bench declares, as validate's comparison computes them."""
    from trtflow.pipelines.params.validate import ValidateStage
    from trtflow.stages.compare.accuracy import Comparison

    names = [o.name for o in sess.get_outputs()]
    cmp = Comparison(ValidateStage.model_validate({"kind": "validate", "metrics": bench.declare}).metrics)
    for feed, ref in zip(held, ref_outputs):
        cmp.add(dict(zip(names, ref)), dict(zip(names, sess.run(None, feed))), feed)
    return {k: v for out in cmp.result(RUNTIME).outputs.values() for k, v in out.task_values.items()}


def measure(name: str, n_calib: int, n_eval: int, work: Path) -> dict:
    from trtflow.stages.onnx.composition import composition
    from trtflow.stages.ort.runner import session

    bench = int8_models.MODELS[name](n_calib + n_eval)
    model = prepared(bench, work)
    calib = save_samples(bench.samples[:n_calib], work / "calib")
    held = bench.samples[n_calib:n_calib + n_eval]
    ref = session(model)
    ref_outputs = [ref.run(None, f) for f in held]
    row: dict[str, Any] = {"model": name, "what": bench.what, "data": bench.data, "calib": n_calib,
                           "eval": len(held), "headline": bench.headline, "results": {}}
    mo = int8_models.CACHE / "modelopt"
    runs = {"trtflow": lambda: run_trtflow(model, calib, work / "trtflow", metrics=bench.declare, remainder="fp32"),
            "modelopt_entropy": lambda: run_modelopt(model, calib, "entropy", bench.shapes,
                                                     mo / f"{name}-entropy-{n_calib}.onnx"),
            "modelopt_max": lambda: run_modelopt(model, calib, "max", bench.shapes, mo / f"{name}-max-{n_calib}.onnx"),
            "trtflow_fp16": lambda: run_trtflow(model, calib, work / "trtflow_fp16", metrics=bench.declare,
                                                remainder="fp16"),
            "modelopt_fp16": lambda: run_modelopt(model, calib, "entropy", bench.shapes,
                                                  mo / f"{name}-entropy-fp16-{n_calib}.onnx", "fp16")}
    for label, fn in runs.items():
        try:
            r = fn()
        except Exception as exc:  # noqa: BLE001 - a bench row says what failed and goes on
            r = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        if "error" not in r:
            r["metric"] = evaluate(bench, ref_outputs, Path(r["model"]), held)
            r["float"] = left_in_float(Path(r["model"]))
            r["composition"] = composition(onnx.load(r["model"]), bench.shapes).model_dump()
        row["results"][label] = r
    return row


def sweep(name: str, counts: list[int], n_eval: int, work: Path) -> list[dict]:
    """trtflow's default recipe calibrated on the first k samples, for each k, judged on the same held-out ones."""
    from trtflow.stages.ort.runner import session

    bench = int8_models.MODELS[name](max(counts) + n_eval)
    model = prepared(bench, work)
    files = save_samples(bench.samples[:max(counts)], work / "calib")
    held = bench.samples[max(counts):]
    ref = session(model)
    ref_outputs = [ref.run(None, f) for f in held]
    rows = []
    for k in counts:
        r = run_trtflow(model, files[:k], work / f"k{k}", min_samples=1)
        rows.append({"samples": k, "metric": evaluate(bench, ref_outputs, Path(r["model"]), held)})
    return rows


def _fmt(metric: dict[str, float], names: list[tuple[str, bool]]) -> str:
    return " / ".join(f"{metric[n]:.3f}" if n != "cer" else f"{100 * metric[n]:.1f}%" for n, _ in names
                      if n in metric)


def _better(a: dict[str, float], b: dict[str, float], names: list[tuple[str, bool]]) -> bool:
    """a at least as good as b on the headline metric (the first name)."""
    n, higher = names[0]
    return a[n] >= b[n] - 1e-12 if higher else a[n] <= b[n] + 1e-12


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"INT8 vs FP32 on held-out samples, task metric ({RUNTIME}); trtflow calibrate defaults "
                        f"vs ModelOpt {_modelopt_version()} ONNX PTQ", title_justify="left")
    floats = "compute ops in float (trtflow / MO-e / MO-m)"
    for col in ("model", "metric", "trtflow", "ModelOpt entropy", "ModelOpt max", floats, "trtflow >= best MO",
                "s (trtflow / MO-e / MO-m)"):
        table.add_column(col, justify="left" if col in ("model", "metric") else "right")
    for row in rows:
        res, names = row["results"], [tuple(h) for h in row["headline"]]
        cells = []
        for label in ("trtflow", "modelopt_entropy", "modelopt_max"):
            r = res[label]
            cells.append(f"failed: {r['error'][:60]}" if "error" in r else _fmt(r["metric"], names))
        floats = " / ".join("-" if "error" in res[k] else f"{res[k]['float'][0]}/{res[k]['float'][1]}"
                            for k in ("trtflow", "modelopt_entropy", "modelopt_max"))
        times = " / ".join("-" if "error" in res[k] else f"{res[k]['seconds']:.0f}"
                           for k in ("trtflow", "modelopt_entropy", "modelopt_max"))
        mos = [res[k]["metric"] for k in ("modelopt_entropy", "modelopt_max") if "error" not in res[k]]
        verdict = "-" if "error" in res["trtflow"] else \
            ("yes" if all(_better(res["trtflow"]["metric"], m, names) for m in mos) else "NO")
        label = " / ".join(n for n, _ in names)
        table.add_row(row["model"], f"{label} ({row['calib']} calib, {row['eval']} held out)", *cells, floats,
                      verdict, times)
    Console(width=200).print(table)
    print_remainder_table(rows)
    for row in rows:
        print(f"- {row['model']}: {row['what']}; data: {row['data']}")
        left = row["results"]["trtflow"].get("left_in_float") or {}
        if left:
            reasons: dict[str, int] = {}
            for why in left.values():
                reasons[why] = reasons.get(why, 0) + 1
            print("    trtflow left in float: " + "; ".join(f"{k} x{v}" for k, v in reasons.items()))


def print_remainder_table(rows: list[dict]) -> None:
    """What is not quantized in FP16: trtflow's calibrate `remainder: fp16` against ModelOpt's default
    (high_precision_dtype fp16, entropy), both simulated with the FP16 rounding per node, beside trtflow's FP32
    remainder; with each one's multiply-accumulates by precision as TensorRT builds the graph."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"INT8 with the remainder in FP16 vs FP32 on held-out samples, task metric ({RUNTIME}, "
                        f"FP16 rounded per node); ModelOpt {_modelopt_version()} default = entropy, "
                        f"high_precision_dtype fp16", title_justify="left")
    for col in ("model", "metric", "trtflow FP32 rem.", "trtflow FP16 rem.", "ModelOpt default",
                "MACs (trtflow FP16 rem.)", "MACs (ModelOpt default)", "trtflow FP16 >= MO default",
                "FP16 rem. >= FP32 rem."):
        table.add_column(col, justify="left" if col in ("model", "metric") else "right")
    for row in rows:
        res, names = row["results"], [tuple(h) for h in row["headline"]]
        keys = ("trtflow", "trtflow_fp16", "modelopt_fp16")
        if any(k not in res for k in keys):
            continue
        cells = [f"failed: {res[k]['error'][:60]}" if "error" in res[k] else _fmt(res[k]["metric"], names)
                 for k in keys]
        macs = ["-" if "error" in res[k] else _macs(res[k]["composition"]) for k in keys[1:]]
        ok = [k for k in keys if "error" not in res[k]]

        def at_least(a: str, b: str) -> str:
            if a not in ok or b not in ok:
                return "-"
            return "yes" if _better(res[a]["metric"], res[b]["metric"], names) else "NO"

        table.add_row(row["model"], " / ".join(n for n, _ in names), *cells, *macs,
                      at_least("trtflow_fp16", "modelopt_fp16"), at_least("trtflow_fp16", "trtflow"))
    Console(width=200).print(table)


def _macs(made: dict) -> str:
    share = made["mac_share"]
    return " · ".join(f"{share[p]:.0%} {p.upper()}" for p in ("int8", "fp16", "fp32") if share[p] > 0)


def _modelopt_version() -> str:
    try:
        from importlib.metadata import version
        return version("nvidia-modelopt")
    except Exception:  # noqa: BLE001
        return "(not installed)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(int8_models.MODELS))
    ap.add_argument("--calib", type=int, default=12)
    ap.add_argument("--eval", type=int, help="held-out samples (default: 288 text lines, the detectors 48)")
    ap.add_argument("--json")
    ap.add_argument("--sweep", type=int, nargs="+")
    ap.add_argument("--fresh", action="store_true", help="run ModelOpt again (its models are cached)")
    ap.add_argument("--modelopt-worker")
    args = ap.parse_args()
    global FRESH
    FRESH = args.fresh
    if args.modelopt_worker:
        logging.disable(logging.WARNING)
        print(json.dumps(modelopt_worker(**json.loads(args.modelopt_worker))))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    if args.sweep:
        for name in args.models:
            with tempfile.TemporaryDirectory() as tmp:
                n_eval = args.eval or int8_models.EVAL_SAMPLES.get(name, int8_models.DEFAULT_EVAL)
                rows = sweep(name, sorted(args.sweep), n_eval, Path(tmp))
            print(f"{name}: trtflow calibrate defaults, task metric on {n_eval} held-out samples ({RUNTIME})")
            for r in rows:
                print(f"  {r['samples']:3d} calibration samples: " + ", ".join(f"{k} {v:.4f}"
                                                                           for k, v in r["metric"].items()))
        return
    rows = []
    for name in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            n_eval = args.eval or int8_models.EVAL_SAMPLES.get(name, int8_models.DEFAULT_EVAL)
            rows.append(measure(name, args.calib, n_eval, Path(tmp)))
            print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    print_table(rows)


if __name__ == "__main__":
    main()
