"""The JSON files trtexec writes with `--exportTimes`, `--exportProfile` and `--exportLayerInfo`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from trtflow import files
from trtflow.errors import StageError

EXPORT_BYTES = 2**30  # --exportProfile of a large network with many iterations runs to hundreds of MB


def _load(path: Path, what: str) -> Any:
    try:
        return files.read_json(path, EXPORT_BYTES)
    except (OSError, ValueError) as exc:
        raise StageError(f"{path}: not a trtexec {what} JSON ({type(exc).__name__}: {str(exc)[:120]})") from None


def read_times(path: Path) -> dict[str, list[float]]:
    """--exportTimes: per iteration, milliseconds of latency, GPU compute, enqueue, H2D, D2H and end-to-end."""
    data = _load(path, "--exportTimes")
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise StageError(f"{path}: not a trtexec --exportTimes JSON (expected a list of per-iteration records)")
    out: dict[str, list[float]] = {"latency_ms": [], "gpu_compute_ms": [], "enqueue_ms": [], "h2d_ms": [],
                                   "d2h_ms": [], "end_to_end_ms": []}
    keys = {"latency_ms": ("latencyMs",), "gpu_compute_ms": ("computeMs",), "h2d_ms": ("h2dMs", "inMs"),
            "d2h_ms": ("d2hMs", "outMs"), "end_to_end_ms": ("endToEndMs",)}  # 10.x names first, then 8.x
    for rec in data:
        for ours, names in keys.items():
            found = next((rec[n] for n in names if isinstance(rec.get(n), (int, float))), None)
            if found is not None:
                out[ours].append(float(found))
        if isinstance(rec.get("startEnqMs"), (int, float)) and isinstance(rec.get("endEnqMs"), (int, float)):
            out["enqueue_ms"].append(float(rec["endEnqMs"]) - float(rec["startEnqMs"]))
    return {k: v for k, v in out.items() if v}


def read_profile(path: Path) -> dict[str, Any]:
    """--exportProfile: {"count": iterations, "layers": [{name, total_ms, average_ms, median_ms, percent}]},
    slowest first. `median_ms` is None where trtexec did not write it (before 8.4)."""
    data = _load(path, "--exportProfile")
    if not isinstance(data, list):
        raise StageError(f"{path}: not a trtexec --exportProfile JSON (expected a list)")
    count, layers = None, []
    for rec in data:
        if not isinstance(rec, dict):
            continue
        if "count" in rec and "name" not in rec:
            count = rec["count"]
        elif "name" in rec:
            layers.append({"name": rec["name"], "total_ms": rec.get("timeMs"), "average_ms": rec.get("averageMs"),
                           "median_ms": rec.get("medianMs"), "percent": rec.get("percentage")})
    layers.sort(key=lambda r: -(r["average_ms"] or 0))
    return {"count": count, "layers": layers}


def read_layer_info(path: Path) -> dict[str, Any]:
    """--exportLayerInfo: {"layers": [{name, type}], "bindings": [...], "detailed": bool}."""
    data = _load(path, "--exportLayerInfo")
    if not isinstance(data, dict) or not isinstance(data.get("Layers"), list):
        raise StageError(f"{path}: not a trtexec --exportLayerInfo JSON (expected an object with 'Layers')")
    layers = []
    detailed = any(isinstance(layer, dict) for layer in data["Layers"])
    for layer in data["Layers"]:
        if isinstance(layer, dict):
            layers.append({"name": layer.get("Name"), "type": layer.get("LayerType")})
        else:
            layers.append({"name": str(layer), "type": None})
    return {"layers": layers, "bindings": data.get("Bindings", []), "detailed": detailed}
