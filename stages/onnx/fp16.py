"""FP16 conversion as a precision assignment: each node of the main graph runs in FP16 or in FP32, each float
tensor has the precision of the node that produces it, and a Cast sits on every edge where the two differ.

onnxconverter-common's converter writes invalid graphs where models are not plain: a `Cast(to=FLOAT)` after shape
arithmetic keeps its `to` while its output is retyped (YOLO-style box decoding), subgraphs of `If`/`Loop` are
converted without their outer-scope inputs, models already holding FP16 parts end in type errors, and
`op_block_list=[Cast]` never terminates. Here:
- shape arithmetic (float tensors computed from Shape/Size and constants alone: YOLO anchor grids, Range
  bounds) stays FP32, found by data flow;
- `Cast(to=FLOAT)` in an FP16 node becomes `Cast(to=FLOAT16)`; `Constant`/`ConstantOfShape` values follow their
  node; `Cast`, `Shape` and `Size` take their input in whatever precision it has;
- control flow (`If`, `Loop`, `Scan`) stays FP32 as a whole: outer-scope tensors its subgraphs read are cast back
  to FP32 at the boundary, and the subgraphs are pointed at the casts;
- tensors that are FP16 already, and the nodes that only touch them, are left as they are;
- the work is one pass over the graph: nothing loops.
`convert_valid` then checks the result in ONNX Runtime and keeps in FP32 each node an error names, a bounded
number of rounds: the FP32 island that makes the graph valid, reported node by node.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtflow import phases
from trtflow.errors import TransientStageError
from trtflow.stages.onnx.graph import constant_tensors, shape_derived, subgraphs
from trtflow.text import first_line

FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16
FP16_MAX = 65504.0
# FP16 rounds |x| < 2**-25 (half its smallest subnormal, 5.96e-8) to 0. Subnormals above it survive (GPUs keep FP16
# subnormals), imprecisely: losing a value to 0 is what turns `log(x + 1e-10)` into -inf.
FP16_ZERO_BELOW = 2.0 ** -25
SMALL_CONSTANT = 64  # elements: an epsilon, an offset, a scale; a weight tensor is larger
SINGULAR_AT_ZERO = {"Log": (0,), "Div": (1,), "Reciprocal": (0,), "Pow": (0,), "Sqrt": (0,), "Rsqrt": (0,)}
# op types never run in FP16: onnxconverter-common's default block list (ops whose FP16 kernels are missing or
# whose inputs must stay float: Resize's scales, NonMaxSuppression's boxes, ...), control flow, quantization,
# and generators whose output type is an attribute
ALWAYS_FP32 = {
    "ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer", "FeatureVectorizer",
    "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor", "Normalizer", "OneHotEncoder",
    "RandomUniformLike", "SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsembleClassifier",
    "TreeEnsembleRegressor", "ZipMap", "NonMaxSuppression", "TopK", "RoiAlign", "Resize", "Range", "CumSum", "Min",
    "Max", "Upsample",
    "DynamicQuantizeLinear",
    "RandomNormal", "RandomUniform", "RandomNormalLike", "EyeLike", "Multinomial", "Bernoulli",
}
# ops that accept their input in any precision: no Cast is put in front of them
ANY_INPUT = {"Cast", "Shape", "Size", "CastLike"}
# Q/DQ stay FP32 unless the plan is for a quantized model's remainder (`plan(..., qdq=True)`): their FP16 scales
# need opset 19, and a DequantizeLinear whose reader stays FP32 has to stay FP32 with it
QDQ = {"QuantizeLinear", "DequantizeLinear"}
# TensorRT computes shape arithmetic (Range bounds, sizes, grids made from a feature map's H and W) in FP32:
# an FP16 Cast of a shape value before an FP32 Range is an engine a dynamic profile cannot build
SHAPE_ARITHMETIC = "shape arithmetic (computed from tensor shapes alone) stays FP32"
ISLAND_ROUNDS = 24  # at most this many rounds of "keep the node the error names in FP32"


@dataclass
class Plan:
    half: set[str]  # nodes of the main graph that run in FP16
    fp32: dict[str, str] = field(default_factory=dict)  # node -> why it stays FP32 (for nodes touching floats)


def _float_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.input) + list(g.output)
             if vi.type.HasField("tensor_type")}
    types.update({i.name: i.data_type for i in g.initializer})
    types.update({name: t.data_type for name, t in constant_tensors(g).items()})
    return types


def plan(model: onnx.ModelProto, keep_fp32: dict[str, str], block_ops: set[str], qdq: bool = False) -> Plan:
    """Which nodes run in FP16: every node that touches a float32 tensor, except those kept in FP32. With `qdq`
    (the unquantized remainder of a Q/DQ model at opset >= 19), QuantizeLinear/DequantizeLinear are FP16 where
    what they connect is: a QuantizeLinear where its input comes from FP16, a DequantizeLinear where all its
    readers are FP16 (TensorRT fuses the pair into the op between them only without a Cast in the way)."""
    types = _float_types(model)
    shapes = shape_derived(model)
    result = Plan(half=set())
    for node in model.graph.node:
        touches = [t for t in list(node.input) + list(node.output) if t and types.get(t) == FLOAT]
        if not touches:
            continue
        if node.name in keep_fp32:
            result.fp32[node.name] = keep_fp32[node.name]
        elif any(types.get(t) == FLOAT for t in node.output if t in shapes):
            result.fp32[node.name] = SHAPE_ARITHMETIC
        elif subgraphs(node):
            result.fp32[node.name] = f"control flow ({node.op_type}) runs in FP32 as a whole, cast at its boundary"
        elif node.op_type in block_ops:
            result.fp32[node.name] = f"op type {node.op_type} in block_ops"
        elif node.op_type in ALWAYS_FP32 or (node.op_type in QDQ and not qdq):
            result.fp32[node.name] = f"op type {node.op_type} runs in FP32"
        elif node.domain not in ("", "ai.onnx"):
            result.fp32[node.name] = f"custom-domain op {node.domain}.{node.op_type}"
        elif node.op_type == "Constant" and _attr_name(node) != "value":
            result.fp32[node.name] = "a Constant given as value_float(s)"
        else:
            result.half.add(node.name)
    readers = _readers(model)
    _constants_follow_readers(model, result, readers)
    if qdq:
        _qdq_follow(model, result, readers)
    return result


def _qdq_follow(model: onnx.ModelProto, p: Plan, readers: dict[str, list[str]]) -> None:
    """A DequantizeLinear is FP16 only where every node reading it is; a QuantizeLinear only where its input is
    FP16 (a graph input, with the model's inputs kept FP32, is not)."""
    producer = {o: n.name for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.name not in p.half:
            continue
        if node.op_type == "DequantizeLinear" and any(r not in p.half for r in readers.get(node.output[0], [])):
            p.half.discard(node.name)
            p.fp32[node.name] = "a DequantizeLinear read by a node kept in FP32"
        elif node.op_type == "QuantizeLinear" and producer.get(node.input[0]) not in p.half:
            p.half.discard(node.name)
            p.fp32[node.name] = "a QuantizeLinear of an FP32 tensor"


def lost_to_zero(value: np.ndarray) -> str | None:
    """Why a float constant cannot be FP16 at the low end, or None: FP16 rounds one of its nonzero values to 0, and
    the constant is small (every value of an epsilon matters) or the values lost carry more than 0.1% of its
    magnitude. (A weight tensor with a few values below 3e-8 among thousands loses nothing that shows.)"""
    v = np.abs(value.astype(np.float64)).ravel()
    lost = (v > 0) & (v < FP16_ZERO_BELOW)
    if not lost.any():
        return None
    share = float(np.linalg.norm(v[lost]) / np.linalg.norm(v))
    if v.size > SMALL_CONSTANT and share <= 1e-3:
        return None
    return (f"holds {float(v[lost].min()):.3g}, which FP16 rounds to 0 (below {FP16_ZERO_BELOW:.3g}; "
            f"{int(lost.sum())} of its {v.size} values)")


def _readers(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Tensor -> the names of the main graph's nodes reading it."""
    readers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node.name)
    return readers


def _constants_follow_readers(model: onnx.ModelProto, p: Plan, readers: dict[str, list[str]]) -> None:
    """A Constant (a weight exported as a node) is FP16 only where every node reading it is, and its values fit
    FP16; otherwise it stays FP32 and FP16 readers get a Cast (an FP32 reader would see a clamped value)."""
    for node in model.graph.node:
        if node.op_type != "Constant" or node.name not in p.half:
            continue
        value = numpy_helper.to_array(node.attribute[0].t)
        if value.size and float(np.abs(value).max()) > FP16_MAX:
            p.half.discard(node.name)
            p.fp32[node.name] = f"its value reaches {float(np.abs(value).max()):.4g}, beyond FP16's {FP16_MAX:g}"
        elif any(r not in p.half for r in readers.get(node.output[0], [])):
            p.half.discard(node.name)
            p.fp32[node.name] = "read by a node kept in FP32"


@phases.timed("FP16 conversion (graph rewrite)")
def convert(model: onnx.ModelProto, p: Plan, keep_io_types: bool = True) -> onnx.ModelProto:
    """The FP16 variant of `model` under plan `p` (a copy; `model` is left as it is)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    is_half = _tensor_precisions(g, _float_types(model), p, keep_io_types)
    outer_refs = {node.name: _outer_refs(node) for node in g.node if subgraphs(node)}
    half_copy = _convert_weights(g, p, is_half, {t for refs in outer_refs.values() for t in refs})
    nodes = _Nodes()
    for node in g.node:
        _rewire(node, node.name in p.half, is_half, half_copy, outer_refs.get(node.name), nodes)
    _cast_outputs(g, nodes.order, is_half, keep_io_types)
    del g.node[:]
    g.node.extend(nodes.order)
    del g.value_info[:]  # stale types; inference fills them in again
    try:
        return onnx.shape_inference.infer_shapes(out)
    except Exception:  # noqa: BLE001 - the graph is still valid without value_info
        return out


def _tensor_precisions(g: onnx.GraphProto, types: dict[str, int], p: Plan, keep_io_types: bool) -> dict[str, bool]:
    """Whether each float32 tensor of the main graph is FP16 after conversion (before its weights are converted);
    without `keep_io_types` the graph's float inputs are retyped FP16 here."""
    is_half: dict[str, bool] = {t: False for t, ty in types.items() if ty == FLOAT}
    for node in g.node:
        if node.name not in p.half:
            continue
        for t in node.output:
            if t in is_half or (node.op_type == "Cast" and _attr(node, "to") == FLOAT):
                is_half[t] = True
    if not keep_io_types:
        weights = {x.name for x in g.initializer}
        for i in g.input:
            if types.get(i.name) == FLOAT and i.name not in weights:
                is_half[i.name] = True
                i.type.tensor_type.elem_type = HALF
    return is_half


def _convert_weights(g: onnx.GraphProto, p: Plan, is_half: dict[str, bool], fp32_readers: set[str]) -> dict[str, str]:
    """Weights FP16 where FP16 nodes read them; a second, FP16 copy where FP32 readers (or the graph's inputs and
    outputs, or control flow reading them by name: `fp32_readers`) need the original too. Returns weight -> copy."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    io = {i.name for i in g.input} | {o.name for o in g.output}
    half_copy: dict[str, str] = {}
    for init in list(g.initializer):
        readers = consumers.get(init.name, [])
        if init.data_type != FLOAT or not any(n.name in p.half and n.op_type not in ANY_INPUT for n in readers):
            continue
        needs_fp32 = any(n.name not in p.half for n in readers) or init.name in fp32_readers or init.name in io
        data = np.clip(numpy_helper.to_array(init), -FP16_MAX, FP16_MAX).astype(np.float16)
        if needs_fp32:
            half_copy[init.name] = f"{init.name}__fp16"
            g.initializer.append(numpy_helper.from_array(data, half_copy[init.name]))
        else:
            init.CopyFrom(numpy_helper.from_array(data, init.name))
            is_half[init.name] = True
    return half_copy


@dataclass
class _Nodes:
    """The converted graph's nodes in order: each Cast (one per tensor and type) before the first node reading it."""
    order: list[onnx.NodeProto] = field(default_factory=list)
    casts: dict[tuple[str, int], str] = field(default_factory=dict)

    def cast(self, tensor: str, to: int) -> str:
        key = (tensor, to)
        if key not in self.casts:
            suffix = "fp16" if to == HALF else "fp32"
            self.casts[key] = f"{tensor}__to_{suffix}"
            self.order.append(helper.make_node("Cast", [tensor], [self.casts[key]], to=to,
                                               name=f"{tensor}__trtflow_cast_{suffix}"))
        return self.casts[key]


def _rewire(node: onnx.NodeProto, half: bool, is_half: dict[str, bool], half_copy: dict[str, str],
            outer_refs: list[str] | None, nodes: _Nodes) -> None:
    """`node` reading its inputs in its own precision (through a Cast or a weight's FP16 copy), appended to `nodes`;
    control flow (`outer_refs`: what its subgraphs read by name) stays FP32: its subgraphs read FP32 copies."""
    for i, t in enumerate(node.input):
        if t not in is_half or node.op_type in ANY_INPUT:
            continue
        if half and t in half_copy:
            node.input[i] = half_copy[t]
        elif is_half[t] != half:
            node.input[i] = nodes.cast(t, HALF if half else FLOAT)
    if outer_refs is not None:
        renames = {t: nodes.cast(t, FLOAT) for t in outer_refs if is_half.get(t)}
        for sub in subgraphs(node):
            _rename_refs(sub, renames)
    if half:
        _retype_attributes(node)
    nodes.order.append(node)


def _cast_outputs(g: onnx.GraphProto, nodes: list[onnx.NodeProto], is_half: dict[str, bool],
                  keep_io_types: bool) -> None:
    """FP16 graph outputs: retyped, or, with `keep_io_types`, cast back to FP32 under the same name."""
    for o in g.output:
        if not is_half.get(o.name):
            continue
        if keep_io_types:
            inner = f"{o.name}__fp16"
            for node in nodes:
                node.output[:] = [inner if t == o.name else t for t in node.output]
                node.input[:] = [inner if t == o.name else t for t in node.input]
            nodes.append(helper.make_node("Cast", [inner], [o.name], to=FLOAT, name=f"{o.name}__trtflow_cast_output"))
        else:
            o.type.tensor_type.elem_type = HALF


def convert_valid(model: onnx.ModelProto, keep_fp32: dict[str, str], block_ops: set[str], keep_io_types: bool,
                  check: Callable[[onnx.ModelProto], None],
                  qdq: bool = False) -> tuple[onnx.ModelProto, Plan, dict[str, str]]:
    """Convert, then run `check` (which raises on an invalid model); each node an error names is kept in FP32
    and the conversion redone. An error naming no node (a crash) is narrowed down by op type, assuming one op
    type is at fault. At most ISLAND_ROUNDS conversions in all. Returns the model, its plan and the island
    (node -> why). Raises `InvalidFP16` when no island is found."""
    keep = dict(keep_fp32)
    island: dict[str, str] = {}
    rounds = 0

    def attempt(extra: dict[str, str]) -> tuple[onnx.ModelProto, Plan, str | None]:
        nonlocal rounds
        rounds += 1
        p = plan(model, {**keep, **extra}, block_ops, qdq)
        converted = convert(model, p, keep_io_types)
        try:
            check(converted)
            return converted, p, None
        except TransientStageError:  # the check itself was killed or timed out: no evidence about the graph
            raise
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime and the checker raise their own types
            return converted, p, str(exc) or type(exc).__name__

    while rounds < ISLAND_ROUNDS:
        converted, p, error = attempt({})
        if error is None:
            return converted, p, island
        named = _named_nodes(error, model, p.half)
        if not named:
            named = _culprit_op_type(model, p, error, attempt, lambda: rounds < ISLAND_ROUNDS)
        if not named:
            raise InvalidFP16(error, island)
        why = f"kept in FP32 so the FP16 graph is valid ({first_line(error)[:160]})"
        for n in named:
            island[n] = first_line(error)
            keep[n] = why
    raise InvalidFP16(error, island)


def _culprit_op_type(model: onnx.ModelProto, p: Plan, error: str, attempt, rounds_left) -> list[str]:
    """The FP16 nodes of the one op type whose return to FP32 makes the graph valid (binary search)."""
    by_type: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.name in p.half:
            by_type.setdefault(node.op_type, []).append(node.name)
    types = sorted(by_type)
    while len(types) > 1 and rounds_left():
        first = types[:len(types) // 2]
        nodes = {n: "bisect" for t in first for n in by_type[t]}
        types = first if attempt(nodes)[2] is None else types[len(types) // 2:]
    if len(types) != 1 or not rounds_left():
        return []
    return by_type[types[0]] if attempt({n: "bisect" for n in by_type[types[0]]})[2] is None else []


class InvalidFP16(Exception):
    def __init__(self, error: str, island: dict[str, str]):
        super().__init__(error)
        self.error, self.island = error, island


def _named_nodes(error: str, model: onnx.ModelProto, half: set[str]) -> list[str]:
    """FP16 nodes of the original graph an error message points at: the node it names, or, where it names a
    node that is not FP16 (an inserted Cast, an FP32 node), the FP16 nodes next to it."""
    producer = {o: n for n in model.graph.node for o in n.output}
    by_name = {n.name: n for n in model.graph.node}
    found: list[str] = []
    for raw in re.findall(r"node \(([^)]+)\)|Name:'([^']+)'|node name: ([^\s),]+)", error):
        name = next(x for x in raw if x)
        if "__trtflow_cast_" in name:  # a Cast this module inserted: look at the node whose output it casts
            tensor = name.split("__trtflow_cast_")[0]
            name = producer[tensor].name if tensor in producer else name
        if name in half:
            candidates = [name]
        elif name in by_name:
            node = by_name[name]
            candidates = [producer[i].name for i in node.input if i in producer and producer[i].name in half]
            candidates += [n.name for n in model.graph.node if n.name in half and set(n.input) & set(node.output)]
        else:
            candidates = []
        found += [c for c in candidates if c not in found]
    return found


def _attr(node: onnx.NodeProto, name: str) -> int | None:
    return next((a.i for a in node.attribute if a.name == name), None)


def _attr_name(node: onnx.NodeProto) -> str | None:
    return node.attribute[0].name if node.attribute else None


def _retype_attributes(node: onnx.NodeProto) -> None:
    """An FP16 node's own float32 literals become FP16: Cast targets, Constant and ConstantOfShape values."""
    for a in node.attribute:
        if node.op_type == "Cast" and a.name == "to" and a.i == FLOAT:
            a.i = HALF
        elif node.op_type in ("Constant", "ConstantOfShape") and a.name == "value" and a.t.data_type == FLOAT:
            data = np.clip(numpy_helper.to_array(a.t), -FP16_MAX, FP16_MAX).astype(np.float16)
            a.t.CopyFrom(numpy_helper.from_array(data, a.t.name))


def _outer_refs(node: onnx.NodeProto) -> list[str]:
    """Tensors of the enclosing graph that the node's subgraphs (at any depth) read by name."""
    refs: list[str] = []

    def walk(graph: onnx.GraphProto, defined: set[str]) -> None:
        local = defined | {i.name for i in graph.input} | {i.name for i in graph.initializer}
        for n in graph.node:
            for t in n.input:
                if t and t not in local and t not in refs:
                    refs.append(t)
            for sub in subgraphs(n):
                walk(sub, local)
            local |= set(n.output)

    for sub in subgraphs(node):
        walk(sub, set())
    return refs


def _rename_refs(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    """Point reads of outer-scope tensors at new names, at any depth, where no local name shadows them."""
    local = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    active = {k: v for k, v in renames.items() if k not in local}
    for n in graph.node:
        n.input[:] = [active.get(t, t) if t not in local else t for t in n.input]
        for sub in subgraphs(n):
            _rename_refs(sub, {k: v for k, v in active.items() if k not in local})
        local |= set(n.output)
