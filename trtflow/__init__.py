"""trtflow: declarative ONNX -> TensorRT pipelines, run as Prefect flows, with a content-addressed artifact store.

The public API for your own stages (`kind: package.module:function` in the pipeline file) is what this module
exports; everything under `trtflow.*` may change between versions.

    from trtflow import Artifact, Inputs, StageError, StageFailed, StageResult

    def run(params, inputs: Inputs, out_dir: Path) -> StageResult: ...
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Artifact", "Inputs", "StageError", "StageFailed", "StageResult", "__version__"]


def __getattr__(name: str) -> Any:
    # imported when first asked for: the command line's no-op answer (flows/noop.py) must not pay for pydantic
    if name in ("Artifact", "Inputs", "StageResult"):
        from trtflow import artifact

        return getattr(artifact, name)
    if name in ("StageError", "StageFailed"):
        from trtflow import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'trtflow' has no attribute {name!r}")
