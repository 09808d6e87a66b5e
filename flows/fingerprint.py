"""The environment facts that enter the keys of environment-dependent stages.

Facet "tensorrt": the flavour and the version the module itself reports, the CUDA runtime version, the OS and the CPU
architecture. Facet "gpu": each GPU (name, compute capability, memory), the driver and the CUDA version it supports.
Nested dicts, so `keys.diff` names each field that changed (`tensorrt.version "1.7.1" -> "1.8.0"`,
`gpu.0.driver ...`).
"""
from __future__ import annotations

from typing import Any

from trtflow.stages.trt.env import find_tensorrt, nvidia_system, platform_facts, probe

ALL = ("tensorrt", "gpu")


def fingerprint(facets: tuple[str, ...]) -> dict[str, Any] | None:
    if not facets:
        return None
    env: dict[str, Any] = {}
    if "tensorrt" in facets:
        trt = find_tensorrt()
        found = probe(trt.module) if trt else {"version": None, "cuda_runtime": None}
        env["tensorrt"] = {"flavour": trt.flavour, "version": found["version"] or trt.version} if trt else None
        env["cuda"] = {"runtime": found["cuda_runtime"]}
        env["platform"] = platform_facts()
    if "gpu" in facets:
        system = nvidia_system()
        env["gpu"] = {str(i): {k: g[k] for k in ("name", "compute_capability", "memory_mb")}
                      for i, g in enumerate(system["gpus"])} or None
        env.setdefault("cuda", {})["driver"] = system["cuda_driver"]
        env["driver"] = system["driver"]
    return env


def describe(env: dict[str, Any] | None) -> str:
    if not env:
        return "-"
    parts = []
    if "tensorrt" in env:
        trt = env["tensorrt"]
        parts.append(f"{trt['flavour']} {trt['version']}" if trt else "no TensorRT")
    cuda = env.get("cuda") or {}
    if cuda.get("runtime") or cuda.get("driver"):
        parts.append("CUDA " + ", ".join(f"{k} {v}" for k, v in cuda.items() if v))
    if "gpu" in env:
        g = env["gpu"]
        names = ", ".join(f"{x['name']} (sm{x['compute_capability']})" for x in (g or {}).values())
        parts.append(f"{names}, driver {env.get('driver')}" if g else "no GPU")
    if env.get("platform"):
        parts.append(f"{env['platform']['os']} {env['platform']['arch']}")
    return "; ".join(parts)
