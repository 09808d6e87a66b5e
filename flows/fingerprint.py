"""The environment facts that enter the keys of environment-dependent stages."""
from __future__ import annotations

import functools
import shutil
import subprocess
from typing import Any


@functools.lru_cache(maxsize=1)
def gpus() -> list[dict[str, str]]:
    """GPUs as nvidia-smi reports them; empty where there is none (as on CI)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            found.append({"name": parts[0], "compute_capability": parts[1], "driver": parts[2]})
    return found


def fingerprint(facets: tuple[str, ...]) -> dict[str, Any] | None:
    if not facets:
        return None
    env: dict[str, Any] = {}
    if "tensorrt" in facets:
        from stages.trt_env import detect_tensorrt

        trt = detect_tensorrt()
        env["tensorrt"] = {"flavour": trt["flavour"], "version": trt["version"]} if trt else None
    if "gpu" in facets:
        env["gpu"] = gpus() or None
    return env


def describe(env: dict[str, Any] | None) -> str:
    if not env:
        return "-"
    parts = []
    if "tensorrt" in env:
        trt = env["tensorrt"]
        parts.append(f"{trt['flavour']} {trt['version']}" if trt else "no TensorRT")
    if "gpu" in env:
        g = env["gpu"]
        parts.append(", ".join(f"{x['name']} (sm{x['compute_capability']}, driver {x['driver']})" for x in g)
                     if g else "no GPU")
    return "; ".join(parts)
