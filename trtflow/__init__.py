"""trtflow: declarative ONNX -> TensorRT pipelines, run as Prefect flows, with a content-addressed artifact store.

The public API for your own stages (`kind: package.module:function` in the pipeline file) is what this module
exports; everything under `trtflow.*` may change between versions.

    from trtflow import Artifact, Inputs, StageError, StageFailed, StageResult

    def run(params, inputs: Inputs, out_dir: Path) -> StageResult: ...
"""
from __future__ import annotations

from trtflow.artifact import Artifact, Inputs, StageResult
from trtflow.errors import StageError, StageFailed

__version__ = "0.1.0"
__all__ = ["Artifact", "Inputs", "StageError", "StageFailed", "StageResult", "__version__"]
