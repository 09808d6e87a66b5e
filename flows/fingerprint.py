"""The environment facts that enter the keys of environment-dependent stages.

Facet "tensorrt": the flavour and the version the module itself reports, the CUDA runtime version, the OS and the CPU
architecture. Facet "gpu": each GPU (name, compute capability, memory), the driver and the CUDA version it supports.
Nested, so `keys.diff` names each field that changed (`tensorrt.version "1.7.1" -> "1.8.0"`, `gpu.0.driver ...`).
"""
from __future__ import annotations

from trtflow.pipelines.row import FACETS, Facet
from trtflow.records import Recorded
from trtflow.stages.trt.env import (
    Gpu,
    Platform,
    ProbeAnswer,
    TensorRT,
    find_tensorrt,
    nvidia_system,
    platform_facts,
    probe,
)

ALL = FACETS


class Cuda(Recorded):
    """The CUDA runtime TensorRT loads (facet "tensorrt") and the CUDA version the driver supports (facet "gpu")."""
    runtime: str | None = None
    driver: str | None = None


class Environment(Recorded):
    """This machine's facts for the facets asked for, in the cache keys of the stages that depend on them, in their
    manifests and in check-env's record. A facet not asked for leaves its fields out of the JSON; one asked for and
    not found here is null (`tensorrt`: no TensorRT, `gpu`: no GPU). The JSON is part of every such key: a field
    added here re-keys every stage that depends on the environment."""
    tensorrt: TensorRT | None = None
    cuda: Cuda | None = None
    platform: Platform | None = None
    # by device index; a list in records of trtflow before the CUDA versions were in the fingerprint
    gpu: dict[str, Gpu] | list[Gpu] | None = None
    driver: str | None = None

    @property
    def gpus(self) -> dict[str, Gpu]:
        """The GPUs by device index; empty where there is none (or the facet was not asked for)."""
        if isinstance(self.gpu, list):
            return {str(i): g for i, g in enumerate(self.gpu)}
        return self.gpu or {}

    def to_json(self) -> dict:
        return self.model_dump(mode="json")


def fingerprint(facets: tuple[Facet, ...]) -> Environment | None:
    if not facets:
        return None
    env = Environment()
    if "tensorrt" in facets:
        trt = find_tensorrt()
        found = probe(trt.module) if trt else ProbeAnswer()
        env.tensorrt = TensorRT(flavour=trt.flavour, version=found.version or trt.version) if trt else None
        env.cuda = Cuda(runtime=found.cuda_runtime)
        env.platform = platform_facts()
    if "gpu" in facets:
        system = nvidia_system()
        env.gpu = {str(i): Gpu(name=g.name, compute_capability=g.compute_capability, memory_mb=g.memory_mb)
                   for i, g in enumerate(system.gpus)} or None
        env.cuda = env.cuda or Cuda()
        env.cuda.driver = system.cuda_driver
        env.driver = system.driver
    return env


def describe(env: Environment | None) -> str:
    if env is None or not env.to_json():
        return "-"
    parts = []
    asked = env.model_fields_set  # a facet asked for, even where it found nothing
    if "tensorrt" in asked:
        trt = env.tensorrt
        parts.append(f"{trt.flavour} {trt.version}" if trt else "no TensorRT")
    cuda = env.cuda
    if cuda and (cuda.runtime or cuda.driver):
        parts.append("CUDA " + ", ".join(f"{what} {v}" for what, v in (("runtime", cuda.runtime),
                                                                        ("driver", cuda.driver)) if v))
    if "gpu" in asked:
        names = ", ".join(f"{g.name} (sm{g.compute_capability})" for g in env.gpus.values())
        parts.append(f"{names}, driver {env.driver}" if env.gpu else "no GPU")
    if env.platform:
        parts.append(f"{env.platform.os} {env.platform.arch}")
    return "; ".join(parts)
