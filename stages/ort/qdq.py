"""Q/DQ models with ONNX Runtime's quantization tools, configured as ModelOpt configures them for TensorRT, and
what a Q/DQ model says about itself (its activation ranges, the op types and nodes it quantized).

Every model written here carries its recipe (op types, excluded nodes, per-channel, the range of every calibrated
tensor, the bias corrections) in its metadata: quantizing again with some nodes left out (validate's repair,
`trtflow reduce`) then starts from exactly what the calibrate stage did. The graph alone does not say it all:
ONNX Runtime also quantizes MatMuls between two activations, and needs ranges for tensors it leaves no Q/DQ on.
"""
from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from pydantic import BaseModel

from trtflow import phases
from trtflow.errors import StageError
from trtflow.files import write_atomic
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.fp16_emulation import holds_fp16
from trtflow.stages.onnx.graph import input_independent
from trtflow.text import first_line

RECIPE = "trtflow.qdq_recipe"  # the metadata key


class StoredRecipe(BaseModel):
    """A recipe as a Q/DQ model's metadata stores it (JSON under RECIPE, keys sorted)."""
    quantize_ops: list[str]
    excluded_nodes: list[str]
    per_channel: bool
    # a recipe without it was written before outputs were left alone: it quantized them
    quantize_outputs: bool = True
    method: str  # ONNX Runtime's CalibrationMethod, by name
    ranges: dict[str, tuple[float, float]]  # tensor -> (lowest, highest)
    # node -> per-output-channel amounts added to its float bias (`correct_bias`); none before calibrate VERSION 10
    bias: dict[str, list[float]] = {}
    # the unquantized remainder in FP16 (fp16_remainder.py): node -> why it stays FP32; None (absent): FP32
    fp16_remainder: dict[str, str] | None = None


@dataclass
class Recipe:
    quantize_ops: list[str]
    excluded: set[str]
    per_channel: bool
    tensors: Any  # ONNX Runtime's TensorsData: each calibrated tensor's range (and bias corrections: with_bias)
    quantize_outputs: bool = False  # Q/DQ on the quantized ops' outputs too (trtflow's recipe before VERSION 5)
    fp16_remainder: dict[str, str] | None = None  # StoredRecipe.fp16_remainder

    def quantized(self, model: onnx.ModelProto) -> set[str]:
        """The nodes of `model` (the FP32 model it was made from) this recipe quantizes."""
        return {n.name for n in model.graph.node if n.op_type in self.quantize_ops and n.name not in self.excluded}


def write(pre: Path, out: Path, ranges: Path, tensors: Any, per_channel: bool, quantize_ops: list[str],
          excluded: set[str], quantize_outputs: bool = False) -> None:
    """Quantize `pre` at `tensors`' ranges (ONNX Runtime's `TensorsData`, also saved to `ranges`): Q/DQ on the
    inputs of the `quantize_ops` nodes not `excluded`, and on their outputs too only with `quantize_outputs`
    (the recipe of models written before VERSION 5; ModelOpt's and trtflow's default is inputs only).
    The bias corrections `tensors` carry (`with_bias`, as `recipe` returns them) are applied: a rebuild with nodes
    left out keeps the others' corrections.

    ONNX Runtime's quantizer failing on a node (it has bugs on valid graphs) raises QuantizerCrash (a
    StageError): one line naming the node, with the setting that avoids it where known."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    save_ranges(tensors, ranges)  # the cache quantize_static reads: it then calibrates nothing itself
    options = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False,
               "AddQDQPairToWeight": False, "DedicatedQDQPair": False}
    if not quantize_outputs:
        # ONNX Runtime otherwise widens weight scales so that an INT32 bias could be represented, although the bias
        # stays float (QuantizeBias False), and it crashes doing so on a Gemm with a 2-D bias (magika's model:
        # "The truth value of an array ... is ambiguous"). ModelOpt turns it off too. (Kept for the recipe before
        # VERSION 5, which quantize_outputs stands for, so that its models are rebuilt scale for scale.)
        options["QDQDisableWeightAdjustForInt32Bias"] = True
        # Q/DQ on the inputs only, as ModelOpt configures it for TensorRT: a second rounding of each Conv/Gemm/
        # MatMul's pre-activation output costs accuracy (issue #24's measurement: ddddocr OCR text exact 0.61 ->
        # 0.96, MiniLM embedding cosine 0.82 -> 0.95) and TensorRT fuses the op with what follows in any case
        options["OpTypesToExcludeOutputQuantization"] = sorted(set(quantize_ops))
    # quantize_static logs "consider pre-processing" through the root logger for models it was not run on
    # (the pre-processing is done, or the model is a subgraph cut from a pre-processed one)
    try:
        with contextlib.redirect_stdout(io.StringIO()), _quiet_root_logger(), \
                phases.phase("Q/DQ writing (ONNX Runtime's quantizer)"):
            quantize_static(
                str(pre), str(out), None, quant_format=QuantFormat.QDQ, per_channel=per_channel,
                activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                calibrate_method=tensors.calibration_method,
                op_types_to_quantize=list(quantize_ops), nodes_to_exclude=sorted(excluded),
                calibration_cache_path=str(ranges),  # exists: quantize_static takes these ranges as they are
                # weights stored as INT8 with a DequantizeLinear (not FP32 + a Q/DQ pair): the same outputs, a
                # file about 3.6x smaller; TensorRT folds either form into INT8 weights
                extra_options=options)
    except Exception as exc:  # ONNX Runtime's quantizer raises anything on graphs it mishandles
        raise quantizer_crash(exc, per_channel) from exc
    model = model_io.load(out)
    applied = correct_bias(model, getattr(tensors, BIAS, {}))
    entry = model.metadata_props.add()
    stored = StoredRecipe(quantize_ops=list(quantize_ops), excluded_nodes=sorted(excluded), per_channel=per_channel,
                          quantize_outputs=quantize_outputs, method=tensors.calibration_method.name,
                          ranges={t: (float(np.ravel(d.range_value[0])[0]), float(np.ravel(d.range_value[1])[0]))
                                  for t, d in tensors.data.items()}, bias=applied)
    entry.key, entry.value = RECIPE, _dumped(stored)
    model_io.save(model, out)


def save_ranges(tensors: Any, path: Path) -> None:
    """ONNX Runtime's calibration cache (which `quantize_static` reads as it is), as its `save_tensors_data` writes
    it, but through json's C encoder: `json.dump` to a file runs the pure-Python one (1.5 s for the 2048-bin
    histograms of a small classifier)."""
    from onnxruntime.quantization.calibrate import CalibrationCacheEncoder

    payload = tensors.to_dict()
    payload["smooth_quant"] = False
    write_atomic(path, json.dumps(payload, cls=CalibrationCacheEncoder).encode())


def _dumped(stored: StoredRecipe) -> str:
    # a recipe without corrections, or with an FP32 remainder, is stored as before them: the same model, byte for byte
    left_out = {"bias"} if not stored.bias else set()
    left_out |= {"fp16_remainder"} if stored.fp16_remainder is None else set()
    return json.dumps(stored.model_dump(exclude=left_out), sort_keys=True)


def add_bias(path: Path, bias: dict[str, list[float]]) -> dict[str, list[float]]:
    """Apply `bias` (`correct_bias`) to the Q/DQ model `write` wrote at `path`, its stored recipe with it;
    returns the corrections applied."""
    model = model_io.load(path)
    entry = next(p for p in model.metadata_props if p.key == RECIPE)
    stored = StoredRecipe.model_validate_json(entry.value)
    applied = correct_bias(model, bias)
    stored.bias = {**stored.bias, **{n: [a + b for a, b in zip(stored.bias[n], v)] if n in stored.bias else v
                                     for n, v in applied.items()}}
    entry.value = _dumped(stored)
    model_io.save(model, path)
    return applied


def set_fp16_remainder(model: onnx.ModelProto, kept_fp32: dict[str, str]) -> None:
    """Record in `model`'s recipe that its unquantized remainder is FP16 but for `kept_fp32` (node -> why)."""
    entry = next(p for p in model.metadata_props if p.key == RECIPE)
    stored = StoredRecipe.model_validate_json(entry.value)
    stored.fp16_remainder = dict(sorted(kept_fp32.items()))
    entry.value = _dumped(stored)


BIAS = "trtflow_bias"  # the attribute of a TensorsData that carries a recipe's bias corrections (`with_bias`)


def with_bias(tensors: Any, bias: dict[str, list[float]]) -> Any:
    """`tensors` (ONNX Runtime's TensorsData) carrying the bias corrections `write` applies by default."""
    setattr(tensors, BIAS, dict(bias))
    return tensors


@dataclass(frozen=True)
class BiasSite:
    """Where a quantized node's output can be shifted per channel: its own bias input (Conv, ConvTranspose, Gemm;
    added where it has none) or the constant of the Add after a MatMul (how exporters write a linear layer)."""
    node: str
    activation: int  # the input index of its quantized activation
    weight: int  # the input index of its quantized weight
    channels: int
    rank: int | None  # the output's rank where the weight tells it (Conv), else None
    holder: str  # the node whose input `slot` holds the bias
    slot: int
    last_axis: bool  # the channels are the output's last axis (Gemm, MatMul), else axis 1 (Conv)


def bias_sites(model: onnx.ModelProto) -> dict[str, BiasSite]:
    """Node -> its BiasSite, for every node of the Q/DQ `model` that reads a quantized activation (input 0) and a
    quantized weight (input 1) and has (or can take) a per-channel bias."""
    g = _Wiring(model)
    out = {}
    for n in model.graph.node:
        if n.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul") or len(n.input) < 2 or \
                g.dequantized(n.input[0]) != "activation" or g.dequantized(n.input[1]) != "weight":
            continue
        shape = _channels(n, list(g.inits[g.producer[n.input[1]].input[0]].dims))
        site = None if shape is None else g.own_bias(n, *shape) if n.op_type != "MatMul" else g.add_after(n, shape[0])
        if site is not None:
            out[n.name] = site
    return out


class _Wiring:
    """A graph's initializers, producers, readers and outputs by tensor name (`bias_sites`)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.inits = {i.name: i for i in model.graph.initializer}
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in model.graph.node:
            for t in n.input:
                self.readers.setdefault(t, []).append(n)
        self.outputs = {o.name for o in model.graph.output}

    def dequantized(self, t: str) -> str | None:
        """'weight' or 'activation' for the output of a DequantizeLinear of an initializer or of a QuantizeLinear."""
        dq = self.producer.get(t)
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        if dq.input[0] in self.inits:
            return "weight"
        q = self.producer.get(dq.input[0])
        return "activation" if q is not None and q.op_type == "QuantizeLinear" and q.input[0] not in self.inits \
            else None

    def own_bias(self, n: onnx.NodeProto, channels: int, rank: int | None) -> BiasSite | None:
        """A Conv's, ConvTranspose's or Gemm's bias input: an initializer of one value per channel (or one), or
        none yet; not a bias computed in the graph, nor a Gemm's C per row as well."""
        if len(n.input) > 2 and n.input[2] and (n.input[2] not in self.inits or
                                                _size(self.inits[n.input[2]]) not in (1, channels)):
            return None
        return BiasSite(n.name, 0, 1, channels, rank, n.name, 2, n.op_type == "Gemm")

    def add_after(self, n: onnx.NodeProto, channels: int) -> BiasSite | None:
        """A MatMul's bias: the constant (one per channel, along the last axis) of the one Add that reads it."""
        after = self.readers.get(n.output[0], [])
        if n.output[0] in self.outputs or len(after) != 1 or after[0].op_type != "Add":
            return None
        add = after[0]
        slot = 1 if add.input[0] == n.output[0] else 0
        const = self.inits.get(add.input[slot])
        if const is None or add.input[1 - slot] != n.output[0] or _size(const) not in (1, channels) or \
                any(d != 1 for d in list(const.dims)[:-1]):
            return None
        return BiasSite(n.name, 0, 1, channels, None, add.name, slot, True)


def _channels(n: onnx.NodeProto, dims: list[int]) -> tuple[int, int | None] | None:
    """(output channels, output rank where the weight tells it) of a quantized node of weight `dims`; None for a
    MatMul of a weight other than 2-D."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    if n.op_type == "Conv":
        return dims[0], len(dims)
    if n.op_type == "ConvTranspose":
        return dims[1] * attrs.get("group", 1), len(dims)
    if n.op_type == "Gemm":
        return (dims[0] if attrs.get("transB", 0) else dims[-1]), 2
    return (dims[-1], None) if len(dims) == 2 else None


def _size(t: onnx.TensorProto) -> int:
    return int(np.prod(t.dims)) if len(t.dims) else 1


def correct_bias(model: onnx.ModelProto, bias: dict[str, list[float]]) -> dict[str, list[float]]:
    """Add `bias` (node -> one amount per output channel) to the float bias of each quantized node of `model`,
    in place (a new initializer per node: biases may be shared). Returns the corrections applied: those of
    nodes left in float, or of another shape, are not."""
    if not bias:
        return {}
    sites = bias_sites(model)
    inits = {i.name: i for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    taken = set(inits) | {t for n in model.graph.node for t in list(n.input) + list(n.output)}
    applied, replaced = {}, set()
    for name, amounts in sorted(bias.items()):
        site = sites.get(name)
        if site is None or len(amounts) != site.channels:
            continue
        holder = nodes[site.holder]
        old = inits.get(holder.input[site.slot]) if len(holder.input) > site.slot else None
        base = numpy_helper.to_array(old) if old is not None else np.zeros(site.channels, np.float32)
        shape = base.shape if base.size == site.channels else (site.channels,)
        value = (np.broadcast_to(base.reshape(-1), (site.channels,)).astype(np.float64) +
                 np.asarray(amounts, np.float64)).astype(base.dtype).reshape(shape)
        new = f"{name}_bias_corrected"
        while new in taken:
            new += "_"
        taken.add(new)
        model.graph.initializer.append(numpy_helper.from_array(value, new))
        while len(holder.input) <= site.slot:
            holder.input.append("")
        holder.input[site.slot] = new
        applied[name] = [float(a) for a in amounts]
        if old is not None:
            replaced.add(old.name)
    used = _read_anywhere(model.graph) | {o.name for o in model.graph.output}
    keep = [i for i in model.graph.initializer if i.name not in replaced or i.name in used]
    if len(keep) < len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
    return applied


def _read_anywhere(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a node of `graph` or of its subgraphs reads."""
    names = set()
    for n in graph.node:
        names.update(n.input)
        for a in n.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                names |= _read_anywhere(g)
    return names


class QuantizerCrash(StageError):
    """ONNX Runtime's quantizer raised on a node: a fact of this model and these settings (not transient)."""

    def __init__(self, message: str, node: str | None, op_type: str | None, hint: str | None):
        super().__init__(message, hint=hint)
        self.node, self.op_type = node, op_type


def quantizer_crash(exc: BaseException, per_channel: bool) -> QuantizerCrash:
    """One line for ONNX Runtime's quantizer failing: the node it was quantizing (read off the traceback's frames),
    the error, and what to set to avoid it."""
    node = _failing_node(exc)
    frames = _frame_names(exc)
    what = f"{node.op_type} node '{node.name}'" if node is not None else "the model"
    error = first_line(exc) or type(exc).__name__
    if per_channel and "_adjust_weight_scale_for_int32_bias" in frames:  # a Gemm with a 2-D bias (magika)
        hint = "its per-channel weight scales are adjusted for an INT32 bias, which fails on this node's bias: " \
               "set per_channel: false (or quantize_outputs: false, which skips that adjustment)"
    elif per_channel and any("per_channel" in f for f in frames):
        hint = "its per-channel weight quantization fails here: set per_channel: false"
    elif node is not None:
        hint = f"leave it in float: exclude_nodes: [{node.name}], or exclude_ops: [{node.op_type}]"
    else:
        hint = "leave the failing op types in float with exclude_ops"
    return QuantizerCrash(f"INT8 Q/DQ: ONNX Runtime's quantizer failed on {what}: {type(exc).__name__}: {error}",
                          node.name if node is not None else None, node.op_type if node is not None else None, hint)


def _failing_node(exc: BaseException) -> onnx.NodeProto | None:
    """The node ONNX Runtime's quantizer was working on when it raised, innermost first: an operator quantizer's
    own node (`self.node` in onnxruntime.quantization.operators), or the node of the bias being handled
    (`bias_info.node_name`). A bare `node` variable is not trusted: the quantizer's main loop leaves the last
    node in it when a later pass fails."""
    found, tb = None, exc.__traceback__
    while tb is not None:
        local = tb.tb_frame.f_locals
        me = local.get("self")
        if isinstance(getattr(me, "node", None), onnx.NodeProto) and "operators" in type(me).__module__:
            found = me.node
        name = getattr(local.get("bias_info"), "node_name", None)
        if name and me is not None and hasattr(me, "model"):
            found = next((n for n in me.model.nodes() if n.name == name), found)
        tb = tb.tb_next
    return found


def _frame_names(exc: BaseException) -> list[str]:
    names, tb = [], exc.__traceback__
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


def left_in_float(model: onnx.ModelProto, quantize_ops: list[str], attention: bool = True,
                  small: bool = True, depthwise: bool = True) -> dict[str, str]:
    """The default recipe's own exclusions, node -> why, as ModelOpt's INT8 recipe leaves them in float:
    - `attention`: attention's MatMuls (both inputs activations: QK^T, and the softmax probabilities times V).
      INT8 attention scores and probabilities cost accuracy (bench/int8.py, all-MiniLM-L6-v2: mean sentence-
      embedding cosine 0.976 with them in float; ModelOpt, which quantized them on that export, 0.86);
    - `small`: Convs with fewer than 16 input or output channels in shapes TensorRT's INT8 kernels do not take
      (ModelOpt's `find_nodes_from_convs_to_exclude`, int8), and Gemm/MatMul layers with fewer than 16 outputs
      (a classifier's last layer: ModelOpt leaves such GEMV-like ops in float, INT8 gains nothing there);
    and beyond ModelOpt's recipe:
    - `depthwise`: depthwise (grouped) Convs whose input channels per group are not a multiple of 4:
      TensorRT-RTX zero-pads an INT8 Conv's input to 4 channels per group, so a depthwise Conv reads and computes
      4x its input, and for static shapes the engine stores the zeros (3 bytes per input value: PP-OCRv4 rec at
      batch 8, 29.7 MB INT8 against 14.2 MB FP32, 11.1 MB with them in float); in float, PP-OCRv4 rec and det
      also read better (bench/int8.py; docs/NOTES.md, "INT8 engine size on TensorRT-RTX")."""
    const = input_independent(model)
    inits = {i.name: i for i in model.graph.initializer}
    inputs = {i.name for i in model.graph.input}
    out = {}
    for n in model.graph.node:
        if n.op_type not in quantize_ops:
            continue
        weight = inits.get(n.input[1]) if len(n.input) > 1 else None
        if attention and n.op_type == "MatMul" and len(n.input) == 2 and not any(t in const for t in n.input):
            out[n.name] = ATTENTION
        elif n.op_type == "Conv" and weight is not None and len(weight.dims) >= 3:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            if small and not _int8_conv_ok(list(weight.dims), attrs.get("group", 1),
                                           attrs.get("kernel_shape", weight.dims[2:]), n.input[0] in inputs):
                out[n.name] = SMALL_CONV
            elif depthwise and padded_groups(list(weight.dims), attrs.get("group", 1)):
                out[n.name] = DEPTHWISE_CONV
        elif small and n.op_type in ("MatMul", "Gemm") and weight is not None and len(weight.dims) == 2:
            trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0) if n.op_type == "Gemm" else 0
            if weight.dims[0 if trans_b else 1] < SMALL_CHANNELS:
                out[n.name] = SMALL_GEMM
    return out


CHANNEL_MULTIPLE = 4  # TensorRT-RTX's INT8 Convs take input channels per group in multiples of 4 (dp4a)


def channels_padded(weight_dims: list[int]) -> bool:
    """Whether TensorRT-RTX zero-pads the INT8 input of a Conv of these weights (out, in per group, *kernel) to a
    multiple of 4 channels per group."""
    return len(weight_dims) >= 3 and weight_dims[1] % CHANNEL_MULTIPLE != 0


def padded_groups(weight_dims: list[int], group: int) -> bool:
    """Whether a Conv is grouped (depthwise: 1 input channel per group) and `channels_padded`: its padding is 3x
    its input. A plain Conv's is at most a third (an RGB stem, 3 -> 4): not worth leaving it in float (PP-OCR cls
    read worse with its stem in float, rec and det slightly better)."""
    return group > 1 and channels_padded(weight_dims)


def padded_convs(model: onnx.ModelProto) -> dict[str, bool]:
    """The quantized Convs of the Q/DQ `model` (reading a DequantizeLinear of an initializer) whose INT8 input
    TensorRT-RTX zero-pads (`channels_padded`), each with whether it is grouped (`padded_groups`)."""
    inits = {i.name: i for i in model.graph.initializer}
    weights = {n.output[0]: list(inits[n.input[0]].dims) for n in model.graph.node
               if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    out = {}
    for n in model.graph.node:
        if n.op_type == "Conv" and len(n.input) > 1 and channels_padded(weights.get(n.input[1], [])):
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            out[n.name] = padded_groups(weights[n.input[1]], group)
    return out


SMALL_CHANNELS = 16


def _int8_conv_ok(dims: list[int], group: int, kernel: Any, reads_graph_input: bool) -> bool:
    """ModelOpt 0.47's rule (graph_utils.find_nodes_from_convs_to_exclude, int8) for the Convs TensorRT runs in
    INT8: 16 or more input and output channels, or else a plain Conv with channels a multiple of 8 that reads the
    graph input or has 16+ channels on one side and a square kernel, or a grouped Conv with output channels a
    multiple of 8 and kernels of 3 or more."""
    out_c, in_c = dims[0], dims[1]
    if out_c >= SMALL_CHANNELS and in_c >= SMALL_CHANNELS:
        return True
    kernel = list(kernel)
    if group == 1:
        return (out_c % 8 == 0 or in_c % 8 == 0) and len(set(kernel)) == 1 and \
            (reads_graph_input or out_c >= SMALL_CHANNELS or in_c >= SMALL_CHANNELS)
    return out_c % 8 == 0 and all(k >= 3 for k in kernel)


ATTENTION = "MatMul of two activations (attention: QK^T or probabilities x V)"
SMALL_CONV = "Conv with fewer than 16 channels in a shape TensorRT's INT8 kernels do not take"
SMALL_GEMM = "Gemm/MatMul with fewer than 16 outputs (INT8 gains nothing)"
DEPTHWISE_CONV = "depthwise Conv: input channels per group not a multiple of 4 (TensorRT-RTX zero-pads them in INT8)"


def recipe(model: onnx.ModelProto) -> Recipe:
    """How the Q/DQ `model` was quantized: from its metadata when trtflow wrote it, else read off its graph (a
    model quantized elsewhere: the op types of the nodes reading quantized weights, other nodes of those types
    excluded, the ranges of its QuantizeLinear nodes)."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorData, TensorsData

    meta = next((p.value for p in model.metadata_props if p.key == RECIPE), None)
    if meta is not None:
        try:
            r = StoredRecipe.model_validate_json(meta)
            method = CalibrationMethod[r.method]
        except (ValueError, KeyError) as exc:
            raise StageError(f"the model's '{RECIPE}' metadata is not a Q/DQ recipe trtflow wrote "
                             f"({first_line(exc)})", hint="quantize it again with the calibrate stage") from None
        data = {t: TensorData(lowest=np.float32(lo), highest=np.float32(hi)) for t, (lo, hi) in r.ranges.items()}
        return Recipe(r.quantize_ops, set(r.excluded_nodes), r.per_channel,
                      with_bias(TensorsData(method, data), r.bias), r.quantize_outputs, r.fp16_remainder)
    quantized = quantized_nodes(model)
    ops = sorted(set(quantized.values()))
    skipped = {n.name for n in model.graph.node if n.op_type in ops and n.name not in quantized}
    # a model quantized elsewhere with an FP16 remainder (ModelOpt's default) is rebuilt with one, all of it FP16
    half = {} if holds_fp16(model) else None
    return Recipe(ops, skipped, is_per_channel(model), activation_ranges(model), outputs_quantized(model, quantized),
                  half)


def outputs_quantized(model: onnx.ModelProto, quantized: dict[str, str]) -> bool:
    """Whether any of the `quantized` nodes' outputs feeds a QuantizeLinear."""
    q_inputs = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    return any(o in q_inputs for n in model.graph.node if n.name in quantized for o in n.output)


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def quantized_nodes(model: onnx.ModelProto) -> dict[str, str]:
    """Node name -> op type, for every node whose weights are quantized (it reads a DequantizeLinear of an
    initializer): the nodes of the calibrate stage's `quantize_ops`, which TensorRT runs in INT8."""
    inits = {i.name for i in model.graph.initializer}
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits for o in n.output}
    return {n.name: n.op_type for n in model.graph.node
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and any(t in dq for t in n.input)}


def is_per_channel(model: onnx.ModelProto) -> bool:
    inits = {i.name: i for i in model.graph.initializer}
    return any(n.op_type == "DequantizeLinear" and n.input[0] in inits and n.input[1] in inits
               and numpy_helper.to_array(inits[n.input[1]]).size > 1 for n in model.graph.node)


INT_RANGES = {onnx.TensorProto.INT8: (-128, 127), onnx.TensorProto.UINT8: (0, 255)}


def _activation_quantizers(model: onnx.ModelProto) -> Iterator[tuple[str, float, onnx.TensorProto | None]]:
    """(activation tensor, scale, zero-point initializer or None) of each per-tensor QuantizeLinear. A graph
    output keeps its name for the model's users: ONNX Runtime renames the tensor it quantizes
    (`<name>_QuantizeLinear_Input`) and the DequantizeLinear after it writes `<name>`, the tensor it stands for."""
    inits = {i.name: i for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    # (with an FP16 remainder the DequantizeLinear writes `<name>__fp16`, cast to the output `<name>`)
    cast = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "Cast" and n.output[0] in outputs}
    dequantized = {n.input[0]: cast.get(n.output[0], n.output[0]) for n in model.graph.node
                   if n.op_type == "DequantizeLinear"}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits and n.input[1] in inits:
            scale = numpy_helper.to_array(inits[n.input[1]])
            if scale.size == 1:
                after = dequantized.get(n.output[0])
                tensor = after if after in outputs else n.input[0]
                yield tensor, float(scale.ravel()[0]), inits.get(n.input[2]) if len(n.input) > 2 else None


def representable_ranges(model: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """Activation tensor -> the float range its QuantizeLinear can represent: ((qmin - zp) s, (qmax - zp) s)."""
    out = {}
    for tensor, s, zp in _activation_quantizers(model):
        lo, hi = INT_RANGES.get(zp.data_type if zp is not None else onnx.TensorProto.UINT8, (0, 255))
        z = float(numpy_helper.to_array(zp).ravel()[0]) if zp is not None else 0.0
        out[tensor] = ((lo - z) * s, (hi - z) * s)
    return out


def activation_ranges(model: onnx.ModelProto) -> Any:
    """The symmetric range [-127 s, 127 s] of each activation's per-tensor QuantizeLinear, as `TensorsData`
    `write` takes: quantizing again at these ranges gives the same scales."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorData, TensorsData

    data = {}
    for tensor, s, _ in _activation_quantizers(model):
        t = np.array(127.0 * s, dtype=np.float32)
        data[tensor] = TensorData(lowest=-t, highest=t)
    return TensorsData(CalibrationMethod.MinMax, data)
