"""How a model variant runs on ONNX Runtime in place of TensorRT, and its accuracy against the FP32 reference: the
one simulation and the one measurement validate and the precision/calibrate pre-flights make, so that their numbers
agree on the same samples (FP16 through the per-node emulation, Q/DQ as fake quantization, graph optimizations off
in both). Every measurement names the graph it ran (`Accuracy.graph`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import onnx

from trtflow import files
from trtflow.precisions import Precision
from trtflow.stages.compare.accuracy import Comparison
from trtflow.stages.compare.records import Accuracy
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.fp16_emulation import emulate, emulated, half_nodes, holds_fp16, keeps_io_types
from trtflow.stages.ort.runner import CANDIDATE, RUNTIME, run, session

SIMULATION = {"fp32": f"{RUNTIME} (FP32 variant)",
              "fp16": f"{RUNTIME} (simulated FP16: storage rounded per node, FP32 accumulation)",
              "int8": f"{RUNTIME} (simulated INT8: Q/DQ as fake quantization, graph optimizations off)",
              "int8+fp16": f"{RUNTIME} (simulated INT8 with an FP16 remainder: Q/DQ as fake quantization, FP16 "
                           f"storage rounded per node, graph optimizations off)"}


def graph_name(path: Path) -> str:
    """A variant's graph as reports name it: its file name and the first 12 hex of its sha256 (the same file
    gives the same name in every stage and store)."""
    return f"{path.name} sha256:{files.sha256(path)[:12]}"


@dataclass(frozen=True)
class Simulation:
    """A variant as ONNX Runtime runs it: the runtime's label, the ONNX model executed (`path` where that is the
    variant's own file, unchanged), and the variant's graph name (`graph_name`)."""
    label: str
    model: onnx.ModelProto
    graph: str
    path: Path | None = None

    def file(self, work: Path, stem: str = "simulation") -> Path:
        """The simulated model's file (written under `work` unless it is the variant's own)."""
        path = self.path
        if path is None:
            path = work / f"{stem}.sim.onnx"
            if not path.exists():
                model_io.save(self.model, path)
        return path

    def session(self, work: Path, stem: str = "simulation") -> Any:
        """An ONNX Runtime session of the simulated model."""
        return session(self.file(work, stem), role=CANDIDATE)


def simulate(variant: Path, reference: onnx.ModelProto, precision: Precision) -> Simulation:
    """The variant at `variant` (made from `reference`) as validate and the pre-flights run it: FP16 through the
    per-node emulation of the reference (where the variant was converted from it), an INT8 variant holding FP16 (its
    unquantized remainder) widened to FP32 and emulated node by node the same way, anything else as it is."""
    model = model_io.load(variant)
    graph = graph_name(variant)
    if precision == "int8" and holds_fp16(model):
        return Simulation(SIMULATION["int8+fp16"], emulated(model), graph)
    if precision != "fp16":
        return Simulation(SIMULATION.get(precision, RUNTIME), model, graph, variant)
    half = half_nodes(model, reference)
    if half is None:
        return Simulation(f"{RUNTIME} (the FP16 variant run directly: it was not converted from the reference, so "
                          f"FP16 rounding between nodes is not emulated)", model, graph, variant)
    return Simulation(SIMULATION["fp16"], emulate(reference, half, keeps_io_types(model)), graph)


def measure(reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], candidate: Any,
            feeds: Iterable[dict[str, np.ndarray]], sim: Simulation, metrics: dict[str, Any] | None,
            floors: dict[str, float] | None, what: str) -> Accuracy:
    """The simulated candidate against the FP32 reference's outputs (`reference`: a feed -> its outputs) over
    `feeds`: validate's comparison (`Comparison`, per output, with the declared task metrics), labelled with the
    simulation's runtime and graph."""
    cmp = Comparison(metrics, floors, what)
    for feed in feeds:
        cmp.add(reference(feed), run(candidate, feed), feed)
    acc = cmp.result(sim.label)
    acc.graph = sim.graph
    return acc
