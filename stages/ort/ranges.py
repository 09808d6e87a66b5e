"""Run a model in ONNX Runtime with every intermediate float tensor exposed and record each tensor's magnitude.

The reference for deciding which nodes FP16 cannot carry (as ModelOpt AutoCast does), and for locating where a
variant's values first drift from the reference.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx

from trtflow.stages.onnx import model_io
from trtflow.stages.ort import memory
from trtflow.stages.ort.runner import parts, session

FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16)


def float_outputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The typed value info of every float tensor a node produces, in graph order."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    return [types[name] for node in model.graph.node for name in node.output
            if name and name in types and types[name].type.tensor_type.elem_type in FLOATS]


def expose_all(model: onnx.ModelProto, out: Path, tensors: list[onnx.ValueInfoProto] | None = None) -> list[str]:
    """Write a copy of `model` whose outputs include every float tensor a node produces (`tensors`, when already
    known); returns their names."""
    tensors = float_outputs(model) if tensors is None else tensors
    have = {o.name for o in model.graph.output}
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.extend(vi for vi in tensors if vi.name not in have)
    model_io.save(exposed, out)
    return [vi.name for vi in tensors]


class Magnitudes:
    """Per float tensor (graph inputs included), over the samples: the largest |x| (`peak`; inf where a value is
    inf or NaN) and the smallest nonzero |x| (`floor`; absent where every value is 0 or non-finite)."""

    def __init__(self) -> None:
        self.peak: dict[str, float] = {}
        self.floor: dict[str, float] = {}

    def add(self, name: str, value: np.ndarray) -> None:
        # in the tensor's own type (|x|, its max and min are exact in it): three passes over it, not seven in float64
        v = np.abs(value)
        peak = float(v.max(initial=0))
        self.peak[name] = max(self.peak.get(name, 0.0), peak if math.isfinite(peak) else math.inf)  # NaN: inf too
        floor = float(np.where(v > 0, v, np.inf).min(initial=np.inf))  # NaN > 0 is false; an inf is no floor
        if math.isfinite(floor):
            self.floor[name] = min(self.floor.get(name, math.inf), floor)


def magnitudes(model: onnx.ModelProto, work: Path, feeds: Iterable[dict[str, np.ndarray]],
               outputs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] | None = None) -> Magnitudes:
    """The magnitudes of every float tensor of `model` over the samples; with `outputs`, each sample's graph
    outputs are appended to it as (feed, output name -> value), from the same pass."""
    path = work / "exposed.onnx"
    names = expose_all(model, path)
    sess = session(path)
    graph_outputs = [o.name for o in model.graph.output]
    outs = [o.name for o in sess.get_outputs() if o.name in set(names) | set(graph_outputs)]
    seen = Magnitudes()
    for feed in feeds:
        for name, value in feed.items():
            if np.issubdtype(value.dtype, np.floating) and value.size:
                seen.add(name, value)
        held, rows = [], []
        for part, values in parts(sess, feed, outs):  # every tensor of the model: the batch in parts that fit
            for name, value in values.items():
                if np.issubdtype(value.dtype, np.floating) and value.size:
                    seen.add(name, value)
            if outputs is not None:
                held.append({name: values[name] for name in graph_outputs})
                rows.append(next(iter(part.values())).shape[0])
            del values
        if outputs is not None:
            outputs.append((feed, memory.join(held, rows, model.graph.name or "the model")))
    path.unlink()
    return seen
