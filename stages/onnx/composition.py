"""How much of a model variant's compute runs at which precision, read from the graph TensorRT builds.

TensorRT 10/11 and TensorRT-RTX build Q/DQ and FP16 ONNX strongly typed: a Conv or MatMul runs in INT8 when both its
inputs are dequantized INT8 (the Q/DQ pair fuses into it), else in the type of its inputs. So an "INT8" variant whose
unquantized remainder is FP32 does that remainder in FP32 on the GPU, and an "FP16" variant with large FP32 islands
is in part an FP32 engine; the variant's name says neither. The multiply-accumulates (Conv, ConvTranspose, Gemm,
MatMul, attention) are counted at given input shapes; every other op by the elements it writes.
"""
from __future__ import annotations

import contextlib
import io
import math

import onnx
from onnx import TensorProto
from pydantic import BaseModel

from trtflow import markdown as md
from trtflow.precisions import Precision

MAC_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "MatMulInteger", "Attention", "MultiHeadAttention")
# an op that only moves or renames data, between a DequantizeLinear and the op that reads it (a weight's Transpose)
_PASS_THROUGH = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"}
_FREE = {"QuantizeLinear", "DequantizeLinear", "Cast", "Shape", "Constant", "Identity", "Reshape", "Squeeze",
         "Unsqueeze", "Flatten"}  # fused or free in TensorRT: not counted among the other ops
_HALF = {TensorProto.FLOAT16, TensorProto.BFLOAT16}
_FLOAT = _HALF | {TensorProto.FLOAT, TensorProto.DOUBLE}
MOSTLY_FP32 = 0.5  # a variant named FP16 or INT8 doing more than this share of its MACs in FP32 is warned about


class Shares(BaseModel):
    """Fractions of a total (summing to 1 where the total is not 0)."""
    int8: float = 0.0
    fp16: float = 0.0
    fp32: float = 0.0

    def text(self) -> str:
        parts = [(f"{getattr(self, p):.0%}", p.upper()) for p in ("int8", "fp16", "fp32") if getattr(self, p) > 0]
        return " · ".join(f"{v} {p}" for v, p in parts) or "none"


class Composition(BaseModel):
    """A variant's compute by precision: its multiply-accumulates and its other ops' output elements."""
    macs: int  # multiply-accumulates of one inference at `shapes`
    mac_share: Shares
    other_share: Shares  # the other ops (activations, pooling, resize, concat, ...), by the elements they write
    shapes: dict[str, list[int]]  # the input shapes counted at
    unsized: int = 0  # MAC ops whose shapes shape inference could not tell (counted as 0 MACs)

    def line(self) -> str:
        """One line: "MACs 92% INT8 · 8% FP32 (4.1 GMAC); other ops 100% FP32"."""
        unsized = f", {self.unsized} unsized" if self.unsized else ""
        return (f"MACs {self.mac_share.text()} ({_si(self.macs)}MAC{unsized}); other ops "
                f"{self.other_share.text()}")

    def markdown(self) -> str:
        shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in self.shapes.items())
        return (f"**compute by precision** (as TensorRT builds the graph, strongly typed; at {md.text(shapes)}): "
                f"{md.text(self.line())}")

    def mostly_fp32(self, named: Precision) -> str | None:
        """The warning when a variant named FP16 or INT8 does most of its MACs in FP32, else None."""
        if named == "fp32" or self.macs == 0 or self.mac_share.fp32 <= MOSTLY_FP32:
            return None
        return (f"the {named.upper()} variant does {self.mac_share.fp32:.0%} of its multiply-accumulates in FP32 "
                f"(more than {MOSTLY_FP32:.0%}): on TensorRT it runs mostly as an FP32 engine, and may be no faster "
                f"than one")


def composition(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> Composition:
    """`model`'s composition with its inputs at `shapes` (name -> dims; inputs not named keep their static dims,
    a dynamic one counted as 1)."""
    g, types, dims = _inferred(_fixed(model, shapes))
    producer = {o: n for n in g.node for o in n.output}
    macs, others = {"int8": 0, "fp16": 0, "fp32": 0}, {"int8": 0, "fp16": 0, "fp32": 0}
    unsized = 0
    for node in g.node:
        if node.op_type in MAC_OPS:
            count = _macs(node, dims)
            unsized += count is None
            macs[_mac_precision(node, producer, types)] += count or 0
        elif node.op_type not in _FREE and node.output and types.get(node.output[0]) in _FLOAT:
            size = _size(dims.get(node.output[0]))
            if size:
                others[_other_precision(node, producer, types)] += size
    return Composition(macs=sum(macs.values()), mac_share=_shares(macs), other_share=_shares(others),
                       shapes={vi.name: _static(vi) for vi in g.input if vi.name in shapes or _static(vi)},
                       unsized=unsized)


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


def _macs(node: onnx.NodeProto, dims: dict[str, list[int] | None]) -> int | None:
    """The node's multiply-accumulates, or None where a shape it needs is unknown."""
    ins = [dims.get(i) if i else None for i in node.input]
    out = dims.get(node.output[0])
    a, b = (ins + [None, None])[:2]
    if node.op_type == "Conv" and out and b:
        return math.prod(out) * math.prod(b[1:])
    if node.op_type == "ConvTranspose" and a and b:
        return math.prod(a) * math.prod(b[1:])
    if node.op_type == "Gemm" and out and a:
        trans_a = any(x.name == "transA" and x.i for x in node.attribute)
        return math.prod(out) * (a[0] if trans_a else a[-1])
    if node.op_type in ("MatMul", "MatMulInteger") and out and a:
        return math.prod(out) * a[-1]
    if node.op_type in ("Attention", "MultiHeadAttention") and a:  # Q·Kᵀ and the weights times V
        key = ins[1] if len(ins) > 1 and ins[1] else a
        return 2 * math.prod(a) * (key[-2] if len(key) >= 3 else a[-2])
    return None


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
    if node.op_type == "MatMulInteger" or (
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


def _si(n: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} "
