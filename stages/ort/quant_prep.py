"""ONNX Runtime's quantization pre-processing (shape inference and graph optimization) in a child process
started in the stage's work directory: `python -m trtflow.stages.ort.quant_prep SRC DST`.

ONNX Runtime's symbolic shape inference saves `sym_shape_infer_temp.onnx` and its weights (a `<uuid>.data` file)
into the current directory when it cannot infer every shape; run in-process that would be the user's directory.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from trtflow.child import run_module
from trtflow.text import first_line

TIMEOUT_S = 1800


def pre_process(src: Path, dst: Path, work: Path) -> list[str]:
    """Write the pre-processed model to `dst` (the source as is when every attempt fails); returns warnings."""
    result, proc = run_module("trtflow.stages.ort.quant_prep", [str(src), str(dst)], TIMEOUT_S, cwd=work)
    if proc.returncode != 0 or result is None:
        import shutil

        shutil.copy(src, dst)
        tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return [f"quantization pre-processing failed ({tail}); quantized the model as is"]
    return result["warnings"]


def _main(src: str, dst: str) -> dict[str, list[str]]:
    import shutil

    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(src, dst)
        return {"warnings": []}
    except Exception:  # noqa: BLE001 - ORT's symbolic shape inference asserts on some valid graphs
        pass
    try:
        quant_pre_process(src, dst, skip_symbolic_shape=True)
        return {"warnings": ["ONNX Runtime's symbolic shape inference failed on this model; used ONNX's instead"]}
    except Exception as exc:  # noqa: BLE001
        shutil.copy(src, dst)
        return {"warnings": [f"quantization pre-processing failed ({first_line(exc)}); quantized the model as is"]}


if __name__ == "__main__":
    print(json.dumps(_main(sys.argv[1], sys.argv[2])))
