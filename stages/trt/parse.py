"""Parsing ONNX with the installed TensorRT flavour: shared by the pre-flight and the engine builds, so both see
the same network and report failures the same way. Call only in a child process (a parser crash is native).
What it reports (`ParseFailure`, `TensorInfo`, `IoTensors`) is in `records.py`."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.stages.trt.records import Backend, IoTensors, ParseFailure, TensorInfo


@dataclass
class Parsed:
    trt: Any
    builder: Any
    network: Any
    parser: Any
    ok: bool
    logger: Any  # the ILogger: must live as long as the builder
    log: list[str] = field(default_factory=list)


def parse(backend: Backend, model: Path, severity: str = "WARNING") -> Parsed:
    """Log lines at `severity` or worse are kept in `Parsed.log`."""
    parsed = open_parser(backend, severity)
    parsed.ok = bool(parsed.parser.parse_from_file(str(model)))
    return parsed


def open_parser(backend: Backend, severity: str = "WARNING") -> Parsed:
    """A builder, an empty network and the ONNX parser on it, nothing parsed yet (`ok` False), for a caller that asks
    the parser something else (the partition's `supports_model_v2`)."""
    trt = importlib.import_module(backend.module)
    lines: list[str] = []
    threshold = getattr(trt.ILogger.Severity, severity)

    class Capture(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, sev, msg) -> None:  # noqa: ANN001 - TensorRT's signature
            if sev <= threshold:
                lines.append(f"[{str(sev).split('.')[-1]}] {msg}")

    logger = Capture()
    builder = trt.Builder(logger)
    flags = 0
    major = int(str(getattr(trt, "__version__", "10")).split(".")[0])
    if backend.flavour == "tensorrt" and major < 10:  # explicit batch is the default (and only) mode from 10 on
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    return Parsed(trt, builder, network, parser, False, logger, lines)


def failures(parser: Any, model: Path) -> list[ParseFailure]:
    """Every node the parser rejected: name, op type, index, domain, error code, reason, where in the parser."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    nodes = {n.name: n for n in graph.node}
    found = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        name = e.node_name() if hasattr(e, "node_name") else ""
        func = e.func() if hasattr(e, "func") else ""
        op = (e.node_operator() if hasattr(e, "node_operator") else "") or _imported_op(func)
        at = e.node()
        node = graph.node[at] if 0 <= at < len(graph.node) and graph.node[at].name == name else nodes.get(name)
        reason = e.desc() if e.desc() not in ("", "false") else "the parser does not support this node"
        found.append(ParseFailure(
            node=name, op_type=op, node_index=at,
            domain=(node.domain if node is not None else "") or "ai.onnx", code=str(e.code()).split(".")[-1],
            reason=plugin_wanted(node) if node is not None and PLUGIN_LOOKUP in func else reason,
            where=f"{e.file()}:{e.line()} {e.func()}" if hasattr(e, "func") else "",
            importer=_supports(parser, op)))
    return found


PLUGIN_LOOKUP = "FallbackPluginImporter"  # the parser's function that looks an op it has no importer for up as a plugin


def plugin_wanted(node: Any) -> str:
    """The plugin the parser looked `node` up as and did not find: its op type, the node's `plugin_version` (else
    "1"), in its `plugin_namespace` (else ""), then in its domain (TensorRT-RTX 1.7's parser, as its log says)."""
    import onnx

    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    version, space = (_text(attrs.get(k, d)) for k, d in (("plugin_version", "1"), ("plugin_namespace", "")))
    spaces = list(dict.fromkeys([space] + ([node.domain] if node.domain not in ("", "ai.onnx") else [])))
    return (f"no TensorRT plugin named '{node.op_type}' version '{version}' is registered (looked up in namespace "
            + " then ".join(f"'{s}'" for s in spaces) + ")")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _imported_op(func: str) -> str:
    """The op whose importer raised (`importScatterElements` -> ScatterElements): some refusals name no node."""
    return func.removeprefix("import") if func.startswith("import") and func[6:7].isupper() else ""


def _supports(parser: Any, op_type: str) -> bool | None:
    try:
        return bool(parser.supports_operator(op_type)) if op_type else None
    except (AttributeError, TypeError):  # a parser without the call
        return None


def tensor_info(t: Any) -> TensorInfo:
    return TensorInfo(name=t.name, shape=list(t.shape), dtype=str(t.dtype).split(".")[-1])


def io_tensors(network: Any) -> IoTensors:
    return IoTensors(inputs=[tensor_info(network.get_input(i)) for i in range(network.num_inputs)],
                     outputs=[tensor_info(network.get_output(i)) for i in range(network.num_outputs)])
