"""Which code does the work of each stage kind, its version, and which environment facts its output depends on."""
from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from stages.base import StageError

IMPLEMENTED = {"prepare": "stages.prepare", "parity": "stages.parity", "precision": "stages.precision",
               "calibrate": "stages.calibrate", "build": "stages.build"}
PLANNED = ("validate", "benchmark")

# The environment facts that enter a kind's cache key. The TensorRT parser's verdict depends on its version;
# engines and measurements depend on the GPU and driver too.
ENV_FACETS: dict[str, tuple[str, ...]] = {
    "prepare": ("tensorrt",),
    "build": ("tensorrt", "gpu"),
    "validate": ("tensorrt", "gpu"),
    "benchmark": ("tensorrt", "gpu"),
}


@dataclass(frozen=True)
class StageImpl:
    run: Callable[..., Any]
    version: str
    env_facets: tuple[str, ...]


def resolve(spec: Any) -> StageImpl:
    kind = spec.kind
    if kind in IMPLEMENTED:
        module = importlib.import_module(IMPLEMENTED[kind])
        facets = ENV_FACETS.get(kind, ())
        if kind == "prepare" and spec.preflight == "off":
            facets = ()
        return StageImpl(module.run, str(module.VERSION), facets)
    if kind in PLANNED:
        raise StageError(f"stage kind '{kind}' is declared but not implemented in this version of trtflow; "
                         f"remove the stage or run the stages before it with --stage")
    return _custom(spec)


def _custom(spec: Any) -> StageImpl:
    func = import_callable(spec.kind, f"stage kind '{spec.kind}'")
    facets = ("tensorrt", "gpu") if spec.env_dependent else ()
    # editing the function re-runs the stage, like DVC's dependency on the code
    return StageImpl(func, f"{spec.version}+{source_digest(spec.kind)}", facets)


def import_callable(ref: str, what: str) -> Callable[..., Any]:
    module_name, _, func_name = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the user's module failing at import
        raise StageError(f"cannot import '{module_name}' for {what}: {type(exc).__name__}: {exc}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise StageError(f"'{module_name}' has no function '{func_name}' ({what})")
    return func


def source_digest(ref: str) -> str:
    func = import_callable(ref, ref)
    try:
        return hashlib.sha256(inspect.getsource(func).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return "unknown"
