"""ONNX Runtime's quantization pre-processing (shape inference and graph optimization) in a child process
started in the stage's work directory (`trtflow.child`'s convention).

ONNX Runtime's symbolic shape inference saves `sym_shape_infer_temp.onnx` and its weights (a `<uuid>.data` file)
into the current directory when it cannot infer every shape; run in-process that would be the user's directory.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from pydantic import BaseModel

from trtflow import child, phases
from trtflow.errors import TransientStageError
from trtflow.no_torch import torch_hidden
from trtflow.text import first_line

TIMEOUT_S = 1800


class PrepRequest(BaseModel):
    src: str
    dst: str


class PrepResponse(BaseModel):
    warnings: list[str] = []


@phases.timed("quantization pre-processing (ONNX Runtime's, shape inference)")
def pre_process(src: Path, dst: Path, work: Path) -> list[str]:
    """Write the pre-processed model to `dst` (the source as is when every attempt fails); returns warnings."""
    outcome = child.call("trtflow.stages.ort.quant_prep", PrepRequest(src=str(src), dst=str(dst)), PrepResponse,
                         work, TIMEOUT_S, cwd=work, names=("quant_prep.json", "quant_prep.response.json"),
                         what="ONNX Runtime's quantization pre-processing")
    if isinstance(outcome, child.TimedOut):  # no answer: nothing said about the model (as a kill from outside)
        raise TransientStageError(f"ONNX Runtime's quantization pre-processing {outcome.text()}: run again")
    if isinstance(outcome, child.Crashed):  # it crashed on the model: quantized as it is
        shutil.copy(src, dst)
        return [f"quantization pre-processing failed ({outcome.last_line}); quantized the model as is"]
    return outcome.response.warnings


def _main(request: PrepRequest, folder: Path) -> PrepResponse:
    with torch_hidden():  # the symbolic shape inference imports onnxruntime.tools, and through it PyTorch
        from onnxruntime.quantization.shape_inference import quant_pre_process
        from onnxruntime.tools import symbolic_shape_infer  # noqa: F401

    try:
        quant_pre_process(request.src, request.dst)
        return PrepResponse()
    except Exception:  # noqa: BLE001 - ORT's symbolic shape inference asserts on some valid graphs
        pass
    try:
        quant_pre_process(request.src, request.dst, skip_symbolic_shape=True)
        return PrepResponse(warnings=["ONNX Runtime's symbolic shape inference failed on this model; used ONNX's "
                                      "instead"])
    except Exception as exc:  # noqa: BLE001
        shutil.copy(request.src, request.dst)
        return PrepResponse(warnings=[f"quantization pre-processing failed ({first_line(exc)}); quantized the "
                                      f"model as is"])


if __name__ == "__main__":
    raise SystemExit(child.serve(PrepRequest, _main))
