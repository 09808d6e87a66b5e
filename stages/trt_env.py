"""Which TensorRT flavour is installed, found without importing it (importing TensorRT is slow and heavy)."""
from __future__ import annotations

import importlib.metadata as md
import importlib.util

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
