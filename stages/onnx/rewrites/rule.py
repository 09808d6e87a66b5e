"""The contract of a rewrite: one rule replaces one node that TensorRT's ONNX parser refuses with nodes it takes and
that compute the same thing (onnx-graphsurgeon's graph, NVIDIA's own tool for this).

A rule is keyed by the node's domain and op type, and says for a given node either that it applies or why not
(`refuses`: an attribute it does not cover, a shape it needs static and is not); `replace` then edits the graph in
place: it adds the replacement nodes, wires them to the node's inputs and outputs, and disconnects the node (the
caller runs `graph.cleanup().toposort()`). A rule never checks its own result: the caller keeps a rewrite only where
ONNX Runtime gives the same outputs before and after within the stated tolerance, and the parser accepts the new
nodes.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs


@dataclass(frozen=True)
class OpKey:
    op_type: str
    domain: str = ""  # "" and "ai.onnx" are the default domain

    def matches(self, node: gs.Node) -> bool:
        return node.op == self.op_type and (node.domain or "") in ((self.domain,) if self.domain else ("", "ai.onnx"))


class Rewrite(ABC):
    """One rule of the library (see the module)."""

    name: str  # short, stable, in the keys and the report: "deformconv-gridsample"
    op: OpKey
    summary: str  # what it replaces the node with, one line: "GridSample over the kernel taps + a 1x1 Conv"

    @abstractmethod
    def refuses(self, node: gs.Node, graph: gs.Graph) -> str | None:
        """None where the rule applies to `node`; else why not, one line ("needs a static input shape")."""

    @abstractmethod
    def replace(self, node: gs.Node, graph: gs.Graph) -> None:
        """Replace `node` in `graph` (see the module)."""


# --- helpers every rule uses --------------------------------------------------------------------------------------

ADDED = "/rw"  # what follows a replaced node's name in the names of the nodes its rule adds ("<node>/rw/<op>_<n>")


def added_for(node: str, name: str) -> bool:
    """`name` is one of the nodes a rule added in place of `node` (Builder names them)."""
    return name.startswith(f"{node}{ADDED}/")


class Builder:
    """Adds nodes and constants to a graph with unique names derived from the node being replaced."""

    def __init__(self, graph: gs.Graph, node: gs.Node):
        self.graph, self.prefix, self.count = graph, f"{node.name or node.op}{ADDED}", 0

    def name(self, what: str) -> str:
        self.count += 1
        return f"{self.prefix}/{what}_{self.count}"

    def const(self, value: np.ndarray | float | list, dtype=None, what: str = "c") -> gs.Constant:
        return gs.Constant(self.name(what), np.asarray(value, dtype=dtype))

    def op(self, op: str, inputs: list, attrs: dict | None = None, outputs: list[gs.Variable] | None = None,
           dtype=None) -> gs.Variable:
        """A node `op(inputs)`; its (first) output, a new variable unless `outputs` are given."""
        outs = outputs or [gs.Variable(self.name(op.lower()), dtype=dtype)]
        self.graph.nodes.append(gs.Node(op, self.name(op), attrs=attrs or {}, inputs=list(inputs), outputs=outs))
        return outs[0]


def take_over_outputs(node: gs.Node, produced: list[gs.Variable], builder: Builder) -> None:
    """The replacement's results become the node's outputs (each through an Identity, so the tensors keep their
    names for the nodes and graph outputs that read them); the node is disconnected."""
    for out, new in zip(list(node.outputs), produced):
        builder.op("Identity", [new], outputs=[out])
    node.outputs.clear()
    node.inputs.clear()


def static_shape(tensor: gs.Tensor) -> list[int] | None:
    """The tensor's shape where every dimension is a number; None otherwise."""
    shape = getattr(tensor, "shape", None)
    if shape is None or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
        return None
    return [int(d) for d in shape]


CONSTANT_VALUE = "value"  # a Constant node's attribute holding a tensor (its other forms are not taken)


def constant_value(tensor: gs.Tensor) -> np.ndarray | None:
    """The tensor's value where it is a constant (an initializer, or a Constant node's output); None otherwise."""
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    producer = tensor.inputs[0] if tensor.inputs else None
    value = producer.attrs.get(CONSTANT_VALUE) if producer is not None and producer.op == "Constant" else None
    return None if value is None else np.asarray(value.values)
    return None
