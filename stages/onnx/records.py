"""The records of ONNX models that reports and later stages read, apart from the code that makes them: a model's
inventory and dynamic dimensions (`graph.py`), its compute by precision (`Composition`, `composition.py`), and the
chain of pieces an offloaded model is cut into (`Chain`, `Piece`, `TensorSpec`: `split.py` writes it, `read_chain`
reads it back). Types and small pure methods only (ONNX is imported by `TensorSpec.numpy` alone, when called)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from trtflow import files
from trtflow import markdown as md
from trtflow.precisions import Precision

if TYPE_CHECKING:
    import numpy as np

Runtime = Literal["tensorrt", "onnxruntime"]
CHAIN_FILE = "chain.json"


# --- what a model is (graph.py) ------------------------------------------------------------------------------------

class GraphTensor(BaseModel):
    """A graph input or output: its NumPy dtype and its dimensions (a size, a symbol, "?"; None: no shape)."""
    name: str
    dtype: str
    shape: list[int | str] | None


class Inventory(BaseModel):
    """What a model holds: opsets, node and op counts, weights, IO."""
    ir_version: int | None = None
    producer: str = ""
    opsets: dict[str, int]
    nodes: int
    ops: dict[str, dict[str, int]]  # domain -> op type -> count
    initializers: int
    initializer_bytes: int
    inputs: list[GraphTensor]
    outputs: list[GraphTensor]


class DynamicDim(BaseModel):
    input: str
    axis: int
    name: str | None  # its symbol


class RenamedDim(BaseModel):
    """A dimension `sanitize_dims` named: it was anonymous ("?", "", -1)."""
    tensor: str
    axis: int
    was: int | str
    now: str


# --- compute by precision (composition.py) -------------------------------------------------------------------------

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
    untimed: int = 0  # loop bodies whose trip count the graph does not fix (counted once)
    elements: int = 0  # the other ops' output elements, all precisions
    weight_bytes: int = 0  # the weights as stored (INT8 one byte, FP16 two)

    def line(self) -> str:
        """One line: "MACs 92% INT8 · 8% FP32 (4.1 GMAC); other ops 100% FP32"."""
        unsized = f", {self.unsized} unsized" if self.unsized else ""
        unsized += f", {self.untimed} loop bodies counted once (trip count unknown)" if self.untimed else ""
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


def _si(n: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} "


# --- a model cut into a chain of pieces (split.py) -----------------------------------------------------------------

class TensorSpec(BaseModel):
    """A tensor handed between pieces (or a model input/output): `dtype` is ONNX's name for its element type
    ("FLOAT", "INT64", "FLOAT16", ...); a dimension is a size, a symbol, or None where nothing names it (a size
    only the data decides, as a NonZero's count)."""
    name: str
    dtype: str
    shape: list[int | str | None] | None = None  # None: the rank is unknown

    def dims(self) -> str:
        """"[1, K, ?]": a size, a symbol, or ? where only the data decides it."""
        if self.shape is None:
            return "(rank unknown)"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.shape) + "]"

    @property
    def numpy(self) -> np.dtype:
        import numpy as np
        import onnx
        from onnx import helper

        return np.dtype(helper.tensor_dtype_to_np_dtype(getattr(onnx.TensorProto, self.dtype)))


class Piece(BaseModel):
    """One model of the chain: its file (in the chain's folder), the runtime meant to run it, its nodes' names."""
    runtime: Runtime
    file: str
    nodes: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


class Chain(BaseModel):
    """The pieces in the order they run: each reads the model's inputs and what earlier pieces produced."""
    folder: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    pieces: list[Piece]

    def path(self, piece: Piece) -> Path:
        return Path(self.folder) / piece.file

    def write(self) -> Path:
        path = Path(self.folder) / CHAIN_FILE
        path.write_text(self.model_dump_json(indent=2, exclude={"folder"}) + "\n")
        return path


def read_chain(folder: Path) -> Chain:
    """The chain `split` wrote into `folder` (moved or not: its pieces are found beside it)."""
    text = files.read_json(Path(folder) / CHAIN_FILE, files.RECORD_BYTES)
    return Chain.model_validate({**text, "folder": str(folder)})
