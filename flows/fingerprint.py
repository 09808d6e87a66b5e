"""The environment facts that enter the keys of environment-dependent stages."""
from __future__ import annotations

from typing import Any

from trtflow.stages.trt.env import gpus


def fingerprint(facets: tuple[str, ...]) -> dict[str, Any] | None:
    if not facets:
        return None
    env: dict[str, Any] = {}
    if "tensorrt" in facets:
        from trtflow.stages.trt.env import detect_tensorrt

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
