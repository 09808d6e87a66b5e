"""How much of a model variant's compute runs at which precision, read from the graph TensorRT builds.

TensorRT 10/11 and TensorRT-RTX build Q/DQ and FP16 ONNX strongly typed: a Conv or MatMul runs in INT8 when both its
inputs are dequantized INT8 (the Q/DQ pair fuses into it), else in the type of its inputs. So an "INT8" variant whose
unquantized remainder is FP32 does that remainder in FP32 on the GPU, and an "FP16" variant with large FP32 islands
is in part an FP32 engine; the variant's name says neither. The multiply-accumulates (Conv, ConvTranspose, Gemm,
MatMul, attention) are counted at given input shapes; every other op by the elements it writes. The result, a
`Composition`, is a record of `records.py`.
"""
from __future__ import annotations

import contextlib
import io
import math
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto, numpy_helper

from trtflow.stages.onnx.records import Composition, Shares

MAC_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "MatMulInteger", "Attention", "MultiHeadAttention", "Einsum",
           "LSTM", "GRU", "RNN", "ConvInteger", "QLinearConv", "QLinearMatMul", "MatMulIntegerToFloat",
           "DynamicQuantizeLSTM")
_INTEGER_MACS = {"MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul", "MatMulIntegerToFloat",
                 "DynamicQuantizeLSTM"}  # ops whose multiply-accumulates are integer by definition
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1, "DynamicQuantizeLSTM": 4}
_BODIES = {"If", "Loop", "Scan"}
_MAX_DEPTH = 16  # nested bodies counted (deeper ones are not: a guard against a hostile model, not a real limit)
_INTEGER = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32,
            TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT64}
# an op that only moves or renames data, between a DequantizeLinear and the op that reads it (a weight's Transpose)
_PASS_THROUGH = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
_FREE = {"QuantizeLinear", "DequantizeLinear", "Cast", "Shape", "Constant", "Identity", "Reshape", "Squeeze",
         "Unsqueeze", "Flatten"}  # fused or free in TensorRT: not counted among the other ops
_HALF = {TensorProto.FLOAT16, TensorProto.BFLOAT16}
_FLOAT = _HALF | {TensorProto.FLOAT, TensorProto.DOUBLE}
def composition(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> Composition:
    """`model`'s composition with its inputs at `shapes` (name -> dims; inputs not named keep their static dims,
    a dynamic one counted as 1). Ops inside `If`, `Loop` and `Scan` bodies count: a loop's body times its trip
    count where the graph fixes it (else once, and said), the larger branch of an `If`."""
    g, types, dims = _inferred(_fixed(model, shapes))
    tally = _Tally()
    _count(g, _Scope(types, dims, {o: n for n in g.node for o in n.output}, _constants(g)), tally, 1)
    return Composition(macs=sum(tally.macs.values()), mac_share=_shares(tally.macs),
                       other_share=_shares(tally.others), elements=sum(tally.others.values()),
                       weight_bytes=_weight_bytes(model),
                       shapes={vi.name: _static(vi) for vi in g.input if vi.name in shapes or _static(vi)},
                       unsized=tally.unsized, untimed=tally.untimed)


@dataclass
class _Tally:
    macs: dict[str, int] = field(default_factory=lambda: {"int8": 0, "fp16": 0, "fp32": 0})
    others: dict[str, int] = field(default_factory=lambda: {"int8": 0, "fp16": 0, "fp32": 0})
    unsized: int = 0
    untimed: int = 0

    def add(self, other: "_Tally", times: int = 1) -> None:
        for p in self.macs:
            self.macs[p] += other.macs[p] * times
            self.others[p] += other.others[p] * times
        self.unsized += other.unsized
        self.untimed += other.untimed


@dataclass
class _Scope:
    """What a graph's nodes can see: its tensors' types and dims, their producers and the constant scalars, with
    those of every enclosing graph (a body reads its outer graph's tensors by name)."""
    types: dict[str, int]
    dims: dict[str, list[int] | None]
    producer: dict[str, onnx.NodeProto]
    constants: dict[str, int]

    def inner(self, body: onnx.GraphProto) -> "_Scope":
        types, dims = _tensors(body)
        return _Scope({**self.types, **types}, {**self.dims, **dims},
                      {**self.producer, **{o: n for n in body.node for o in n.output}},
                      {**self.constants, **_constants(body)})


def _count(g: onnx.GraphProto, scope: _Scope, tally: _Tally, depth: int) -> None:
    for node in g.node:
        if node.op_type in _BODIES and depth < _MAX_DEPTH:
            _count_bodies(node, scope, tally, depth)
        elif node.op_type in MAC_OPS:
            count = _macs(node, scope.dims)
            tally.unsized += count is None
            tally.macs[_mac_precision(node, scope.producer, scope.types)] += count or 0
        elif node.op_type not in _FREE and node.output and scope.types.get(node.output[0]) in _FLOAT:
            tally.others[_other_precision(node, scope.producer, scope.types)] += _size(scope.dims.get(node.output[0]))


def _count_bodies(node: onnx.NodeProto, scope: _Scope, tally: _Tally, depth: int) -> None:
    """An `If` adds its larger branch; a `Loop` or `Scan` its body times the trip count (once where unknown)."""
    bodies = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            inner = _Tally()
            _count(attr.g, scope.inner(attr.g), inner, depth + 1)
            bodies.append(inner)
    if not bodies:
        return
    if node.op_type == "If":
        tally.add(max(bodies, key=lambda b: sum(b.macs.values()) + sum(b.others.values())))
        return
    trips = _trips(node, scope)
    tally.untimed += trips is None
    tally.add(bodies[0], trips or 1)


def _trips(node: onnx.NodeProto, scope: _Scope) -> int | None:
    """A Loop's trip count from its constant `M` input (None: computed, or absent), a Scan's from its first scan
    input's scan axis."""
    if node.op_type == "Loop":
        return scope.constants.get(node.input[0]) if node.input and node.input[0] else None
    n_scan = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
    if not n_scan:
        return None
    first = node.input[len(node.input) - n_scan]
    axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"), [0])
    shape = scope.dims.get(first)
    return shape[axes[0] % len(shape)] if shape else None


def _constants(g: onnx.GraphProto) -> dict[str, int]:
    """The graph's integer scalars given as initializers or Constant nodes (a Loop's trip count)."""
    found = {}
    tensors = [(t.name, t) for t in g.initializer] + [
        (n.output[0], a.t) for n in g.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
    for name, tensor in tensors:
        if tensor.data_type in _INTEGER and math.prod(tensor.dims) == 1:
            found[name] = int(numpy_helper.to_array(tensor).reshape(-1)[0])
    return found


def _weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the model's weights as stored (an INT8 weight 1 byte, an FP16 one 2): what an engine reads."""
    sizes = {TensorProto.INT8: 1, TensorProto.UINT8: 1, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2,
             TensorProto.FLOAT: 4, TensorProto.INT32: 4, TensorProto.INT64: 8, TensorProto.DOUBLE: 8}
    return sum(math.prod(t.dims) * sizes.get(t.data_type, 4) for t in model.graph.initializer)


def _fixed(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """A copy of the model with its inputs' dims set: `shapes`', else 1 for a dynamic dim."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.graph.value_info[:]
    for vi in copy.graph.input:
        given = shapes.get(vi.name)
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            value = given[i] if given and i < len(given) else (d.dim_value if d.HasField("dim_value") else 1)
            d.Clear()
            d.dim_value = int(value)
    return copy


def _inferred(model: onnx.ModelProto) -> tuple[onnx.GraphProto, dict[str, int], dict[str, list[int] | None]]:
    """The graph with its shapes inferred, and its tensors' types and dims (`_tensors`): by ONNX's inference; where
    it leaves a multiply-accumulating op unsized (a Range, a Slice of computed bounds), by ONNX Runtime's symbolic
    inference, which computes them from the weights (and costs SymPy's import: it is not the first choice)."""
    g = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    types, dims = _tensors(g)
    if all(_macs(n, dims) is not None for n in g.node if n.op_type in MAC_OPS):
        return g, types, dims
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            symbolic = SymbolicShapeInference.infer_shapes(model, auto_merge=True).graph
    except Exception:  # noqa: BLE001 - any failure of the second inference leaves the first's
        return g, types, dims
    return symbolic, *_tensors(symbolic)


def _tensors(g: onnx.GraphProto) -> tuple[dict[str, int], dict[str, list[int] | None]]:
    types: dict[str, int] = {}
    dims: dict[str, list[int] | None] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        types[vi.name] = t.elem_type
        dims[vi.name] = _static(vi) if t.HasField("shape") else None
    for init in g.initializer:
        types[init.name] = init.data_type
        dims[init.name] = list(init.dims)
    return types, dims


def _static(vi: onnx.ValueInfoProto) -> list[int] | None:
    out = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in vi.type.tensor_type.shape.dim]
    return None if -1 in out else out


def _size(shape: list[int] | None) -> int:
    return math.prod(shape) if shape is not None else 0


# ops whose first two operands are not inputs 0 and 1
_OPERANDS = {"QLinearConv": (0, 3), "QLinearMatMul": (0, 3)}
_CONV = {"Conv", "ConvInteger", "QLinearConv"}
_MATMUL = {"MatMul", "MatMulInteger", "QLinearMatMul", "MatMulIntegerToFloat"}


def _macs(node: onnx.NodeProto, dims: dict[str, list[int] | None]) -> int | None:
    """The node's multiply-accumulates, or None where a shape it needs is unknown."""
    ins = [dims.get(i) if i else None for i in node.input]
    out = dims.get(node.output[0]) if node.output else None
    first, second = _OPERANDS.get(node.op_type, (0, 1))
    a, b = (ins + [None] * 4)[first], (ins + [None] * 4)[second]
    op = node.op_type
    if op in _CONV and out and b:
        return math.prod(out) * math.prod(b[1:])
    if op == "ConvTranspose" and a and b:
        return math.prod(a) * math.prod(b[1:])
    if op == "Gemm" and out and a:
        trans_a = any(x.name == "transA" and x.i for x in node.attribute)
        return math.prod(out) * (a[0] if trans_a else a[-1])
    if op in _MATMUL and out and a:
        return math.prod(out) * a[-1]
    if op in ("Attention", "MultiHeadAttention") and a:  # Q·Kᵀ and the weights times V
        key = ins[1] if len(ins) > 1 and ins[1] else a
        return 2 * math.prod(a) * (key[-2] if len(key) >= 3 else a[-2])
    if op in _GATES:
        return _recurrent_macs(ins)
    if op == "Einsum":
        return _einsum_macs(node, ins)
    return None


def _recurrent_macs(ins: list[list[int] | None]) -> int | None:
    """LSTM, GRU, RNN: every step of every sequence multiplies its input by W and its hidden state by R (W and R
    hold every direction's and gate's rows), whichever of X's first two axes is time."""
    x, w, r = (ins + [None] * 3)[:3]
    if not (x and w and r):
        return None
    return math.prod(x[:2]) * (math.prod(w) + math.prod(r))


def _einsum_macs(node: onnx.NodeProto, ins: list[list[int] | None]) -> int | None:
    """The product of the sizes of every index the equation names (each output element sums over the others)."""
    equation = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
    operands = equation.replace(" ", "").split("->")[0].split(",")
    sizes: dict[str, int] = {}
    for term, shape in zip(operands, ins):
        if shape is None:
            return None
        letters = term.replace("...", "")
        extra = len(shape) - len(letters)  # the dims "..." stands for
        at = term.find("...")
        named = list(letters[:at]) + [f"...{i}" for i in range(extra)] + list(letters[at:]) if at >= 0 \
            else list(letters)
        sizes.update(zip(named, shape))
    return math.prod(sizes.values()) if sizes and len(operands) == len(ins) else None


def _dequantized_int8(tensor: str, producer: dict[str, onnx.NodeProto], types: dict[str, int]) -> bool:
    node = producer.get(tensor)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producer.get(node.input[0])
    return node is not None and node.op_type == "DequantizeLinear" and types.get(node.input[0]) in (
        TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4)


def _float_type(node: onnx.NodeProto, types: dict[str, int]) -> str:
    kinds = [types.get(i) for i in node.input if i and types.get(i) in _FLOAT]
    return "fp16" if kinds and all(k in _HALF for k in kinds[:2]) else "fp32"


def _mac_precision(node: onnx.NodeProto, producer: dict[str, onnx.NodeProto], types: dict[str, int]) -> str:
    if node.op_type in _INTEGER_MACS or (
            len(node.input) >= 2 and all(_dequantized_int8(i, producer, types) for i in node.input[:2])):
        return "int8"
    return _float_type(node, types)


def _other_precision(node: onnx.NodeProto, producer: dict[str, onnx.NodeProto], types: dict[str, int]) -> str:
    """INT8 where every float input is dequantized INT8 (TensorRT fuses the pooling or element-wise op between
    Q/DQ pairs), else its inputs' float type."""
    floats = [i for i in node.input if i and types.get(i) in _FLOAT]
    if floats and all(_dequantized_int8(i, producer, types) for i in floats):
        return "int8"
    return _float_type(node, types)


def _shares(counts: dict[str, int]) -> Shares:
    total = sum(counts.values())
    return Shares(**{k: v / total for k, v in counts.items()}) if total else Shares()
