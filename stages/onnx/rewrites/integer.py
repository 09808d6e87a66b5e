"""ONNX Runtime's dynamic quantization (what `onnxruntime.quantization.quantize_dynamic` emits): DynamicQuantizeLinear
in front of ConvInteger / MatMulInteger, whose int32 result the model scales back to float. The parser has no
importer for any of the three; each is exact arithmetic on small integers, which float32 holds exactly, so each
becomes float32 ops with the same results, bit for bit (within the bound below).

DynamicQuantizeLinear(x) -> (y uint8, y_scale, y_zero_point uint8), as ONNX Runtime computes it: low = min(0,
ReduceMin(x)), high = max(0, ReduceMax(x)), scale = (high - low) / 255, except 1 where high == low (x all zeros: the
spec's formula divides by 0 there; ONNX Runtime takes scale 1 and zero point 0, and so does this rule), zero point =
Round(Clip(-low / scale, 0, 255)), y = Clip(Round(x / scale) + zero point, 0, 255), each a division as ONNX Runtime
divides (no multiplication by a reciprocal), Round half to even as its conversion rounds.

ConvInteger(x, w, x_zero_point?, w_zero_point?) -> int32: Conv in float32 of (x - x_zero_point) and (w -
w_zero_point), with the node's attributes (padding adds zeros to x - x_zero_point, as ONNX Runtime pads x with its
zero point), then Round (from opset 11) and Cast to int32. A 1-D w_zero_point is per output channel (reshaped to [M,
1, ...]). MatMulInteger(a, b, a_zero_point?, b_zero_point?) -> int32 the same with MatMul; a 1-D a_zero_point of a
2-D a is per row ([M, 1]), b's per column broadcasts as it is. A constant operand and its constant zero point are
folded into one float32 constant. Round before the Cast changes nothing where the sum is exact; it keeps a kernel
that sums less exactly (TensorRT may pick Winograd for a 3x3 Conv) from truncating 41.9999 to 41.

Exactness: every centred operand is an integer of magnitude <= 255 and every product <= 255 * 255, and float32 holds
every integer up to 2^24, so sums whose terms add up in magnitude to at most 2^24 are exact in any order. The rules
bound that sum per output: 255 (or what a constant zero point leaves) times the largest sum of |w - w_zero_point|
over one output channel (ConvInteger) or column of b (MatMulInteger) where the weights are constant, else K * 255 *
255 with K the reduction length from the static shapes; and refuse, saying so, where the bound exceeds 2^24 or K is
unknown. Dynamically quantized weights are constants, and the bound is then far below the worst case K * 255 * 255:
in ddddocr's CRNN (K up to 2304, K * 255 * 255 = 1.5e8) the largest is 3.8e6, 0.23 of 2^24. ONNX Runtime itself is
not always exact: its uint8 x int8 kernel on an x86 CPU without VNNI adds two raw products at a time into int16,
saturating (why quantize_dynamic has reduce_range); there the rewrite gives the spec's exact sums and prepare's check
measures how far ONNX Runtime's are off.

What the parser takes (TensorRT-RTX 1.7, tried with tiny models through the parser and a trial build): a Cast to
UINT8 into a network output, and a Cast from UINT8 of a network input or an initializer; INT32 everywhere, INT8 in
between nodes; but no UINT8 tensor between two nodes ("legalUINT8: TensorRT does not support UINT8 types for
intermediate tensors"). DynamicQuantizeLinear's y and zero point are uint8, and a rule's outputs keep their declared
types, so a DynamicQuantizeLinear whose outputs a ConvInteger reads cannot be rewritten on its own (its replacement
would end in a Cast to uint8 between nodes) nor the ConvInteger (its would start with one). So the
DynamicQuantizeLinear rule rewrites, with the node, every ConvInteger / MatMulInteger reading its y or zero point,
and every other DynamicQuantizeLinear those read (a MatMulInteger of two activations), handing them the quantized
values in float32: no uint8 tensor is left but those the graph outputs (a Cast to uint8 into the output). All the
nodes it adds carry its node's name, so prepare's parser check covers them; the integer nodes it took are gone when
prepare comes to them. The ConvInteger and MatMulInteger rules alone take integer inputs made by no node (network
inputs, constants) and refuse, naming it, a uint8 input some node makes.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.nodes import attr, dtype_of, is_read, present, rank
from trtflow.stages.onnx.rewrites.rule import Builder, OpKey, Rewrite, constant_value, static_shape, take_over_outputs

FLOAT, UINT8, INT32 = 1, 2, 6  # onnx.TensorProto's
F32 = np.float32
EXACT = 2 ** 24  # float32 holds every integer up to this: sums of integers that stay within it are exact
RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}  # the integer ops' operand types
ROUND_OPSET = 11
DQL_RULE = "dynamicquantizelinear-float"
DQL, CONV, MATMUL = OpKey("DynamicQuantizeLinear"), OpKey("ConvInteger"), OpKey("MatMulInteger")

Floats = dict[str, gs.Tensor]  # a quantized tensor's name -> the float32 tensor of its values (a DQL's rewrite)


# --- ConvInteger and MatMulInteger in float32 ---------------------------------------------------------------------

def _conv_rank(node: gs.Node) -> int | None:
    n = rank(node.inputs[1])
    kernel = attr(node, "kernel_shape")
    return n if n is not None else (len(kernel) + 2 if kernel else None)


def _zero_point_shape(node: gs.Node, i: int) -> list[int] | None:
    """What a 1-D zero point of operand `i` is reshaped to (per output channel of w, per row of a 2-D a); None where
    it broadcasts as it is."""
    zp = present(node, i + 2)
    if zp is None or rank(zp) != 1:
        return None
    if CONV.matches(node):
        n = _conv_rank(node)
        return None if i == 0 or n is None else [-1] + [1] * (n - 1)
    return [-1, 1] if i == 0 and rank(node.inputs[0]) == 2 else None


def _zero_point_refusal(node: gs.Node) -> str | None:
    if CONV.matches(node):
        zp = present(node, 3)
        if zp is not None and rank(zp) == 1 and _conv_rank(node) is None:
            return "a per-channel w_zero_point needs w's rank (or kernel_shape)"
        return None
    zp = present(node, 2)
    if zp is not None and rank(zp) == 1 and rank(node.inputs[0]) is None:
        return "a 1-D a_zero_point needs a's rank (per row of a 2-D a)"
    return None


def _centred_constant(node: gs.Node, i: int) -> np.ndarray | None:
    """Operand `i` minus its zero point (float64) where both are constants; None otherwise."""
    value = constant_value(node.inputs[i])
    zp = present(node, i + 2)
    zero = np.zeros((), np.float64) if zp is None else constant_value(zp)
    if value is None or zero is None:
        return None
    shape = _zero_point_shape(node, i)
    zero = zero.astype(np.float64) if shape is None else zero.astype(np.float64).reshape(shape)
    return value.astype(np.float64) - zero


def _magnitude(node: gs.Node, i: int) -> float:
    """The largest |operand `i` - its zero point| the operand's type leaves (a constant zero point's values known)."""
    low, high = RANGES[dtype_of(node.inputs[i])]
    zp = present(node, i + 2)
    zero = np.zeros(()) if zp is None else constant_value(zp)
    if zero is None:
        return float(high - low)
    zero = zero.astype(np.float64)
    return float(max(high - zero.min(), zero.max() - low))


def _largest_output_sum(node: gs.Node, i: int, centred: np.ndarray) -> float:
    """max over outputs of the sum of |centred| that one output's products take from constant operand `i`."""
    magnitude = np.abs(centred)
    if CONV.matches(node):
        return float(magnitude.reshape(magnitude.shape[0], -1).sum(axis=1).max()) if magnitude.ndim > 1 \
            else float(magnitude.sum())
    if magnitude.ndim < 2:
        return float(magnitude.sum())
    return float(magnitude.sum(axis=-2 if i == 1 else -1).max())


def _depth(node: gs.Node) -> int | None:
    """The reduction length K (the products summed per output) from static shapes; None where unknown."""
    if CONV.matches(node):
        w = static_shape(node.inputs[1])
        return None if w is None else math.prod(w[1:])
    a, b = static_shape(node.inputs[0]), static_shape(node.inputs[1])
    if a:
        return a[-1]
    return None if not b else b[-2] if len(b) > 1 else b[0]


def sum_bound(node: gs.Node) -> float | None:
    """A bound on the magnitude of every partial sum of the node's products (every output, any order); None where
    it needs a static shape that is not."""
    for i in ((1,) if CONV.matches(node) else (1, 0)):
        centred = _centred_constant(node, i)
        if centred is not None:
            return _largest_output_sum(node, i, centred) * _magnitude(node, 1 - i)
    k = _depth(node)
    return None if k is None else k * _magnitude(node, 0) * _magnitude(node, 1)


def _made_by(tensor: gs.Tensor) -> gs.Node | None:
    """The node making `tensor` inside the network (a Constant node's output counts as a constant)."""
    producer = tensor.inputs[0] if tensor.inputs else None
    return None if producer is None or constant_value(tensor) is not None else producer


def _uint8_refusal(node: gs.Node, inside: set[str]) -> str | None:
    """Why a uint8 input some node makes (and no rewrite of this one hands over in float) stops the rule."""
    for tensor in node.inputs:
        producer = _made_by(tensor) if tensor.name and tensor.name not in inside else None
        if producer is not None and dtype_of(tensor) == np.dtype(np.uint8):
            also = f" (rule {DQL_RULE} rewrites both)" if DQL.matches(producer) else ""
            return (f"its input '{tensor.name}' is uint8, made by {producer.op} '{producer.name}': TensorRT takes "
                    f"uint8 only at the network's inputs and outputs{also}")
    return None


def integer_refusal(node: gs.Node, inside: set[str]) -> str | None:
    """Why ConvInteger / MatMulInteger `node` is not rewritten (None: it is); `inside`: the uint8 tensors a
    DynamicQuantizeLinear rewrite hands over in float32."""
    for i, what in enumerate(("first", "second")):
        if dtype_of(node.inputs[i]) not in RANGES:
            return f"needs its {what} input's element type, uint8 or int8 (it is {dtype_of(node.inputs[i])})"
    why = _uint8_refusal(node, inside) or _zero_point_refusal(node)
    if why is not None:
        return why
    bound = sum_bound(node)
    if bound is None:
        return "needs the reduction length (w's or a's and b's static shapes) to bound the float32 sums"
    if bound > EXACT:
        return (f"its float32 sums could reach {bound:.4g} > 2^24, past which float32 does not hold every integer: "
                f"not exact")
    return None


def _float(b: Builder, tensor: gs.Tensor, floats: Floats, shape: list[int] | None = None) -> gs.Tensor:
    """`tensor` in float32 (reshaped to `shape`): the one a DQL rewrite hands over, a constant, or a Cast."""
    value = constant_value(tensor)
    if value is not None:
        value = value.astype(F32)
        return b.const(value if shape is None else value.reshape(shape), F32, "value")
    out = floats[tensor.name] if tensor.name in floats else b.op("Cast", [tensor], {"to": FLOAT}, dtype=F32)
    return out if shape is None else b.op("Reshape", [out, b.const(shape, np.int64, "shape")], dtype=F32)


def _centred(b: Builder, node: gs.Node, i: int, floats: Floats) -> gs.Tensor:
    """Operand `i` minus its zero point, in float32."""
    folded = _centred_constant(node, i)
    if folded is not None:
        return b.const(folded, F32, "centred")
    x = _float(b, node.inputs[i], floats)
    zp = present(node, i + 2)
    if zp is None:
        return x
    return b.op("Sub", [x, _float(b, zp, floats, _zero_point_shape(node, i))], dtype=F32)


def integer_as_float(b: Builder, node: gs.Node, floats: Floats) -> gs.Variable:
    """ConvInteger / MatMulInteger `node`'s int32 result, computed in float32 (see the module)."""
    a, w = _centred(b, node, 0, floats), _centred(b, node, 1, floats)
    if CONV.matches(node):
        out = b.op("Conv", [a, w], dict(node.attrs), dtype=F32)
    else:
        out = b.op("MatMul", [a, w], dtype=F32)
    if b.graph.opset >= ROUND_OPSET:
        out = b.op("Round", [out], dtype=F32)
    return b.op("Cast", [out], {"to": INT32}, dtype=np.int32)


class _IntegerAsFloat(Rewrite):
    """ConvInteger or MatMulInteger alone (its uint8 input not made by another node): `integer_as_float`."""

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        return integer_refusal(node, set())

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        b = Builder(graph, node)
        take_over_outputs(node, [integer_as_float(b, node, {})], b)


class ConvIntegerAsConv(_IntegerAsFloat):
    name = "convinteger-conv"
    op = CONV
    summary = ("Conv in float32 of x - x_zero_point and w - w_zero_point, Round, Cast to int32: exact (refused "
               "where the sums could pass 2^24)")


class MatMulIntegerAsMatMul(_IntegerAsFloat):
    name = "matmulinteger-matmul"
    op = MATMUL
    summary = ("MatMul in float32 of a - a_zero_point and b - b_zero_point, Round, Cast to int32: exact (refused "
               "where the sums could pass 2^24)")


# --- DynamicQuantizeLinear ----------------------------------------------------------------------------------------

def _quantized_outputs(node: gs.Node) -> list[gs.Tensor]:
    """A DynamicQuantizeLinear's uint8 outputs: y and y_zero_point."""
    return [node.outputs[0], node.outputs[2]]


def component(node: gs.Node) -> tuple[list[gs.Node], list[gs.Node]] | str:
    """The DynamicQuantizeLinear nodes and the ConvInteger / MatMulInteger nodes reading them that are rewritten
    together, starting from `node`; or why not (a uint8 output some other op reads)."""
    quantizers, readers, todo = {id(node): node}, {}, [node]
    while todo:
        for reader in (r for out in _quantized_outputs(todo.pop()) for r in out.outputs):
            if not (CONV.matches(reader) or MATMUL.matches(reader)):
                return (f"its uint8 output is read by {reader.op} '{reader.name}': TensorRT takes no uint8 tensor "
                        f"between nodes, and only ConvInteger and MatMulInteger readers are rewritten with it")
            readers[id(reader)] = reader
            for producer in (t.inputs[0] for t in reader.inputs if t.inputs):
                if DQL.matches(producer) and id(producer) not in quantizers:
                    quantizers[id(producer)] = producer
                    todo.append(producer)
    return list(quantizers.values()), list(readers.values())


def _quantize(b: Builder, node: gs.Node) -> tuple[gs.Variable, gs.Variable, gs.Variable]:
    """(y, y_scale, y_zero_point) of DynamicQuantizeLinear `node`, all float32 (see the module)."""
    x = node.inputs[0]
    zero, one, top = (b.const(v, F32, w) for v, w in ((0.0, "zero"), (1.0, "one"), (255.0, "qmax")))
    low = b.op("Min", [b.op("ReduceMin", [x], {"keepdims": 0}, dtype=F32), zero], dtype=F32)
    high = b.op("Max", [b.op("ReduceMax", [x], {"keepdims": 0}, dtype=F32), zero], dtype=F32)
    span = b.op("Sub", [high, low], dtype=F32)
    flat = b.op("Equal", [span, zero], dtype=np.bool_)
    scale = b.op("Where", [flat, one, b.op("Div", [span, top], dtype=F32)], dtype=F32)
    shift = b.op("Div", [b.op("Neg", [low], dtype=F32), scale], dtype=F32)
    zp = b.op("Round", [b.op("Clip", [shift, zero, top], dtype=F32)], dtype=F32)
    rounded = b.op("Round", [b.op("Div", [x, scale], dtype=F32)], dtype=F32)
    y = b.op("Clip", [b.op("Add", [rounded, zp], dtype=F32), zero, top], dtype=F32)
    return y, scale, zp


def _take_over_quantizer(b: Builder, node: gs.Node, produced: tuple[gs.Variable, ...]) -> None:
    """The node's outputs still read (its readers are rewritten by now: y and the zero point only by the graph's
    outputs) from `produced`, the uint8 ones through a Cast straight into the output; the node disconnected."""
    for out, new, quantized in zip(list(node.outputs), produced, (True, False, True)):
        if is_read(out, b.graph):
            b.op("Cast" if quantized else "Identity", [new], {"to": UINT8} if quantized else {}, outputs=[out])
    node.outputs.clear()
    node.inputs.clear()


class DynamicQuantizeLinearAsFloat(Rewrite):
    name = DQL_RULE
    op = DQL
    summary = ("min/max with 0, scale (1 where x is all 0, as ONNX Runtime), zero point, Round and Clip in float32; "
               "the ConvInteger / MatMulInteger reading it rewritten with it (no uint8 between nodes)")

    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        if len(node.outputs) < 3:
            return "needs its three outputs"
        found = component(node)
        if isinstance(found, str):
            return found
        quantizers, readers = found
        inside = {t.name for q in quantizers for t in _quantized_outputs(q)}
        for reader in readers:
            why = integer_refusal(reader, inside)
            if why is not None:
                return f"it feeds {reader.op} '{reader.name}', rewritten with it: {why}"
        return None

    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        quantizers, readers = component(node)
        b = Builder(graph, node)
        floats: Floats = {}
        made = []
        for q in quantizers:
            y, scale, zp = _quantize(b, q)
            floats[q.outputs[0].name], floats[q.outputs[2].name] = y, zp
            made.append((q, (y, scale, zp)))
        for reader in readers:
            take_over_outputs(reader, [integer_as_float(b, reader, floats)], b)
        for q, produced in made:
            _take_over_quantizer(b, q, produced)
