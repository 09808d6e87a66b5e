"""The zoo: real architectures of many families through prepare -> fp16 -> int8 (entropy, percentile, minmax) ->
build, each as a trtflow pipeline run by the runner (no Prefect), on each model's own sample data.

Prints per model: nodes before/after prepare against onnxsim alone, FP16 nodes kept in FP32, the FP16 and INT8
CPU pre-flights (worst output's cosine and max abs error; ONNX Runtime, simulated precision), the engine size of
every variant (the installed TensorRT flavour: TensorRT-RTX on a machine without a GPU), the INT8 size against
FP32 (the baseline measured in the same run), and the time of every stage. Models come from bench/zoo_models.py
(made on first use into $TRTFLOW_ZOO, default ~/.cache/trtflow-zoo). With --validate VARIANT, a validate stage
checks every engine against FP32 (simulated on ONNX Runtime without a GPU), localizes failures and repairs VARIANT.

    python bench/zoo.py [MODEL ...] [--json out.json] [--validate int8_entropy]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import onnx
from rich.console import Console
from rich.table import Table

from trtflow.flows.runner import Runner
from trtflow.flows.store import LocalStore
from trtflow.pipelines.loader import load_pipeline

ZOO = Path(os.environ.get("TRTFLOW_ZOO", Path.home() / ".cache" / "trtflow-zoo"))
METHODS = ("entropy", "percentile", "minmax")
TRAINED = {"ppocr_rec", "ppocr_det", "ppocr_cls"}


def ensure_zoo() -> dict[str, Any]:
    manifest = ZOO / "models" / "manifest.json"
    if not manifest.exists():
        subprocess.run([sys.executable, str(Path(__file__).with_name("zoo_models.py"))], check=True,
                       env={**os.environ, "TRTFLOW_ZOO": str(ZOO)})
    return json.loads(manifest.read_text())


def pipeline(name: str, facts: dict[str, Any], repair: str | None = None,
             methods: tuple[str, ...] = METHODS) -> str:
    model = ZOO / "models" / f"{name}.onnx"
    data = ZOO / "data" / name / "*.npz"
    opt = {k: v[1] for k, v in facts["profiles"].items()}
    profile = {k: {"min": v[0], "opt": v[1], "max": v[2]} for k, v in facts["profiles"].items()}
    samples = facts.get("samples", 8)  # as bench/zoo_models.py made them; a quarter (at least 4) held out
    holdout = max(4, samples // 4)
    tensors = {"tensors": str(data), "samples": samples}
    stages: dict[str, Any] = {
        "prepare": {"kind": "prepare", "target_opset": 17, "input_shapes": opt, "check": {"data": tensors}},
        "fp16": {"kind": "precision", "data": tensors, "holdout": holdout},
        **{f"int8_{m}": {"kind": "calibrate", "method": m, "data": tensors, "holdout": holdout} for m in methods},
        "build": {"kind": "build", "profiles": {"opt": profile}, "parallel": 2},
    }
    if repair:  # every engine against the FP32 reference; one variant repaired where it fails
        stages["validate"] = {"kind": "validate", "data": tensors, "repair": True, "repair_variant": repair}
    return json.dumps({"version": 1, "name": f"zoo-{name}", "model": str(model), "stages": stages})


def run_model(name: str, facts: dict[str, Any], work: Path, repair: str | None = None,
              methods: tuple[str, ...] = METHODS) -> dict[str, Any]:
    (work / "pipeline.yaml").write_text(pipeline(name, facts, repair, methods))  # JSON is YAML
    runner = Runner(load_pipeline(work / "pipeline.yaml"), store=LocalStore(work / "store"))
    produced: dict[str, Any] = {}  # stage -> its Manifest
    reports: dict[str, Path] = {}  # stage -> its report.json (a failed verdict's too)
    row: dict[str, Any] = {"model": name, "seconds": {}, "errors": {}}
    for stage in runner.graph.order:
        if runner.graph.nodes[stage].upstream - set(produced):
            row["errors"][stage] = "skipped: an input stage failed"
            continue
        t0 = time.perf_counter()
        try:
            outcome = runner.run_stage(stage, produced)
            produced[stage] = outcome.manifest
            if "report" in outcome.manifest.outputs:
                reports[stage] = outcome.directory / outcome.manifest.outputs["report"].path
        except Exception as exc:  # noqa: BLE001 - a bench records failures and goes on
            row["errors"][stage] = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            directory = getattr(exc, "directory", None)
            if directory is not None:  # a failed verdict is published with its report
                reports[stage] = Path(directory) / "report.json"
        row["seconds"][stage] = round(time.perf_counter() - t0, 1)
    row.update(_facts(reports, name))
    return row


def _report(reports: dict[str, Path], stage: str) -> dict[str, Any] | None:
    path = reports.get(stage)
    return json.loads(path.read_text()) if path is not None and path.exists() else None


def _worst(acc: dict[str, Any]) -> tuple[float, float]:
    outs = acc["outputs"].values()
    return min(o["cosine"] for o in outs), max(o["max_abs"] for o in outs)


def _facts(reports: dict[str, Path], name: str) -> dict[str, Any]:
    from trtflow.stages.onnx.simplifier import onnxsim as load_onnxsim

    onnxsim = load_onnxsim()
    out: dict[str, Any] = {}
    prep = _report(reports, "prepare")
    if prep:
        out["nodes"] = (prep["before"]["nodes"], prep["after"]["nodes"])
        trial = prep["preflight"].get("trial_build") or {}
        out["trial_build"] = "ok" if trial.get("ok") else trial.get("error", "-")[:60]
    try:
        alone, _ = onnxsim.simplify(onnx.load(str(ZOO / "models" / f"{name}.onnx")))
        out["onnxsim_alone"] = len(alone.graph.node)
    except Exception as exc:  # noqa: BLE001
        out["onnxsim_alone"] = f"fails: {str(exc)[:40]}"
    fp16 = _report(reports, "fp16")
    if fp16:
        out["fp16"] = _worst(fp16["accuracy"])
        out["kept_fp32"] = (len(fp16["kept_fp32"]), fp16["nodes"])
    for m in METHODS:
        r = _report(reports, f"int8_{m}")
        if r and r["accuracy"]["samples"]:
            out[f"int8_{m}"] = _worst(r["accuracy"])
    build = _report(reports, "build")
    if build:
        out["engines"] = {c["variant"]: c.get("engine_bytes") if c["status"] == "ok" else None
                          for c in build["cells"]}
        out["runtime"] = f"{build['backend']['flavour']} {build['backend']['version']}"
    val = _report(reports, "validate")
    if val:
        out["validate"] = "; ".join(
            f"{c['variant']} {'ok' if c['passed'] else 'FAILS: ' + '; '.join(c['violations'])[:160]}"
            + (f" (first bad {(c.get('layerwise') or {}).get('first_bad', {}).get('op', '-')})"
               if c.get("layerwise") and c["layerwise"].get("first_bad") else "")
            for c in val["candidates"])
        rep = val.get("repair")
        if rep and rep.get("nodes"):
            out["validate"] += (f"; repair {'passes' if rep.get('passed') else 'fails'} keeping "
                                f"{len(rep['nodes'])} node(s)")
    return out


def _fmt(pair: tuple[float, float] | None) -> str:
    return "-" if not pair else f"{pair[0]:.5f} / {pair[1]:.3g}"


def _mb(n: int | None) -> str:
    return "-" if not n else f"{n / 1e6:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--validate", metavar="VARIANT", choices=["fp16", *(f"int8_{m}" for m in METHODS)],
                    help="add a validate stage: every engine against FP32, this variant repaired where it fails")
    args = ap.parse_args()
    manifest = ensure_zoo()
    names = args.models or [n for n in manifest if (ZOO / "models" / f"{n}.onnx").exists()]
    console = Console(width=250)
    rows = []
    for name in names:
        console.print(f"[dim]{name} ...[/]")
        with tempfile.TemporaryDirectory(prefix=f"zoo-{name}-") as tmp:
            try:
                rows.append(run_model(name, manifest[name], Path(tmp), args.validate))
            except Exception:  # noqa: BLE001
                rows.append({"model": name, "errors": {"bench": traceback.format_exc().splitlines()[-1]},
                             "seconds": {}})
    runtime = next((r["runtime"] for r in rows if r.get("runtime")), "no TensorRT")
    table = Table(title=f"zoo · pre-flights: onnxruntime-cpu (simulated precision), worst output cosine / max abs "
                        f"error · engines: {runtime}", title_justify="left")
    for col in ("model", "nodes before → after prepare", "onnxsim alone", "FP16 kept FP32", "FP16", "INT8 entropy",
                "INT8 percentile", "INT8 minmax", "engine MB fp32 / fp16 / int8 (entropy)", "int8 / fp32 size",
                "trial build", "validate", "stage seconds", "errors"):
        table.add_column(col, overflow="fold")
    for r in rows:
        e = r.get("engines", {})
        fp32, int8 = e.get("prepare"), e.get("int8_entropy")
        table.add_row(
            r["model"] + (" (trained)" if r["model"] in TRAINED else ""),
            "{} → {}".format(*r["nodes"]) if r.get("nodes") else "-", str(r.get("onnxsim_alone", "-")),
            "{} of {}".format(*r["kept_fp32"]) if r.get("kept_fp32") else "-", _fmt(r.get("fp16")),
            *(_fmt(r.get(f"int8_{m}")) for m in METHODS),
            f"{_mb(fp32)} / {_mb(e.get('fp16'))} / {_mb(int8)}", f"{int8 / fp32:.2f}x" if fp32 and int8 else "-",
            str(r.get("trial_build", "-")), r.get("validate", "-"),
            ", ".join(f"{k} {v}" for k, v in r["seconds"].items()),
            "; ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "-")
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
