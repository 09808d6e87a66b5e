"""What the rules of elementwise.py, pooling.py, geometry.py, linalg.py, audio.py and microsoft.py ask of a node and
its tensors (onnx-graphsurgeon's): an attribute with its default, an element type, a rank, an optional input, whether
an output is read."""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx_graphsurgeon as gs


def attr(node: gs.Node, name: str, default: Any = None) -> Any:
    """The node's attribute `name`, `default` where it is not set."""
    return node.attrs.get(name, default)


def dtype_of(tensor: gs.Tensor) -> np.dtype | None:
    """The tensor's element type; None where unknown or numpy has none (bfloat16)."""
    dtype = getattr(tensor, "dtype", None)
    try:
        return np.dtype(dtype) if dtype is not None else None
    except TypeError:
        return None


def float_dtype(tensor: gs.Tensor) -> np.dtype | None:
    """The tensor's element type where it is a floating-point one numpy has."""
    dtype = dtype_of(tensor)
    return dtype if dtype is not None and np.issubdtype(dtype, np.floating) else None


def rank(tensor: gs.Tensor) -> int | None:
    shape = getattr(tensor, "shape", None)
    return None if shape is None else len(shape)


def is_static(dim: Any) -> bool:
    return isinstance(dim, (int, np.integer)) and dim >= 0


def present(node: gs.Node, i: int) -> gs.Tensor | None:
    """The node's optional input `i`; None where it is absent or left empty."""
    return node.inputs[i] if len(node.inputs) > i and node.inputs[i].name else None


def is_read(tensor: gs.Tensor, graph: gs.Graph) -> bool:
    """Whether a node or the graph's outputs use `tensor` (an optional output left unnamed is not)."""
    return bool(tensor.name) and (bool(tensor.outputs) or any(o is tensor for o in graph.outputs))
