"""What a model is: opsets, ops per domain, inputs/outputs, dynamic dimensions; and sanitizing odd dims. The
records it gives (`Inventory`, `DynamicDim`, `RenamedDim`) are in `records.py`."""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

import onnx
from onnx import helper

from trtflow.errors import StageError
from trtflow.precisions import Precision
from trtflow.stages.onnx.records import DynamicDim, GraphTensor, Inventory, RenamedDim
from trtflow.text import did_you_mean


def opsets(model: onnx.ModelProto) -> dict[str, int]:
    return {(o.domain or "ai.onnx"): o.version for o in model.opset_import}


def default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _dims(vi: onnx.ValueInfoProto) -> list[Any] | None:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]


def tensor_info(vi: onnx.ValueInfoProto) -> GraphTensor:
    elem = vi.type.tensor_type.elem_type
    return GraphTensor(name=vi.name, dtype=helper.tensor_dtype_to_np_dtype(elem).name if elem else "unknown",
                       shape=_dims(vi))


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Real inputs: graph inputs that are not initializers (old exporters list weights as inputs too)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def inventory(model: onnx.ModelProto) -> Inventory:
    ops: dict[str, Counter] = {}
    for node in model.graph.node:
        ops.setdefault(node.domain or "ai.onnx", Counter())[node.op_type] += 1
    init_bytes = sum(_tensor_bytes(t) for t in model.graph.initializer)
    return Inventory(ir_version=model.ir_version, producer=f"{model.producer_name} {model.producer_version}".strip(),
                     opsets=opsets(model), nodes=len(model.graph.node),
                     ops={dom: dict(sorted(c.items())) for dom, c in sorted(ops.items())},
                     initializers=len(model.graph.initializer), initializer_bytes=init_bytes,
                     inputs=[tensor_info(i) for i in graph_inputs(model)],
                     outputs=[tensor_info(o) for o in model.graph.output])


def _tensor_bytes(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    try:
        return n * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError):
        return 0


def dynamic_dims(model: onnx.ModelProto) -> list[DynamicDim]:
    """Every input dimension without a fixed size: each needs a min/opt/max in the build's profiles."""
    found = []
    for vi in graph_inputs(model):
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if not d.HasField("dim_value") or d.dim_value <= 0:
                found.append(DynamicDim(input=vi.name, axis=axis, name=d.dim_param or None))
    return found


_GOOD_PARAM = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def sanitize_dims(model: onnx.ModelProto) -> list[RenamedDim]:
    """Give every anonymous or negative dimension of the graph's inputs and outputs a proper name.

    Exporters write batch as dim_value -1 or dim_param "?" (PaddlePaddle does both); TensorRT and ONNX Runtime
    read "?" as one shared symbol, which ties unrelated dimensions together. Returns what was renamed.
    """
    changes = []
    for vi in list(graph_inputs(model)) + list(model.graph.output):
        if not vi.type.tensor_type.HasField("shape"):
            continue
        base = re.sub(r"[^A-Za-z0-9_]", "_", vi.name)
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            negative = d.HasField("dim_value") and d.dim_value < 0
            odd_param = d.HasField("dim_param") and not _GOOD_PARAM.match(d.dim_param)
            if negative or odd_param:
                old = d.dim_value if negative else d.dim_param
                new = f"{base}_dim{axis}"
                d.Clear()
                d.dim_param = new
                changes.append(RenamedDim(tensor=vi.name, axis=axis, was=old, now=new))
    return changes


def rename_dims(model: onnx.ModelProto, changes: list[RenamedDim]) -> None:
    """Apply `sanitize_dims`' renames again (after onnxsim, which can write a graph's old dimension names back),
    wherever the dimension is still free."""
    tensors = {vi.name: vi for vi in list(graph_inputs(model)) + list(model.graph.output)}
    for c in changes:
        vi = tensors.get(c.tensor)
        dims = vi.type.tensor_type.shape.dim if vi is not None and vi.type.tensor_type.HasField("shape") else []
        if c.axis < len(dims) and not (dims[c.axis].HasField("dim_value") and dims[c.axis].dim_value > 0):
            dims[c.axis].Clear()
            dims[c.axis].dim_param = c.now


def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Turn `Constant` nodes holding a tensor into initializers (weights exported as Constants, as PaddlePaddle
    does, are invisible to quantization tools that look for initializers). Returns how many were moved."""
    keep, moved = [], 0
    taken = {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        attr = node.attribute[0] if node.op_type == "Constant" and len(node.attribute) == 1 else None
        if attr is not None and attr.name == "value" and node.domain in ("", "ai.onnx") \
                and node.output[0] not in taken:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(attr.t)
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
            moved += 1
        else:
            keep.append(node)
    if moved:
        del model.graph.node[:]
        model.graph.node.extend(keep)
    return moved


def require_op_types(model: onnx.ModelProto, ops: list[str], where: str) -> None:
    """Every op type a parameter names must occur in the model: a typo otherwise silently does nothing."""
    present = sorted({n.op_type for n in model.graph.node})
    for op in ops:
        if op not in present:
            raise StageError(f"{where}: the model has no '{op}' node{did_you_mean(op, present)}")


# ops through which an integer input reaches a Gather's indices unchanged in value
_VALUE_PRESERVING = {"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Transpose"}


def index_bounds(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """Integer graph inputs used as indices into a table (Gather on a weight, as an embedding lookup does):
    input -> (0, rows - 1). Random values outside it do not run, so random data stays inside."""
    tables = {name: list(t.dims) for name, t in
              [(i.name, i) for i in model.graph.initializer] + list(constant_tensors(model.graph).items())}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    ints = {vi.name for vi in graph_inputs(model) if vi.type.tensor_type.elem_type in
            (onnx.TensorProto.INT64, onnx.TensorProto.INT32)}
    bounds: dict[str, tuple[int, int]] = {}
    for name in ints:
        todo, seen = [name], set()
        while todo:
            tensor = todo.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            for node in consumers.get(tensor, []):
                if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == tensor \
                        and node.input[0] in tables:
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                    rows = tables[node.input[0]][axis]
                    bounds[name] = (0, min(rows - 1, bounds.get(name, (0, rows - 1))[1]))
                elif node.op_type in _VALUE_PRESERVING and node.input[0] == tensor:
                    todo += list(node.output)
    return bounds


def inputs_upstream_of(model: onnx.ModelProto, node_name: str) -> list[str]:
    """The graph inputs whose values reach the node named `node_name` (in graph order)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    node = next((n for n in model.graph.node if n.name == node_name), None)
    if node is None:
        return []
    names = {vi.name for vi in graph_inputs(model)}
    found, todo, seen = set(), list(node.input), set()
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        if tensor in names:
            found.add(tensor)
        elif tensor in producer:
            todo += list(producer[tensor].input)
    return [vi.name for vi in graph_inputs(model) if vi.name in found]


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The bodies of a control-flow node (If branches, a Loop or Scan body); none for other nodes."""
    subs: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            subs.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            subs.extend(a.graphs)
    return subs


def constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Output name -> value of every `Constant` node given as a tensor (weights some exporters write as nodes)."""
    return {n.output[0]: n.attribute[0].t for n in graph.node
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}


def input_independent(model: onnx.ModelProto) -> set[str]:
    """Names of the tensors known before any input arrives: initializers, Constant outputs, and what nodes compute
    from them alone (`constant_tensors` gives the values of Constant nodes only)."""
    known = {i.name for i in model.graph.initializer}
    for n in model.graph.node:  # nodes are topologically sorted in a valid model
        if n.op_type == "Constant" or (n.input and all(not t or t in known for t in n.input)
                                       and n.op_type not in ("RandomNormal", "RandomUniform")):
            known.update(o for o in n.output if o)
    return known


SHAPE_SOURCES = ("Shape", "Size")


def shape_derived(model: onnx.ModelProto) -> set[str]:
    """Names of the tensors computed from tensor shapes (Shape, Size) and constants alone: a dynamic model's
    shape arithmetic — sizes, Range bounds, anchor grids made from a feature map's height and width — whose
    values do not depend on any input's values, only on its shape."""
    known = input_independent(model)
    derived: set[str] = set()
    for n in model.graph.node:  # topological order
        if subgraphs(n):
            continue
        if n.op_type in SHAPE_SOURCES or (
                n.input and any(t in derived for t in n.input) and all(not t or t in derived or t in known
                                                                          for t in n.input)):
            derived.update(o for o in n.output if o)
    return derived


def nodes_in_subgraphs(model: onnx.ModelProto) -> list[tuple[str, onnx.NodeProto]]:
    """(control-flow node of the main graph, node) for every node inside an If/Loop/Scan body, at any depth."""
    found: list[tuple[str, onnx.NodeProto]] = []

    def walk(graph: onnx.GraphProto, owner: str) -> None:
        for node in graph.node:
            if owner:
                found.append((owner, node))
            for sub in subgraphs(node):
                walk(sub, owner or node.name)

    walk(model.graph, "")
    return found


def precision(model: onnx.ModelProto) -> Precision:
    """"int8" for a Q/DQ model, "fp16" where FP16 weights or casts to FP16 appear, else "fp32"."""
    ops = {n.op_type for n in model.graph.node}
    if ops & {"QuantizeLinear", "DequantizeLinear"}:
        return "int8"
    if any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer) or any(
            n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT16 for a in n.attribute)
            for n in model.graph.node):
        return "fp16"
    return "fp32"


def name_nodes(model: onnx.ModelProto) -> None:
    """Nodes need names to be kept in FP32 by name."""
    taken = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


BOUNDED_TO_ONE = ("Sigmoid", "Softmax", "HardSigmoid")  # their outputs are probabilities: scale 1
SHAPE_ONLY = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Concat", "Gather",
              "Split")


def output_floors(model: onnx.ModelProto) -> dict[str, float]:
    """Graph output -> the least scale its values have: 1 for a probability (a Sigmoid/Softmax, possibly
    reshaped, sliced or concatenated after), where an error of 1e-7 is nothing even if the map is near zero."""
    producer = {o: n for n in model.graph.node for o in n.output}
    floors = {}
    for out in model.graph.output:
        node = producer.get(out.name)
        while node is not None and node.op_type in SHAPE_ONLY:
            node = producer.get(node.input[0])
        if node is not None and node.op_type in BOUNDED_TO_ONE:
            floors[out.name] = 1.0
    return floors
