"""Building TensorRT engines from ONNX with the installed flavour (TensorRT 10/11 or TensorRT-RTX).

Kept small on purpose: the build stage (a later issue) grows around it. Strongly typed: precision comes from
the ONNX (an FP16 or Q/DQ variant), which is what TensorRT 11 and TensorRT-RTX support.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from stages.base import StageError
from stages.trt_env import INSTALL_HINT, detect_tensorrt

Shape = list[int]
Profile = dict[str, tuple[Shape, Shape, Shape]]  # input -> (min, opt, max)


def trt_module():
    info = detect_tensorrt()
    if info is None:
        raise StageError(f"no TensorRT flavour is installed: {INSTALL_HINT}")
    return importlib.import_module(info["module"]), info


def static_profile(model: Path) -> Profile:
    """A profile pinning every dynamic dimension to 1, for building a model whose shapes do not matter."""
    import onnx

    from stages.onnx_inspect import graph_inputs

    prof: Profile = {}
    for vi in graph_inputs(onnx.load(str(model), load_external_data=False)):
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
                for d in vi.type.tensor_type.shape.dim]
        prof[vi.name] = (dims, dims, dims)
    return prof


def build_engine(model: Path, profiles: list[Profile]) -> dict[str, Any]:
    """Parse and build; returns the serialized engine and what the builder reported."""
    trt, info = trt_module()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model)):
        errors = [f"{parser.get_error(i).node_name()} ({parser.get_error(i).node_operator()}): "
                  f"{parser.get_error(i).desc()}" for i in range(parser.num_errors)]
        raise StageError(f"TensorRT cannot parse {model.name}: {'; '.join(errors[:3])}")
    config = builder.create_builder_config()
    for prof in profiles:
        p = builder.create_optimization_profile()
        for name, (lo, opt, hi) in prof.items():
            p.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(p)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise StageError(f"TensorRT could not build an engine from {model.name} (see the builder log)")
    return {"engine": bytes(engine), "layers": network.num_layers,
            "runtime": f"{info['flavour']} {info['version']}"}
