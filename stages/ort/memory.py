"""What running a model on ONNX Runtime costs in memory, predicted from its graph before it runs, and the budget every
run is held to: a batch that does not fit runs in parts of rows that do (`plan`, `parts`, `chunked`: what
`runner.run` calls, so every stage's runs go through here); a single row that does not fit is refused in one line
naming the shape and the estimate.

The estimate (`Estimate`): each tensor's bytes from shape inference at the input shapes (ONNX's with data
propagation, then ONNX Runtime's symbolic inference where ONNX's leaves a tensor unsized; a tensor neither sizes is
counted as its node's largest input), summed under liveness in the graph's order (a node's outputs are made while its
inputs are still held; a tensor is freed after its last reader; graph outputs stay to the end), times ARENA for ONNX
Runtime's CPU arena, plus SCRATCH; the weights apart (the session holds them already). Stage sessions run without
memory patterns and hand the arena's free memory back after each run (`runner.session`, `runner.whole`). Without the
arena the liveness sum is what a run takes (1.0x to 1.26x measured on the examples' models and bench/memory.py's
long-audio one), but runs were 1.5 to 3 times slower: the arena stays, and ARENA bounds what it adds.

The budget (TRTFLOW_MEMORY_BUDGET, trtflow/settings.py): by default half of the memory the machine has available
when the run starts, for the run to add to the process; or a size the process's resident memory stays under (its
resident memory now and the run's estimate together). What a caller does with the outputs beside the runs can be
kept out of it (`reserved`: validate's comparison). bench/memory.py measures predicted against measured peaks.
"""
from __future__ import annotations

import contextlib
import io
import math
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from trtflow import procfs, settings
from trtflow.errors import StageError

if TYPE_CHECKING:
    import onnx

Feeds = dict[str, np.ndarray]
SMALL_INITIALIZER = 4096  # bytes: initializers kept with their values in the skeleton (shape inference reads them)
# a run's resident growth over its live tensors: ONNX Runtime's CPU arena extends by doubling regions (measured
# 1.1x to 1.8x on the examples' models and bench/memory.py's audio model, memory patterns off: docs/limits.md)
ARENA = 2.0
SCRATCH = 32 * 2**20  # a run's cost beyond its tensors: kernels' scratch, threads, code paged in (measured 5-30 MiB)
OUTPUT_COPIES = 2  # a chunked run holds its chunks' outputs, then their concatenation
# what comparing a candidate's outputs with the reference's takes, in their bytes: the candidate's outputs held, and
# stages/compare/accuracy.py's float64 copies, masks and differences, and its float64 copy of the first reference
# (measured: 14.5x above the resident memory before it, 1.83 GiB for PP-OCRv4's recognizer's 129 MiB output at
# 32 x 48 x 1280)
COMPARISON = 16


def gib(size: float) -> str:
    if size < 2**20:
        return f"{size / 2**10:.0f} KiB"
    return f"{size / 2**30:.3g} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


@dataclass(frozen=True)
class Estimate:
    """A model's memory at one set of input shapes: its weights, its inputs, the most bytes of node outputs alive at
    once (`activations`, graph outputs included) and the graph outputs alone; `guessed`: tensors whose size shape
    inference did not give (each counted as its node's largest input)."""
    shapes: dict[str, list[int]]
    weights: int
    inputs: int
    activations: int
    outputs: int
    largest: int = 0  # the largest tensor a node makes
    guessed: int = 0

    @property
    def run(self) -> int:
        """What a run adds to a process that holds the session (its weights) and the feeds."""
        return int(self.activations * ARENA) + SCRATCH

    @property
    def peak(self) -> int:
        """All of it: the weights, the inputs and a run."""
        return self.weights + self.inputs + self.run

    def shown(self) -> str:
        return ", ".join(f"{name} {shape}" for name, shape in self.shapes.items())


# ------------------------------------------------------------------------------------------------- the graph

@dataclass
class Graph:
    """A model's graph without its large weights (what shape inference and liveness need), its weights' bytes, and
    the estimates made so far, by input shapes."""
    model: onnx.ModelProto
    weights: int
    name: str = "the model"
    estimates: dict[str, Estimate] = field(default_factory=dict)

    @classmethod
    def of(cls, model: onnx.ModelProto | Path) -> "Graph":
        import onnx

        name = "the model"
        if isinstance(model, onnx.ModelProto):  # the caller's: copied before its weights are dropped
            skeleton = onnx.ModelProto()
            skeleton.CopyFrom(model)
        else:  # read here: its weights dropped in place (a second copy of a large model's would cost its size)
            name = Path(model).name
            skeleton = onnx.load(str(model), load_external_data=False)
        weights = 0
        for init in skeleton.graph.initializer:
            size = _bytes(init.data_type, list(init.dims))
            weights += size
            if size > SMALL_INITIALIZER:
                _strip(init)
        for node in skeleton.graph.node:
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.HasField("t"):
                        weights += _bytes(attr.t.data_type, list(attr.t.dims))
        return cls(skeleton, weights, name)

    def inputs(self) -> list[onnx.ValueInfoProto]:
        weights = {i.name for i in self.model.graph.initializer}
        return [vi for vi in self.model.graph.input if vi.name not in weights]

    def estimate(self, shapes: dict[str, list[int]]) -> Estimate:
        key = _key(shapes)
        if key not in self.estimates:
            self.estimates[key] = _estimate(self, shapes)
        return self.estimates[key]

    def batched(self) -> bool:
        """Every input's first dimension is dynamic (Triton's rule): dimension 0 is a batch of independent rows."""
        dims = [vi.type.tensor_type.shape.dim for vi in self.inputs()]
        return bool(dims) and all(len(d) > 0 and not (d[0].HasField("dim_value") and d[0].dim_value > 0)
                                  for d in dims)

    def under(self, shapes: dict[str, list[int]], room: int) -> bool:
        """Whether other shapes already estimated, at least as large in every dimension, fit `room`: then these
        shapes do too, without another inference (a model's tensors do not shrink as its inputs grow)."""
        if _key(shapes) in self.estimates:
            return False  # estimated: planned (and recorded) from its own estimate
        return any(e.run <= room for e in self._over(shapes))

    def bound(self, shapes: dict[str, list[int]]) -> Estimate:
        """An estimate at least these shapes': their own where made, else the smallest made at shapes at least as
        large in every dimension, else their own, made now (data of many sizes infers a few times, not per size)."""
        if _key(shapes) not in self.estimates:
            larger = sorted(self._over(shapes), key=lambda e: e.run)
            if larger:
                return larger[0]
        return self.estimate(shapes)

    def _over(self, shapes: dict[str, list[int]]) -> list[Estimate]:
        return [e for e in self.estimates.values() if e.shapes.keys() == shapes.keys() and all(
            len(e.shapes[k]) == len(v) and all(a >= b for a, b in zip(e.shapes[k], v)) for k, v in shapes.items())]


def _key(shapes: dict[str, list[int]]) -> str:
    return repr(sorted((k, list(map(int, v))) for k, v in shapes.items()))


def _strip(init: onnx.TensorProto) -> None:
    """The initializer's values dropped, its name, type and dims kept."""
    import onnx

    for name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        init.ClearField(name)
    del init.external_data[:]
    init.data_location = onnx.TensorProto.DEFAULT


def _bytes(elem_type: int, dims: list[int]) -> int:
    from onnx import helper

    try:
        itemsize = helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 8  # a type numpy does not name: counted as the widest
    return math.prod(max(int(d), 0) for d in dims) * itemsize


def _at(graph: Graph, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """The skeleton with its inputs fixed at `shapes`."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(graph.model)
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            for d, v in zip(dims, shapes[vi.name]):
                d.Clear()
                d.dim_value = int(v)
    return model


def _inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every tensor's type and shape inferred: ONNX's inference with data propagation, and where it
    leaves a tensor unsized (shape arithmetic it does not follow: PP-OCRv4's recognizer's attention), ONNX Runtime's
    symbolic inference where it sizes more (it imports sympy: 0.4 s, once)."""
    import onnx

    try:
        found = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - onnx raises its own types for a model it cannot infer
        found = model
    unsized = _unsized(found)
    if not unsized:
        return found
    try:
        from trtflow.no_torch import torch_hidden

        with torch_hidden():  # onnxruntime.tools imports PyTorch where installed: 500 MiB resident, 1.6 s
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            symbolic = SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=False)
    except Exception:  # noqa: BLE001 - it raises what it meets (an op it has no rule for, a shape it cannot merge)
        return found
    return symbolic if _unsized(symbolic) < unsized else found


def _unsized(model: onnx.ModelProto) -> int:
    sizes = _sizes(model)
    return sum(sizes.get(t) is None for n in model.graph.node for t in n.output if t)


def _sizes(model: onnx.ModelProto) -> dict[str, int | None]:
    """Tensor name -> bytes, where its type and every dimension are known (None where not)."""
    sizes: dict[str, int | None] = {}
    for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input):
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        known = t.HasField("shape") and t.elem_type and all(d is not None and d >= 0 for d in dims)
        sizes[vi.name] = _bytes(t.elem_type, dims) if known else None
    return sizes


def _reads(node: onnx.NodeProto) -> list[str]:
    """The tensors a node reads from its graph: its inputs, and what its If/Loop/Scan bodies read from outside."""
    from trtflow.stages.onnx.graph import subgraphs

    found = [t for t in node.input if t]
    for body in subgraphs(node):
        local = {i.name for i in body.input} | {i.name for i in body.initializer}
        for inner in body.node:
            found += [t for t in _reads(inner) if t not in local]
            local.update(o for o in inner.output if o)
    return list(dict.fromkeys(found))


def _estimate(graph: Graph, shapes: dict[str, list[int]]) -> Estimate:
    import onnx


    inferred = _inferred(_at(graph, shapes))
    sizes = _sizes(inferred)
    nodes = list(inferred.graph.node)
    outputs = {o.name for o in inferred.graph.output}
    fed = {vi.name for vi in graph.inputs()} | {i.name for i in inferred.graph.initializer} | \
        {o for n in nodes if n.op_type == "Constant" for o in n.output}  # ONNX Runtime makes Constants weights
    last: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for t in _reads(node):
            last[t] = i
    live = peak = guessed = 0
    for i, node in enumerate(nodes):
        made = 0
        for t in (o for o in node.output if o and o not in fed):
            if sizes.get(t) is None:  # unknown: the node's largest input (an element-wise op's output)
                sizes[t] = max((sizes.get(x) or 0 for x in node.input if x), default=0)
                guessed += 1
            made += sizes[t] or 0
        live += made
        peak = max(peak, live)
        for t in set(_reads(node)) | {o for o in node.output if o}:
            if t not in fed and t not in outputs and last.get(t, i) <= i:
                live -= sizes.get(t) or 0
    inputs = sum(_bytes(onnx.TensorProto.FLOAT if not vi.type.tensor_type.elem_type else
                        vi.type.tensor_type.elem_type, shapes.get(vi.name, [])) for vi in graph.inputs())
    made = [sizes.get(t) or 0 for n in nodes for t in n.output if t and t not in fed]
    return Estimate({k: list(map(int, v)) for k, v in shapes.items()}, graph.weights, inputs, peak,
                    sum(sizes.get(o) or 0 for o in outputs), max(made, default=0), guessed)


# ------------------------------------------------------------------------------------------------ the budget

def total() -> int | None:
    """This machine's memory (MemTotal)."""
    return procfs.status_bytes("MemTotal", "/proc/meminfo")


@dataclass(frozen=True)
class Room:
    """What a run may add to this process now (`bytes`; None: nothing says, unbounded), the budget in words, and
    the resident memory the process may reach with it (`cap`)."""
    bytes: int | None
    said: str
    cap: int | None = None
    resident: int = 0  # the process's resident memory when it was measured


def room() -> Room:
    budget, held = settings.MEMORY_BUDGET.get(), procfs.resident()
    if budget.size is not None:
        return Room(budget.size - held, f"TRTFLOW_MEMORY_BUDGET={gib(budget.size)} for the process, "
                                        f"{gib(held)} of it already resident", budget.size, held)
    free = procfs.available()
    if free is None:
        return Room(None, "no budget: /proc/meminfo does not say the available memory", None, held)
    share = int(free * (budget.share or 0))
    return Room(share, f"TRTFLOW_MEMORY_BUDGET {budget.share:.0%} of the {gib(free)} available", held + share, held)


# ----------------------------------------------------------------------------------------------- the planning

@dataclass(frozen=True)
class Planned:
    """One run planned against the budget: its estimate at the whole batch, the rows each part runs (the whole
    batch where it fits), the estimate of a part, the process's resident memory then and the room it had."""
    model: str
    whole: Estimate
    rows: int
    part: Estimate
    resident: int
    room: Room
    beside: int = 0  # what the caller holds beside the run (the calibrator's samples)

    @property
    def predicted(self) -> int:
        """The process's predicted peak during the run: resident memory, a part's run, the outputs held."""
        held = OUTPUT_COPIES * self.whole.outputs if self.rows < _batch(self.whole) else 0
        return self.resident + self.part.run + held + self.beside


PLANNED: list[Planned] = []  # this process's planned runs, the largest prediction first (bench/memory.py reads it)
KEPT = 8


def note(graph: Graph, e: Estimate, budget: Room, beside: int) -> None:
    """Record a run its caller planned itself (the calibrator: `beside` what it holds of earlier samples)."""
    _record(Planned(graph.name, e, _batch(e), e, procfs.resident(), budget, beside))


def _record(plan: Planned) -> None:
    PLANNED.append(plan)
    PLANNED.sort(key=lambda p: -p.predicted)
    del PLANNED[KEPT:]


def predicted_peak() -> int:
    """The largest peak predicted for this process so far (0 before any run was planned)."""
    return max((p.predicted for p in PLANNED), default=0)


def _batch(e: Estimate) -> int:
    return max((s[0] for s in e.shapes.values() if s), default=1)


def _at_rows(shapes: dict[str, list[int]], rows: int) -> dict[str, list[int]]:
    return {k: [rows, *v[1:]] for k, v in shapes.items()}


def plan(graph: Graph, feeds: Feeds) -> int | None:
    """The rows of the batch each run takes to fit the budget (less what the caller keeps for its outputs:
    `reserved`): None for all of them at once. A single row over the budget, or a batch over it that cannot be
    split (no batch dimension), is refused naming the shape and the estimate (StageError)."""
    budget, kept = room(), _RESERVED[-1]
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    if budget.bytes is None or graph.under(shapes, budget.bytes - kept):
        return None
    whole = graph.estimate(shapes)
    held, free = budget.resident, budget.bytes - kept
    if whole.run <= free:
        _record(Planned(graph.name, whole, _batch(whole), whole, held, budget, kept))
        return None
    sizes = {v.shape[0] if v.ndim else None for v in feeds.values()}
    rows = next(iter(sizes)) if len(sizes) == 1 else None
    if not graph.batched() or not rows:
        raise refusal(graph, whole, budget, "its inputs have no batch dimension to run in parts", kept)
    if rows == 1:
        raise refusal(graph, whole, budget, "a single sample does not fit", kept)
    part = _rows_that_fit(graph, whole, rows, free)
    if part is None:
        one = graph.estimate(_at_rows(shapes, 1))
        raise refusal(graph, one, budget, f"a batch of {rows} runs in parts, and a single sample does not fit", kept)
    _record(Planned(graph.name, whole, _batch(part), part, held, budget, kept))
    return _batch(part)


_RESERVED = [0]


@contextlib.contextmanager
def reserved(size: int) -> Iterator[None]:
    """Within: `size` bytes of the budget kept for what the caller does with the runs' outputs besides (validate
    compares them: `COMPARISON` times their bytes), planned as held during the runs."""
    _RESERVED.append(max(int(size), 0))
    try:
        yield
    finally:
        _RESERVED.pop()


def _rows_that_fit(graph: Graph, whole: Estimate, rows: int, room_bytes: int) -> Estimate | None:
    """The estimate of the largest even part of the batch whose run, with the outputs held, fits `room_bytes`
    (None where a single row does not): linear in the rows from the estimates at 1 and at the whole batch, then
    checked at the part's own shape."""
    held = OUTPUT_COPIES * whole.outputs
    one = graph.estimate(_at_rows(whole.shapes, 1))
    if one.run + held > room_bytes:
        return None
    per_row = max((whole.run - one.run) / (rows - 1), 1.0)
    fit = int((room_bytes - held - one.run) / per_row) + 1
    while fit >= 1:
        parts = math.ceil(rows / max(min(fit, rows - 1), 1))
        size = math.ceil(rows / parts)
        part = graph.estimate(_at_rows(whole.shapes, size))
        if part.run + held <= room_bytes:
            return part
        fit = min(size - 1, int(size * room_bytes / (part.run + held)))
    return None


def refusal(graph: Graph, e: Estimate, budget: Room, why: str, kept: int = 0) -> StageError:
    """The one line refusing a run at `e`'s shapes: the estimate, the budget, why it cannot be made to fit."""
    guessed = f"; {e.guessed} tensor(s) sized by their inputs" if e.guessed else ""
    beside = f", and {gib(kept)} kept for comparing its outputs" if kept else ""
    return StageError(f"running {graph.name} at {e.shown()} needs an estimated {gib(e.run)} (activations "
                      f"{gib(e.activations)} under liveness, x{ARENA:g} for ONNX Runtime's arena; weights "
                      f"{gib(e.weights)} apart{guessed}{beside}), over the memory budget ({budget.said}): {why}; "
                      f"give the profile a smaller max, or raise TRTFLOW_MEMORY_BUDGET")


# ------------------------------------------------------------------------------------------------ the running

def parts(run: Callable[[Feeds], dict[str, np.ndarray]], feeds: Feeds, graph: Graph | None
          ) -> Iterator[tuple[Feeds, dict[str, np.ndarray]]]:
    """(part of the feeds, `run`'s outputs on it) for each part of the batch the budget allows (the whole feed
    where it fits, or where nothing is known of the model)."""
    rows = plan(graph, feeds) if graph is not None else None
    if rows is None:
        yield feeds, run(feeds)
        return
    for start in range(0, _rows(feeds), rows):
        part = {k: v[start:start + rows] for k, v in feeds.items()}
        yield part, run(part)


def chunked(run: Callable[[Feeds], dict[str, np.ndarray]], feeds: Feeds, graph: Graph | None
            ) -> dict[str, np.ndarray]:
    """`run(feeds)`, in parts of the batch that fit the budget, their outputs joined along the batch."""
    got = list(parts(run, feeds, graph))
    return join([out for _, out in got], [_rows(part) for part, _ in got], graph.name if graph else "the model")


def join(outs: list[dict[str, np.ndarray]], rows: list[int], model: str = "the model") -> dict[str, np.ndarray]:
    """The outputs of parts of a batch (`rows` each) joined along it, each part's freed as it is joined (an
    output must follow the batch: its first dimension the part's rows)."""
    if len(outs) == 1:
        return outs[0]
    joined = {}
    for name in list(outs[0]):
        pieces = [out[name] for out in outs]
        if any(p.ndim == 0 or p.shape[0] != r for p, r in zip(pieces, rows)):
            raise StageError(f"{model}: output '{name}' does not follow the batch (its first dimension is not the "
                             f"rows run), so the batch cannot run in parts within the memory budget; raise "
                             f"TRTFLOW_MEMORY_BUDGET or give the profile a smaller max batch")
        joined[name] = np.concatenate(pieces, axis=0)
        del pieces
        for out in outs:
            del out[name]
    return joined


def _rows(feeds: Feeds) -> int:
    return next(iter(feeds.values())).shape[0]


# ---------------------------------------------------------------------------------------- sessions' graphs

_SOURCES: "weakref.WeakKeyDictionary[Any, tuple[Path, tuple[int, int]]]" = weakref.WeakKeyDictionary()
_GRAPHS: "weakref.WeakKeyDictionary[Any, Graph | None]" = weakref.WeakKeyDictionary()
_FILES: dict[tuple[str, tuple[int, int]], Graph] = {}  # the graphs of the files read last, for their other sessions
FILES_KEPT = 4


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def register(sess: Any, path: Path) -> None:
    """The model file an ONNX Runtime session runs: its graph is read when the session first runs (if the file is
    still the one the session loaded)."""
    try:
        _SOURCES[sess] = (Path(path), _stamp(Path(path)))
    except OSError:
        pass


def graph_of(sess: Any) -> Graph | None:
    """The graph of a session made by `runner.session` (None for another, or for a file since changed or gone: the
    session then runs unplanned, as before the budget)."""
    if sess not in _GRAPHS:
        _GRAPHS[sess] = _read(*_SOURCES[sess]) if sess in _SOURCES else None
    return _GRAPHS[sess]


def _read(path: Path, stamp: tuple[int, int]) -> Graph | None:
    key = (str(path), stamp)
    if key not in _FILES:
        try:
            if _stamp(path) != stamp:
                return None
            graph = Graph.of(path)
        except Exception:  # noqa: BLE001 - a file gone or unreadable
            return None
        _FILES[key] = graph
        while len(_FILES) > FILES_KEPT:
            del _FILES[next(iter(_FILES))]
    return _FILES[key]
