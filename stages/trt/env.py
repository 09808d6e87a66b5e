"""Which TensorRT flavour is installed, found without importing it (importing TensorRT is slow and heavy)."""
from __future__ import annotations

import functools
import importlib.metadata as md
import importlib.util
import shutil
import subprocess

# (module, flavour, distributions that may carry its version); full TensorRT first: it is what users deploy
FLAVOURS = (
    ("tensorrt", "tensorrt", ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11",
                              "tensorrt_cu13_bindings", "tensorrt_cu12_bindings")),
    ("tensorrt_rtx", "tensorrt-rtx", ("tensorrt-rtx-cu13", "tensorrt-rtx-cu12", "tensorrt_rtx_cu13_bindings",
                                      "tensorrt_rtx_cu12_bindings", "tensorrt-rtx")),
)

INSTALL_HINT = "pip install tensorrt-rtx-cu13 (parses and builds without a GPU), or install TensorRT"


def detect_tensorrt(only: str | None = None) -> dict[str, str] | None:
    """The preferred installed flavour, or with `only` ("tensorrt" / "tensorrt_rtx") that module's, if installed."""
    for module, flavour, dists in FLAVOURS:
        if only is not None and module != only:
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            continue
        version = "unknown"
        for dist in dists:
            try:
                version = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
        return {"flavour": flavour, "module": module, "version": version}
    return None


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
