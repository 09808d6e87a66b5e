"""TensorRT pre-flight: parse the model with the real TensorRT ONNX parser and list every node it rejects.

The parse runs in a child process (`python -m trtflow.stages.trt.preflight MODEL`), so a crash inside the native parser
fails the pre-flight with a message instead of taking the pipeline down.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from trtflow.stages.trt.env import INSTALL_HINT, detect_tensorrt

TIMEOUT_S = 900

# op types the TensorRT ONNX parser has no importer for (TensorRT 10/11, TensorRT-RTX 1.x)
NO_IMPORTER = {"Unique", "StringNormalizer", "TfIdfVectorizer", "Multinomial", "Bernoulli", "Compress",
               "SequenceInsert", "SequenceErase", "ConcatFromSequence", "SplitToSequence", "Optional",
               "OptionalGetElement", "OptionalHasElement", "Col2Im", "DFT", "STFT", "MelWeightMatrix"}


def hint_for(failure: dict[str, Any]) -> str:
    op, desc, domain = failure.get("op_type") or "", failure.get("reason") or "", failure.get("domain") or ""
    if "Plugin not found" in desc or (domain and domain not in ("ai.onnx", "")):
        return (f"'{op}' is a custom op: register a TensorRT plugin named '{op}' (IPluginV3) "
                "or replace it in the exporter")
    if "DequantizeLinear" in op and "INT32" in desc.upper():
        return "a quantized bias: quantize with QuantizeBias=False (TensorRT rejects INT32 DequantizeLinear)"
    if "opset" in desc.lower() or "version" in desc.lower():
        return "the opset may be newer than this parser supports: set prepare.target_opset lower"
    if op in NO_IMPORTER or failure.get("code") == "UNSUPPORTED_NODE":
        return (f"TensorRT has no '{op}' layer: move it out of the model (pre/post-processing on the host) "
                "or provide a plugin")
    return "see the TensorRT ONNX operator support matrix for this op's supported types and attributes"


def run_preflight(model: Path, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """Parse in a child process. Always returns a report; `ran` says whether a parser was actually used."""
    trt = detect_tensorrt()
    if trt is None:
        return {"ran": False, "reason": f"no TensorRT flavour is installed ({INSTALL_HINT})", "failures": []}
    try:
        proc = subprocess.run([sys.executable, "-m", "trtflow.stages.trt.preflight", str(model)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ran": False, "reason": f"the TensorRT parser did not finish within {timeout:g} s",
                "failures": [], "runtime": _label(trt)}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ran": False, "reason": f"the TensorRT parser process failed (exit code {proc.returncode}): {tail}",
                "failures": [], "runtime": _label(trt)}
    report = json.loads(lines[-1])
    for f in report["failures"]:
        f["hint"] = hint_for(f)
    return report


def _label(trt: dict[str, str]) -> str:
    return f"{trt['flavour']} {trt['version']} parser"


def _parse(model: Path) -> dict[str, Any]:
    from trtflow.stages.trt import parse as trt_parse

    trt_info = detect_tensorrt()
    assert trt_info is not None
    parsed = trt_parse.parse(trt_info, model)
    result: dict[str, Any] = {"ran": True, "runtime": _label(trt_info), "parsed": parsed.ok,
                              "failures": trt_parse.failures(parsed.parser, model), "log": parsed.log[-50:]}
    if parsed.ok:
        result["layers"] = parsed.network.num_layers
        result.update(trt_parse.io_tensors(parsed.network))
    return result


if __name__ == "__main__":
    print(json.dumps(_parse(Path(sys.argv[1]))))
