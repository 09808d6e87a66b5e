"""What the ONNX file says about a model's inputs and outputs: names, data types, static and dynamic dimensions,
and the operation that makes each output (a Softmax, a Sigmoid, a normalization)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtflow import external_data
from trtflow.errors import SpecError

# ops that pass a tensor's meaning through unchanged: an output's producer is looked up behind them
PASS_THROUGH = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Cast"})
NORMALIZING = frozenset({"ReduceL2", "ReduceSumSquare", "LpNormalization"})  # behind a Div: an L2-normalized vector


@dataclass(frozen=True)
class Tensor:
    """An input or output: dims hold an int where the file fixes the dimension, its symbol where it does not
    ('?' for an anonymous or negative one, as PaddlePaddle writes -1)."""
    name: str
    dtype: str  # numpy's name: float32, float16, uint8, int64, ...
    dims: tuple[int | str, ...]
    producer: str | None = None  # outputs: the op making it, behind PASS_THROUGH ops
    producer_axis: int | None = None  # a Softmax's axis, normalized to be >= 0 where the rank is known
    normalized: bool = False  # outputs: divided by its own L2 norm (an embedding)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def dynamic(self) -> list[int]:
        return [i for i, d in enumerate(self.dims) if not isinstance(d, int)]

    def shown(self) -> str:
        return f"{self.dtype} [{', '.join(str(d) for d in self.dims)}]"

    def is_float(self) -> bool:
        return self.dtype in ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class ModelFacts:
    path: Path
    opset: int
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    def input(self, name: str) -> Tensor | None:
        return next((t for t in self.inputs if t.name == name), None)


def _dtype(elem_type: int) -> str:
    import onnx

    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def _dims(vi) -> tuple[int | str, ...]:  # noqa: ANN001 - an onnx.ValueInfoProto
    dims: list[int | str] = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or "?")
    return tuple(dims)


def read_model(path: Path) -> ModelFacts:
    """The model's facts; a file ONNX cannot read is one line naming it."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf and OS errors alike: the file is not a model
        raise SpecError(f"{path}: not an ONNX model ONNX can read ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    external_data.files(path, model)  # what prepare would read, refused now
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    inputs = tuple(Tensor(vi.name, _dtype(vi.type.tensor_type.elem_type), _dims(vi))
                   for vi in graph.input if vi.name not in weights)
    outputs = []
    for vi in graph.output:
        dims = _dims(vi)
        node = producers.get(vi.name)
        while node is not None and node.op_type in PASS_THROUGH and node.input:
            node = producers.get(node.input[0])
        axis = None
        if node is not None and node.op_type in ("Softmax", "LogSoftmax"):
            axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
            axis = axis + len(dims) if axis < 0 and dims else axis
        normalized = node is not None and (node.op_type == "LpNormalization" or (
            node.op_type == "Div" and len(node.input) > 1 and _behind(producers, node.input[1], NORMALIZING)))
        outputs.append(Tensor(vi.name, _dtype(vi.type.tensor_type.elem_type), dims,
                              node.op_type if node is not None else None, axis, normalized))
    if not inputs or not outputs:
        raise SpecError(f"{path}: the model has no {'inputs' if not inputs else 'outputs'}")
    return ModelFacts(path, opset, inputs, tuple(outputs))


def _behind(producers: dict, name: str, ops: frozenset[str], depth: int = 6) -> bool:
    """Whether one of `ops` makes `name` within `depth` nodes upstream (a norm behind Clip, Max, Expand, Sqrt)."""
    node = producers.get(name)
    if node is None or depth == 0:
        return False
    return node.op_type in ops or any(_behind(producers, i, ops, depth - 1) for i in node.input if i)
