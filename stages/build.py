"""Stage `build`: one TensorRT engine per model variant x optimization profile x target.

Profiles are checked against each model's inputs before anything is built. Each cell builds in its own process
(`stages/trt_build_worker.py`), at most `parallel` at a time, so a crash inside TensorRT fails that cell with a
report instead of the pipeline. Strongly typed by default: precision comes from the ONNX variants.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import onnx

from stages import progress
from stages.base import Artifact, StageError, StageFailed, StageResult
from stages.onnx_inspect import did_you_mean, graph_inputs
from stages.trt_env import INSTALL_HINT, detect_tensorrt, gpus
from stages.trt_preflight import hint_for

VERSION = "1"
CELL_TIMEOUT_S = 3600


def backend(requested: str) -> dict[str, str]:
    if requested == "auto":
        found = detect_tensorrt()
        if found is None:
            raise StageError(f"build: no TensorRT flavour is installed: {INSTALL_HINT}")
        return found
    found = detect_tensorrt(only={"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}[requested])
    if found is None:
        hint = "pip install tensorrt-rtx-cu13" if requested == "tensorrt-rtx" else "install TensorRT"
        raise StageError(f"build: backend: {requested} is not installed ({hint}), or use backend: auto")
    return found


def check_options(params: Any, be: dict[str, str]) -> None:
    """Refuse options the installed backend lacks, rather than ignoring them."""
    rtx = be["flavour"] == "tensorrt-rtx"
    major = int(be["version"].split(".")[0]) if be["version"][:1].isdigit() else 0
    if params.legacy_precision and (rtx or major >= 11):
        raise StageError(f"build: legacy_precision ({', '.join(params.legacy_precision)}) needs TensorRT 10's "
                         f"builder flags, which {be['flavour']} {be['version']} does not have: precision comes "
                         f"from the ONNX (use the precision/calibrate stages' models)")
    bad_targets = [t for t in params.targets if t != "native"]
    if bad_targets and not rtx:
        raise StageError(f"build: targets {bad_targets}: choosing compute capabilities needs TensorRT-RTX; "
                         f"TensorRT builds for the GPU it runs on (use targets: [native])")
    if rtx:
        import importlib
        trt = importlib.import_module(be["module"])
        known = {m.lower() for m in trt.ComputeCapability.__members__ if m.startswith("SM")}
        for t in bad_targets:
            if t.lower() not in known:
                raise StageError(f"build: unknown target '{t}' for {be['flavour']} {be['version']}; known: "
                                 f"{', '.join(sorted(known))}{did_you_mean(t.lower(), sorted(known))}")
        if params.hardware_compatibility and not hasattr(trt.IBuilderConfig, "hardware_compatibility_level"):
            raise StageError(f"build: hardware_compatibility is not available in {be['flavour']} {be['version']}")


def model_inputs(model: Path) -> dict[str, list[Any]]:
    out = {}
    for vi in graph_inputs(onnx.load(str(model), load_external_data=False)):
        out[vi.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                        for d in vi.type.tensor_type.shape.dim]
    return out


def resolve_profiles(params: Any, inputs: dict[str, list[Any]], variant: str) -> list[dict[str, Any]]:
    """[{name, shapes: {input: (min, opt, max)}}], every dynamic dimension covered, static ones respected."""
    dynamic = [(n, i, d) for n, dims in inputs.items() for i, d in enumerate(dims) if not isinstance(d, int)]
    if not params.profiles:
        if dynamic:
            n, i, d = dynamic[0]
            raise StageError(f"build: model '{variant}' input '{n}' dimension {i} ({d}) is dynamic, but no "
                             f"optimization profile is given: add stages.<build>.profiles: {{NAME: {{{n}: "
                             f"{{min: [...], opt: [...], max: [...]}}}}}}")
        static = {n: (dims, dims, dims) for n, dims in inputs.items()}
        return [{"name": "static", "shapes": static}]
    resolved = []
    for pname, shapes in params.profiles.items():
        where = f"profiles.{pname}"
        for name in shapes:
            if name not in inputs:
                raise StageError(f"build: {where}: model '{variant}' has no input '{name}'"
                                 f"{did_you_mean(name, list(inputs)) or '; inputs: ' + ', '.join(inputs)}")
        out: dict[str, tuple] = {}
        for name, dims in inputs.items():
            rng = shapes.get(name)
            if rng is None:
                missing = [(i, d) for i, d in enumerate(dims) if not isinstance(d, int)]
                if missing:
                    i, d = missing[0]
                    raise StageError(f"build: {where}: input '{name}' of model '{variant}' has dynamic dimension "
                                     f"{i} ({d}) but the profile gives no shape for it: add {where}.{name}")
                out[name] = (dims, dims, dims)
                continue
            if len(rng.min) != len(dims):
                raise StageError(f"build: {where}.{name}: rank {len(rng.min)} does not match the model's input "
                                 f"rank {len(dims)} ({dims})")
            for i, d in enumerate(dims):
                if isinstance(d, int) and not (rng.min[i] == rng.opt[i] == rng.max[i] == d):
                    raise StageError(f"build: {where}.{name}: dimension {i} is fixed at {d} in model '{variant}', "
                                     f"but the profile gives {rng.min[i]}/{rng.opt[i]}/{rng.max[i]}")
            out[name] = (rng.min, rng.opt, rng.max)
        resolved.append({"name": pname, "shapes": out})
    return resolved


def run(params: Any, inputs: dict[str, Artifact], out_dir: Path) -> StageResult:
    be = backend(params.backend)
    check_options(params, be)
    models: list[Artifact] = inputs["models"] if isinstance(inputs["models"], list) else [inputs["models"]]
    cells = []
    for art in models:
        variant = art.origin or art.path.stem
        profiles = resolve_profiles(params, model_inputs(art.path), variant)
        groups = [[p] for p in profiles] if params.profile_mode == "separate" else [profiles]
        for group in groups:
            for target in params.targets:
                cells.append({"variant": variant, "model": str(art.path), "profiles": group, "target": target,
                              "name": f"{variant}.{'+'.join(p['name'] for p in group)}.{target}"})
    engines = out_dir / "engines"
    engines.mkdir()
    cache = None
    if params.timing_cache and "timing_cache" in inputs:
        cache = inputs["timing_cache"].path / f"timing-{be['flavour']}-{be['version']}.cache"
    options = {k: getattr(params, k) for k in ("optimization_level", "workspace", "aux_streams",
                                               "hardware_compatibility", "version_compatible", "strip_plan",
                                               "weight_streaming", "legacy_precision")}
    t0 = time.perf_counter()

    def build_cell(cell: dict[str, Any]) -> dict[str, Any]:
        cell_dir = engines / cell["name"]
        cell_dir.mkdir()
        spec = {**cell, **be, "cell_dir": str(cell_dir), "options": options, "log_severity": params.log_severity,
                "timing_cache": str(cache) if cache else None}
        (cell_dir / "spec.json").write_text(json.dumps(spec, indent=2))
        try:
            proc = subprocess.run([sys.executable, "-m", "stages.trt_build_worker", str(cell_dir / "spec.json")],
                                  capture_output=True, text=True, timeout=CELL_TIMEOUT_S)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        info_path = cell_dir / "build.json"
        if info_path.exists():
            info = json.loads(info_path.read_text())
        else:  # the process died inside TensorRT before it could say anything
            info = {"status": "failed", "error": f"the build process crashed (exit code {code})"}
            info_path.write_text(json.dumps(info, indent=2) + "\n")
        return {**info, **{k: cell[k] for k in ("name", "variant", "target")},
                "profiles": [p["name"] for p in cell["profiles"]], "shapes": {p["name"]: p["shapes"]
                                                                               for p in cell["profiles"]}}

    with ThreadPoolExecutor(max_workers=params.parallel) as pool:  # threads wait; the builds are processes
        futures = [pool.submit(build_cell, c) for c in cells]
        for n, _ in enumerate(as_completed(futures), 1):  # progress from this thread: listeners need its context
            progress.report("building engines", n, len(cells))
        results = [f.result() for f in futures]
    wall = time.perf_counter() - t0

    for r in results:
        for f in r.get("failures", []):
            f["hint"] = hint_for(f)
    failed = [r for r in results if r["status"] != "ok"]
    report = {"backend": be, "environment": {"tensorrt": be, "gpu": gpus() or None}, "cells": results, "wall_seconds": round(wall, 3), "parallel": params.parallel,
              "timing_cache": str(cache) if cache else None}
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    result = StageResult(outputs={"engines": engines, "report": out_dir / "report.json"}, summary=summary(report),
                         metrics={"cells": len(results), "failed": len(failed), "wall_seconds": round(wall, 3),
                                  "engine_bytes": sum(r.get("engine_bytes", 0) for r in results)})
    if failed:
        first = failed[0]
        raise StageFailed(f"build: {len(failed)} of {len(results)} engine(s) failed; {first['name']}: "
                          f"{first.get('error')}", result)
    return result


def summary(r: dict[str, Any]) -> str:
    be = r["backend"]
    ok = sum(c["status"] == "ok" for c in r["cells"])
    lines = [f"### build · {be['flavour']} {be['version']} · {ok}/{len(r['cells'])} engines · "
             f"{r['wall_seconds']:.1f} s wall ({r['parallel']} in parallel)", "",
             "| engine | variant | profiles | target | status | size MB | build s | layers | peak host MB | valid here |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in r["cells"]:
        v = c.get("validity") or {}
        valid = (v.get("validity", "?") + (f" ({', '.join(v['diagnostics'])})" if v.get("diagnostics") else "")
                 if v.get("checked") else "unknown")
        status = "ok" if c["status"] == "ok" else f"**failed**: {c.get('error', '')[:120]}"
        lines.append(f"| `{c['name']}` | {c['variant']} | {', '.join(c['profiles'])} | {c['target']} | {status} | "
                     f"{c.get('engine_bytes', 0) / 1e6:.2f} | {c.get('seconds', 0):.2f} | {c.get('layers', '')} | "
                     f"{c.get('peak_host_memory_mb', '')} | {valid} |")
    lines += ["", "Engines cannot run on this machine unless it has a GPU the engine targets; `valid here` is "
                  "TensorRT-RTX's own verdict (Runtime.get_engine_validity)."]
    return "\n".join(lines) + "\n"
