"""TensorRT pre-flight: parse the model with the real TensorRT ONNX parser and list every node it rejects.

The parse runs in a child process (`python -m stages.trt_preflight MODEL`), so a crash inside the native parser
fails the pre-flight with a message instead of taking the pipeline down.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from stages.trt_env import INSTALL_HINT, detect_tensorrt

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
        proc = subprocess.run([sys.executable, "-m", "stages.trt_preflight", str(model)], capture_output=True,
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
    import importlib

    import onnx

    trt_info = detect_tensorrt()
    assert trt_info is not None
    trt = importlib.import_module(trt_info["module"])

    class Capture(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.lines: list[str] = []

        def log(self, severity, msg) -> None:  # noqa: ANN001 - TensorRT's signature
            if severity <= trt.ILogger.Severity.WARNING:
                self.lines.append(f"[{str(severity).split('.')[-1]}] {msg}")

    logger = Capture()
    builder = trt.Builder(logger)
    flags = 0
    major = int(str(getattr(trt, "__version__", "10")).split(".")[0])
    if trt_info["flavour"] == "tensorrt" and major < 10:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(str(model))

    graph = onnx.load(str(model), load_external_data=False).graph
    domains = {n.name: n.domain for n in graph.node}
    failures = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        name = e.node_name() if hasattr(e, "node_name") else ""
        failures.append({
            "node": name,
            "op_type": e.node_operator() if hasattr(e, "node_operator") else "",
            "node_index": e.node(),
            "domain": domains.get(name, "") or "ai.onnx",
            "code": str(e.code()).split(".")[-1],
            "reason": e.desc() if e.desc() not in ("", "false") else "the parser does not support this node",
            "where": f"{e.file()}:{e.line()} {e.func()}" if hasattr(e, "func") else "",
        })
    result: dict[str, Any] = {"ran": True, "runtime": _label(trt_info), "parsed": bool(ok), "failures": failures,
                              "log": logger.lines[-50:]}
    if ok:
        result["layers"] = network.num_layers
        result["inputs"] = [{"name": network.get_input(i).name, "shape": list(network.get_input(i).shape),
                             "dtype": str(network.get_input(i).dtype).split(".")[-1]}
                            for i in range(network.num_inputs)]
        result["outputs"] = [{"name": network.get_output(i).name, "shape": list(network.get_output(i).shape),
                              "dtype": str(network.get_output(i).dtype).split(".")[-1]}
                             for i in range(network.num_outputs)]
    return result


if __name__ == "__main__":
    print(json.dumps(_parse(Path(sys.argv[1]))))
