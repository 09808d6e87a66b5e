"""A faithful CPU simulation of an FP16 variant: the FP32 graph with every FP16 tensor rounded to FP16.

ONNX Runtime's CPU provider has few FP16 kernels: it runs an FP16 model by casting whole regions back to FP32 and
dropping the rounding between nodes, so an activation that overflows FP16 (> 65504) does not overflow there.
Here each output of a node that the variant runs in FP16 goes through Cast(FLOAT16) -> Cast(FLOAT), which ONNX
Runtime keeps (cast-chain elimination is off by default), and its FP32 weights are rounded to FP16: storage
precision and overflow are simulated per node; accumulation inside a kernel stays FP32, as TensorRT's does.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtflow import phases

FLOAT = TensorProto.FLOAT


@phases.timed("FP16 emulation graphs")
def emulate(model: onnx.ModelProto, half: set[str], keep_io_types: bool) -> onnx.ModelProto:
    """`half`: the nodes the FP16 variant runs in FP16 (`fp16.plan(...).half`), so both agree node by node. A
    DequantizeLinear read only by ops TensorRT fuses it into (Conv, Gemm, MatMul: the INT8 kernel takes the INT8
    values and the scale) has no FP16 output to round: its scale is rounded, its output is not."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)
    float_tensors = {vi.name for vi in infos if vi.type.tensor_type.elem_type == FLOAT}
    weights = {i.name for i in out.graph.initializer}
    # tensors known not to be float: a selecting op may read them (shapes, indices, conditions)
    not_float = {vi.name for vi in infos if vi.type.tensor_type.elem_type not in (FLOAT, 0)} | \
        {i.name for i in out.graph.initializer if i.data_type != FLOAT}
    _round_weights(out.graph, half)
    _round_constants(out.graph, half)
    nodes = [] if keep_io_types else _fp16_inputs(out.graph, float_tensors, weights)
    graph_inputs = [i.name for i in model.graph.input if i.name not in weights]
    entering = _entering(model.graph, out.graph, half, float_tensors, graph_inputs if keep_io_types else [])
    nodes += [c for t in graph_inputs if t in entering for c in _enter(t, entering[t])]
    fused = _fused_dequantizers(out.graph)
    # tensors holding FP16 values: what FP16 nodes read but no node writes (weights and constants rounded above,
    # FP32 tensors entering through their rounded copy, the variant's FP16 inputs) and not the caller's inputs as
    # they are (a tensor shape inference could not type is read without its rounded copy); an FP16 node's outputs
    # join as the node is reached (an FP32 node's or a fused DequantizeLinear's never do)
    in_fp16 = {t for n in out.graph.node if n.name in half for t in n.input} - set(graph_inputs) - \
        {t for n in out.graph.node for t in n.output}
    for node in out.graph.node:
        extra = []
        if node.name in half and node.name not in fused:
            in_fp16.update(node.output)  # the names its readers read, rounded below if they must be
            if not _stays_fp16(node, in_fp16, not_float):
                extra = _round_outputs(node, float_tensors)
        extra += [c for t in node.output if t in entering for c in _enter(t, entering[t])]
        nodes += [node, *extra]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


FUSING_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul"}


def _fused_dequantizers(g: onnx.GraphProto) -> set[str]:
    """The DequantizeLinear nodes every reader of which fuses it (FUSING_OPS)."""
    readers: dict[str, list[str]] = {}
    for n in g.node:
        for t in n.input:
            readers.setdefault(t, []).append(n.op_type)
    return {n.name for n in g.node if n.op_type == "DequantizeLinear"
            and readers.get(n.output[0]) and set(readers[n.output[0]]) <= FUSING_OPS}


def _round_weights(g: onnx.GraphProto, half: set[str]) -> None:
    """Weights stored as FP16 (rounded, in FP32) where an FP16 node reads them."""
    read_by_half = {t for n in g.node if n.name in half for t in n.input}
    for init in g.initializer:
        if init.data_type == FLOAT and init.name in read_by_half:
            rounded = np.clip(numpy_helper.to_array(init), -65504, 65504).astype(np.float16).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(rounded, init.name))


# ops whose float outputs are some of their float inputs' values (moved, selected, compared, sign changed): on FP16
# values they give FP16 values, so rounding their outputs again changes nothing and is not emulated
SELECTING_OPS = frozenset({
    "Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "GatherND", "Expand", "Tile", "DepthToSpace", "SpaceToDepth", "Relu", "MaxPool",
    "GlobalMaxPool", "ReduceMax", "ReduceMin", "Max", "Min", "Clip", "Where", "TopK", "Neg", "Abs", "Constant"})


def _stays_fp16(node: onnx.NodeProto, in_fp16: set[str], not_float: set[str]) -> bool:
    """Whether an FP16 node's float outputs hold FP16 values without rounding: a selecting op each input of which
    holds FP16 values or is known not to be float, and whose float attributes (Clip's bounds before opset 11) are
    FP16 values (a Constant's was rounded)."""
    if node.op_type not in SELECTING_OPS or any(a.name == "sparse_value" for a in node.attribute):
        return False
    floats = [a.f for a in node.attribute if a.type == onnx.AttributeProto.FLOAT]
    floats += [f for a in node.attribute if a.type == onnx.AttributeProto.FLOATS for f in a.floats]
    return all(map(_is_fp16, floats)) and all(t in in_fp16 or t in not_float for t in node.input if t)


def _is_fp16(value: float) -> bool:
    return bool(np.float32(value) == np.float32(value).astype(np.float16).astype(np.float32))


def _round_constants(g: onnx.GraphProto, half: set[str]) -> None:
    """An FP16 Constant node's float value stored as FP16 (rounded, in FP32), as its variant stores it; a value
    given another way than as a tensor is left to the Casts."""
    for node in g.node:
        if node.op_type != "Constant" or node.name not in half:
            continue
        for a in node.attribute:
            if a.name == "value" and a.t.data_type == FLOAT:
                with np.errstate(over="ignore"):  # past 65504 it is inf, as the Cast would make it
                    rounded = numpy_helper.to_array(a.t).astype(np.float16).astype(np.float32)
                a.t.CopyFrom(numpy_helper.from_array(rounded, a.t.name))


def _fp16_inputs(g: onnx.GraphProto, float_tensors: set[str], weights: set[str]) -> list[onnx.NodeProto]:
    """The variant's float inputs are FP16 themselves: each is read through a round trip to FP16 (the Casts
    returned) under a new name."""
    casts = []
    for inp in g.input:
        if inp.name in float_tensors and inp.name not in weights:
            renamed = f"{inp.name}__in"
            for n in g.node:
                n.input[:] = [renamed if t == inp.name else t for t in n.input]
            casts.append(helper.make_node("Cast", [inp.name], [f"{renamed}__fp16"], to=TensorProto.FLOAT16))
            casts.append(helper.make_node("Cast", [f"{renamed}__fp16"], [renamed], to=FLOAT))
    return casts


def _entering(original: onnx.GraphProto, g: onnx.GraphProto, half: set[str], float_tensors: set[str],
              fp32_inputs: list[str]) -> dict[str, str]:
    """A float tensor an FP32 node (or an FP32 graph input) produces and an FP16 node reads crosses a Cast to FP16
    in the variant: FP16 readers of `g` are pointed at its rounded copy, tensor -> the copy's name (a value past
    65504 becomes inf there, as in the variant)."""
    producer = {t: n.name for n in original.node for t in n.output}
    entering: dict[str, str] = {}
    for node in g.node:
        if node.name not in half:
            continue
        for i, t in enumerate(node.input):
            from_fp32 = producer[t] not in half if t in producer else t in fp32_inputs
            if t in float_tensors and from_fp32:
                node.input[i] = entering.setdefault(t, f"{t}__entering_fp16")
    return entering


def _enter(t: str, rounded: str) -> list[onnx.NodeProto]:
    return [helper.make_node("Cast", [t], [f"{t}__entering_h"], to=TensorProto.FLOAT16, name=f"{t}__enter_fp16"),
            helper.make_node("Cast", [f"{t}__entering_h"], [rounded], to=FLOAT, name=f"{t}__enter_fp32")]


def _round_outputs(node: onnx.NodeProto, float_tensors: set[str]) -> list[onnx.NodeProto]:
    """An FP16 node's float outputs through Cast(FLOAT16) -> Cast(FLOAT): the node writes `<t>__fp32`, the Casts
    (returned) give `t` its FP16 value."""
    casts = []
    for i, t in enumerate(node.output):
        if t in float_tensors:
            node.output[i] = raw = f"{t}__fp32"
            casts += [helper.make_node("Cast", [raw], [f"{t}__fp16"], to=TensorProto.FLOAT16, name=f"{t}__to_fp16"),
                      helper.make_node("Cast", [f"{t}__fp16"], [t], to=FLOAT, name=f"{t}__to_fp32")]
    return casts


def keeps_io_types(variant: onnx.ModelProto) -> bool:
    """Whether an FP16 variant kept FP32 inputs (the precision stage's `keep_io_types`)."""
    return all(i.type.tensor_type.elem_type != TensorProto.FLOAT16 for i in variant.graph.input)


def half_nodes(variant: onnx.ModelProto, reference: onnx.ModelProto) -> set[str] | None:
    """The reference's nodes that an FP16 variant runs in FP16 (a float output of the same-named node is FLOAT16
    there); None when the variant was not converted from this reference (its nodes are not the reference's)."""
    ref_names = {n.name for n in reference.graph.node}
    var_nodes = [n for n in variant.graph.node if n.name in ref_names]
    if not ref_names or len(var_nodes) < 0.9 * len(ref_names):
        return None
    inferred = onnx.shape_inference.infer_shapes(variant)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(inferred.graph.value_info)
             + list(inferred.graph.output) + list(inferred.graph.input)}
    return {n.name for n in var_nodes if any(types.get(t) == TensorProto.FLOAT16 for t in n.output)}


def widened(variant: onnx.ModelProto) -> tuple[onnx.ModelProto, set[str]]:
    """A variant holding FP16 (an INT8 model whose unquantized remainder is FP16, trtflow's or ModelOpt's) back in
    FP32, and the nodes that run in FP16 in it (a float output is FLOAT16): `emulate(widened, half,
    keeps_io_types(variant))` simulates the variant. FP16 weights, constants, Cast targets and graph inputs and
    outputs become FP32; nodes without a name are given one (`__node<i>`), as the emulation goes by name."""
    inferred = onnx.shape_inference.infer_shapes(variant)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(inferred.graph.value_info)
             + list(inferred.graph.output) + list(inferred.graph.input)}
    types.update({i.name: i.data_type for i in variant.graph.initializer})
    out = onnx.ModelProto()
    out.CopyFrom(variant)
    g = out.graph
    half = set()
    for i, node in enumerate(g.node):
        node.name = node.name or f"__node{i}"
        if any(types.get(t) == TensorProto.FLOAT16 for t in node.output):
            half.add(node.name)
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT16:
                a.i = FLOAT
            elif a.name == "value" and a.t.data_type == TensorProto.FLOAT16:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float32), a.t.name))
    for init in g.initializer:
        if init.data_type == TensorProto.FLOAT16:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
            vi.type.tensor_type.elem_type = FLOAT
    del g.value_info[:]
    return out, half


def emulated(variant: onnx.ModelProto) -> onnx.ModelProto:
    """The simulation of a variant holding FP16 that was not converted from a reference at hand (`widened`)."""
    wide, half = widened(variant)
    return emulate(wide, half, keeps_io_types(variant))


def holds_fp16(model: onnx.ModelProto) -> bool:
    """Whether a model stores FP16 weights or scales (an FP16 variant, or an INT8 one with an FP16 remainder)."""
    return any(i.data_type == TensorProto.FLOAT16 for i in model.graph.initializer)
