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

FLOAT = TensorProto.FLOAT


def emulate(model: onnx.ModelProto, half: set[str], keep_io_types: bool) -> onnx.ModelProto:
    """`half`: the nodes the FP16 variant runs in FP16 (`fp16.plan(...).half`), so both agree node by node."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inferred = onnx.shape_inference.infer_shapes(model)
    float_tensors = {vi.name for vi in list(inferred.graph.value_info) + list(inferred.graph.input)
                     + list(inferred.graph.output) if vi.type.tensor_type.elem_type == FLOAT}
    inits = {i.name: i for i in out.graph.initializer}
    consumers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for t in n.input:
            consumers.setdefault(t, []).append(n.name)

    for name, init in inits.items():  # weights stored as FP16 where an FP16 node reads them
        if init.data_type == FLOAT and any(c in half for c in consumers.get(name, [])):
            rounded = np.clip(numpy_helper.to_array(init), -65504, 65504).astype(np.float16).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(rounded, name))

    nodes: list[onnx.NodeProto] = []

    def round_trip(tensor: str) -> tuple[str, list[onnx.NodeProto]]:
        raw = f"{tensor}__fp32"
        return raw, [helper.make_node("Cast", [raw], [f"{tensor}__fp16"], to=TensorProto.FLOAT16,
                                      name=f"{tensor}__to_fp16"),
                     helper.make_node("Cast", [f"{tensor}__fp16"], [tensor], to=FLOAT, name=f"{tensor}__to_fp32")]

    if not keep_io_types:  # the variant's inputs are FP16 themselves
        for inp in out.graph.input:
            if inp.name in float_tensors and inp.name not in inits:
                renamed = f"{inp.name}__in"
                for n in out.graph.node:
                    n.input[:] = [renamed if t == inp.name else t for t in n.input]
                nodes.append(helper.make_node("Cast", [inp.name], [f"{renamed}__fp16"], to=TensorProto.FLOAT16))
                nodes.append(helper.make_node("Cast", [f"{renamed}__fp16"], [renamed], to=FLOAT))
    # a float tensor an FP32 node produces and an FP16 node reads crosses a Cast to FP16 in the variant: round
    # it where it enters (a value past 65504 becomes inf there, as in the variant)
    producer = {t: n.name for n in model.graph.node for t in n.output}
    graph_inputs = [i.name for i in model.graph.input if i.name not in inits]
    entering: dict[str, str] = {}
    for node in out.graph.node:
        if node.name in half:
            for i, t in enumerate(node.input):
                from_fp32 = producer[t] not in half if t in producer else keep_io_types and t in graph_inputs
                if t in float_tensors and from_fp32:
                    node.input[i] = entering.setdefault(t, f"{t}__entering_fp16")

    def enter(t: str) -> list[onnx.NodeProto]:
        return [helper.make_node("Cast", [t], [f"{t}__entering_h"], to=TensorProto.FLOAT16, name=f"{t}__enter_fp16"),
                helper.make_node("Cast", [f"{t}__entering_h"], [entering[t]], to=FLOAT, name=f"{t}__enter_fp32")]

    nodes += [c for t in graph_inputs if t in entering for c in enter(t)]
    for node in out.graph.node:
        extra: list[onnx.NodeProto] = []
        if node.name in half:
            for i, t in enumerate(node.output):
                if t in float_tensors:
                    raw, casts = round_trip(t)
                    node.output[i] = raw
                    extra += casts
        for t in node.output:
            if t in entering:
                extra += enter(t)
        nodes.append(node)
        nodes += extra
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


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
