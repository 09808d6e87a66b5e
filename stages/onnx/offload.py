"""Which nodes of a model ONNX Runtime runs instead of TensorRT (issue #68, partial offload), carried inside the model
so that every stage after prepare reads it from the model it is given: precision keeps those nodes in FP32,
calibrate leaves them unquantized, build cuts the model into a chain and builds its TensorRT pieces, validate and
benchmark run the chain, release serves it as a Triton ensemble.

The mark is one entry of the model's `metadata_props` (as the Q/DQ recipe is): the names of the offloaded nodes.
Nodes a later stage adds (an FP16 Cast, a Q/DQ pair) are not in it, so they run on TensorRT; a converter keeps node
names, so the offloaded nodes keep theirs. The mark is part of the model's bytes, hence of every key downstream.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from pydantic import BaseModel

from trtflow.errors import StageError
from trtflow.stages.onnx.records import Chain, Runtime, TensorSpec
from trtflow.stages.onnx.split import ChainSession, Feeds, prepared, segments, split
from trtflow.stages.trt.records import Profile

KEY = "trtflow.offload"
POINTS = ("min", "opt", "max")


class Offload(BaseModel):
    """The nodes ONNX Runtime runs, by name."""
    runtime: str = "onnxruntime"
    nodes: list[str]


def read(model: onnx.ModelProto) -> Offload | None:
    """The model's mark; None for a model TensorRT runs whole."""
    value = next((p.value for p in model.metadata_props if p.key == KEY), None)
    return None if value is None else Offload.model_validate_json(value)


def read_file(path: Path) -> Offload | None:
    return read(onnx.load(str(path), load_external_data=False))


def mark(model: onnx.ModelProto, offload: Offload) -> None:
    """Record `offload` in `model` (replacing an earlier mark)."""
    kept = [p for p in model.metadata_props if p.key != KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key, entry.value = KEY, json.dumps(offload.model_dump(), separators=(",", ":"))


WHY = "runs on ONNX Runtime (prepare: offload)"


def kept_float(model: onnx.ModelProto) -> dict[str, str]:
    """The marked nodes (node -> why): a stage that lowers precision leaves them in FP32, as ONNX Runtime runs
    them."""
    found = read(model)
    return {} if found is None else dict.fromkeys(found.nodes, WHY)


def runtimes(model: onnx.ModelProto, offload: Offload) -> list[Runtime]:
    """Each node's runtime: ONNX Runtime for the marked ones, TensorRT for the rest."""
    moved = set(offload.nodes)
    return ["onnxruntime" if n.name in moved else "tensorrt" for n in model.graph.node]


def cut(path: Path, folder: Path) -> Chain | None:
    """The model at `path` cut by its mark into a chain written into `folder`; None when it has no mark."""
    model = onnx.load(str(path))
    found = read(model)
    if found is None:
        return None
    model = prepared(model)
    missing = sorted(set(found.nodes) - {n.name for n in model.graph.node})
    if missing:
        raise StageError(f"{path.name}: the nodes marked for ONNX Runtime {missing[:3]} are not in the model (a "
                         f"stage after prepare renamed them): run prepare again")
    return split(model, segments(model, runtimes(model, found)), folder)


# --- the TensorRT pieces' optimization profiles --------------------------------------------------------------------

def _filled(spec: TensorSpec, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    """An input of `shape` whose values only shape the pieces' tensors: normal floats, zeros for integers (valid
    indices) and False."""
    if spec.numpy.kind == "f":
        return rng.standard_normal(shape).astype(spec.numpy)
    return np.zeros(shape, spec.numpy)


def _bound(chain: Chain, tensor: str, values: Feeds) -> int:
    """The most a size only the data decides can reach: the element count of the largest tensor the piece that
    makes it reads (a NonZero's, a Unique's or a Compress's count of elements never exceeds its input's)."""
    maker = next(p for p in chain.pieces if any(t.name == tensor for t in p.outputs))
    return max((int(values[t.name].size) for t in maker.inputs), default=1)


def piece_profiles(chain: Chain, profile: Profile, seed: int = 0) -> dict[int, Profile]:
    """Each TensorRT piece's profile for one of the model's: the chain run on ONNX Runtime at the profile's min, opt
    and max shapes gives its inputs' sizes; a size only the data decides runs from 0 up to `_bound` at max."""
    rng = np.random.default_rng(seed)
    specs = {t.name: t for t in chain.inputs}
    sessions = ChainSession(chain)
    seen = [sessions.values({n: _filled(specs[n], s, rng) for n, s in profile.at(point).items()})
            for point in POINTS]
    largest = seen[-1]
    found = {}
    for index, piece in enumerate(chain.pieces):
        if piece.runtime != "tensorrt":
            continue
        shapes = {}
        for t in piece.inputs:
            lo, opt, hi = ([int(d) for d in values[t.name].shape] for values in seen)
            for axis, fixed in enumerate(t.shape or []):
                if fixed is None:  # decided by the data
                    lo[axis] = 0
                    hi[axis] = max(hi[axis], opt[axis], _bound(chain, t.name, largest))
            shapes[t.name] = (lo, [min(max(o, a), b) for a, o, b in zip(lo, opt, hi)], hi)
        found[index] = Profile(name=profile.name, shapes=shapes)
    return found
