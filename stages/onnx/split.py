"""Cut an ONNX model into a chain of pieces, each run by one runtime (TensorRT or ONNX Runtime), for a model whose
middle TensorRT cannot take (issue #68, partial offload): the pieces, run in order, compute what the model does.

A `Segment` is a run of nodes given to one runtime; `segments` orders a labelled model's nodes so that as few runs
as possible result; `split` writes one model per segment and the `Chain` that says how they connect (each piece's
file, runtime, inputs and outputs with their dtypes and shapes: what a runner executes in order and a release turns
into a Triton ensemble: `Chain`, `Piece`, `TensorSpec` and their reader `read_chain` are in `records.py`);
`run_chain` runs a chain on ONNX Runtime.

A piece is built from its segment's nodes directly rather than by `onnx.utils.Extractor`'s search back from the
outputs: that search does not see what an If/Loop body reads from the enclosing graph, so it would drop those
inputs and initializers.
"""
from __future__ import annotations

import heapq
from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from pydantic import BaseModel

from trtflow.errors import StageError
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.graph import constants_to_initializers, graph_inputs, name_nodes, subgraphs
from trtflow.stages.onnx.records import Chain, Piece, Runtime, TensorSpec

RUNTIMES: tuple[Runtime, Runtime] = ("tensorrt", "onnxruntime")
Feeds = dict[str, np.ndarray]


class Segment(BaseModel):
    """Nodes given to one runtime: indices into the model's `graph.node`, in the order they run."""
    runtime: Runtime
    nodes: list[int]


def prepared(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose Constant nodes are initializers (copied into every piece that reads them, instead of being
    handed from piece to piece) and whose nodes all have names (how pieces, trials and failures name them)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    constants_to_initializers(copy)
    name_nodes(copy)
    return copy


# --- reading the graph ---------------------------------------------------------------------------------------------

def reads(node: onnx.NodeProto) -> list[str]:
    """The tensors a node reads from its graph, in order: its inputs, and what its If/Loop/Scan bodies read from
    the enclosing scope (names they neither define nor take as inputs)."""
    found = [t for t in node.input if t]
    for sub in subgraphs(node):
        found += _outer_reads(sub)
    return list(dict.fromkeys(found))


def _outer_reads(graph: onnx.GraphProto) -> list[str]:
    local = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    found = []
    for node in graph.node:
        found += [t for t in reads(node) if t not in local]
        local.update(o for o in node.output if o)
    found += [o.name for o in graph.output if o.name not in local]  # an output passed straight from outside
    return found


def _producers(model: onnx.ModelProto) -> dict[str, int]:
    return {t: i for i, n in enumerate(model.graph.node) for t in n.output if t}


def _dependencies(model: onnx.ModelProto) -> list[set[int]]:
    """For each node, the nodes whose outputs it reads."""
    producer = _producers(model)
    return [{producer[t] for t in reads(n) if t in producer} for n in model.graph.node]


# --- segments ------------------------------------------------------------------------------------------------------

def segments(model: onnx.ModelProto, runtimes: list[Runtime]) -> list[Segment]:
    """The nodes (`runtimes[i]`: node i's) in maximal runs of one runtime, in a topological order chosen to make
    few runs: a greedy topological sort that keeps taking ready nodes of the current runtime (lowest index first)
    and switches runtime only when none is ready; started from either runtime, the fewer runs kept. Not always
    the fewest possible (that needs a search), but it never splits a run that a node of the other runtime does not
    force apart."""
    deps = _dependencies(model)
    tries = [_greedy(deps, runtimes, first) for first in RUNTIMES if first in runtimes]
    return min(tries, key=len) if tries else []


def _greedy(deps: list[set[int]], runtimes: list[Runtime], current: Runtime) -> list[Segment]:
    waiting = [len(d) for d in deps]
    users: list[list[int]] = [[] for _ in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    ready: dict[Runtime, list[int]] = {r: [] for r in RUNTIMES}
    for i, count in enumerate(waiting):
        if count == 0:
            heapq.heappush(ready[runtimes[i]], i)
    runs: list[Segment] = []
    while any(ready.values()):
        if not ready[current]:
            current = "onnxruntime" if current == "tensorrt" else "tensorrt"
        run = Segment(runtime=current, nodes=[])
        while ready[current]:
            i = heapq.heappop(ready[current])
            run.nodes.append(i)
            for u in users[i]:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready[runtimes[u]], u)
        runs.append(run)
    if sum(len(r.nodes) for r in runs) != len(deps):
        raise StageError("the model's graph has a cycle: it cannot be cut into pieces")
    return runs


# --- cutting -------------------------------------------------------------------------------------------------------

def boundaries(model: onnx.ModelProto, cut: list[Segment]) -> list[tuple[list[str], list[str]]]:
    """Each segment's (inputs, outputs): it reads the model's inputs and what earlier segments produced; it hands
    on what a later segment reads or the model outputs."""
    inits = {i.name for i in model.graph.initializer}
    finals = {o.name for o in model.graph.output}
    nodes = model.graph.node
    later_reads: list[set[str]] = [set() for _ in cut]
    seen: set[str] = set()
    for k in range(len(cut) - 1, -1, -1):  # what segments after k read
        later_reads[k] = set(seen)
        seen.update(t for i in cut[k].nodes for t in reads(nodes[i]))
    found = []
    for k, seg in enumerate(cut):
        made = [t for i in seg.nodes for t in nodes[i].output if t]
        mine = set(made)
        inputs = [t for i in seg.nodes for t in reads(nodes[i]) if t not in mine and t not in inits]
        outputs = [t for t in made if t in finals or t in later_reads[k]]
        found.append((list(dict.fromkeys(inputs)), outputs))
    return found


def _typed(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Every tensor's type as ONNX's shape inference gives it (the model's own declarations win)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except onnx.shape_inference.InferenceError as exc:
        raise StageError(f"ONNX shape inference fails on the model, so its pieces cannot be typed: {exc}") from None
    infos = {vi.name: vi for vi in inferred.graph.value_info}
    infos.update({vi.name: vi for vi in list(model.graph.input) + list(model.graph.output)})
    return infos


def spec(vi: onnx.ValueInfoProto) -> TensorSpec:
    t = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else _symbol(d.dim_param) for d in t.shape.dim]
    return TensorSpec(name=vi.name, dtype=onnx.TensorProto.DataType.Name(t.elem_type),
                      shape=dims if t.HasField("shape") else None)


def _symbol(name: str) -> str | None:
    """A dimension's name; None for the `unk__N` ONNX's shape inference makes up where the data decides a size."""
    return None if not name or name.startswith("unk__") else name


def _value_info(types: dict[str, onnx.ValueInfoProto], name: str) -> onnx.ValueInfoProto:
    vi = types.get(name)
    if vi is None or not vi.type.tensor_type.elem_type:
        raise StageError(f"tensor '{name}' crosses a cut but ONNX's shape inference gives it no type: the model "
                         f"cannot be cut there")
    return vi


def piece_model(model: onnx.ModelProto, seg: Segment, inputs: list[str], outputs: list[str],
                types: dict[str, onnx.ValueInfoProto]) -> onnx.ModelProto:
    """The segment's nodes as a model of their own, with a copy of every initializer they read."""
    nodes = [model.graph.node[i] for i in seg.nodes]
    read = {t for n in nodes for t in reads(n)}
    inits = [i for i in model.graph.initializer if i.name in read]
    inner = [t for n in nodes for t in n.output if t and t not in outputs and t in types]
    graph = helper.make_graph(nodes, f"{model.graph.name or 'model'}_{seg.runtime}",
                              [_value_info(types, t) for t in inputs], [_value_info(types, t) for t in outputs],
                              inits, value_info=[types[t] for t in inner])
    piece = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version,
                              functions=list(model.functions))
    piece.producer_name = "trtflow split"
    return piece


def split(model: onnx.ModelProto, cut: list[Segment], folder: Path) -> Chain:
    """Write one model per segment into `folder` (`00_tensorrt.onnx`, `01_onnxruntime.onnx`, ...) and the chain
    (`chain.json`). `model` is the one `cut` indexes (give both `prepared`'s copy). A segment that hands nothing
    on (its nodes feed no output) is left out."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    types = _typed(model)
    pieces = []
    for seg, (inputs, outputs) in zip(cut, boundaries(model, cut)):
        if not outputs:
            continue
        piece = piece_model(model, seg, inputs, outputs, types)
        name = f"{len(pieces):02d}_{seg.runtime}.onnx"
        model_io.save(piece, folder / name)
        pieces.append(Piece(runtime=seg.runtime, file=name, nodes=[n.name for n in piece.graph.node],
                            inputs=[spec(types[t]) for t in inputs], outputs=[spec(types[t]) for t in outputs]))
    chain = Chain(folder=str(folder), inputs=[spec(vi) for vi in graph_inputs(model)],
                  outputs=[spec(vi) for vi in model.graph.output], pieces=pieces)
    _check_outputs(model, chain)
    chain.write()
    return chain


def _check_outputs(model: onnx.ModelProto, chain: Chain) -> None:
    """Every model output must come from a piece or be a model input (an output that is a constant has no piece
    to come from)."""
    have = {t.name for t in chain.inputs} | {t.name for p in chain.pieces for t in p.outputs}
    missing = [o.name for o in model.graph.output if o.name not in have]
    if missing:
        raise StageError(f"the model's outputs {missing} are constants: no piece of a chain computes them")


# --- running -------------------------------------------------------------------------------------------------------

class ChainSession:
    """A chain on ONNX Runtime (every piece, the TensorRT ones included, on its CPU): one session per piece."""

    def __init__(self, chain: Chain, spin: bool = False) -> None:
        from trtflow.stages.ort.runner import session

        self.chain = chain
        self.sessions = [session(chain.path(p), spin) for p in chain.pieces]

    def values(self, feeds: Feeds) -> Feeds:
        """The model's inputs and every tensor handed between pieces or output. Tensors cross as ONNX Runtime's own
        values: a type NumPy has no name for (FP8, handed back as uint8) keeps its ONNX type."""
        import onnxruntime as ort

        env = {name: ort.OrtValue.ortvalue_from_numpy(array) for name, array in feeds.items()}
        for piece, sess in zip(self.chain.pieces, self.sessions):
            names = [t.name for t in piece.outputs]
            env.update(zip(names, sess.run_with_ort_values(names, {t.name: env[t.name] for t in piece.inputs})))
        return {name: value.numpy() for name, value in env.items()}

    def run(self, feeds: Feeds) -> Feeds:
        """The model's outputs, by name."""
        env = self.values(feeds)
        return {t.name: env[t.name] for t in self.chain.outputs}


def run_chain(chain: Chain, feeds: Feeds) -> Feeds:
    """The model's outputs from running its pieces in order on ONNX Runtime."""
    return ChainSession(chain).run(feeds)
