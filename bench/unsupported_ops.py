"""Unsupported ops (issue #68): a zoo of single-op and tiny models, one for every op and attribute case TensorRT's
parser refuses (or parses and then cannot build), each run through trtflow's real `prepare` stage; per case, what
the parser said of the model as given, what prepare fixed it with (a rewrite rule, offload to ONNX Runtime, or
"none" with trtflow's one-line reason), the rewrite's largest difference on ONNX Runtime, whether the prepared model
parses and builds, and for an offloaded case the nodes ONNX Runtime runs, the chain's pieces and the chain's largest
difference from the whole model.

The models are made here with onnx.helper (static shapes: no case is about dynamic ones), nothing is downloaded. A
case is a record (name, model builder, input shapes, what it is expected to hit: "parse" or "build"); `run_case`
runs one: the TensorRT pre-flight on the model as given (`run_preflight`: parse, and a trial build where it parses),
then `prepare.run` with its defaults (simplify, rewrites: auto, the trial build, offload: none) and
fail_on_unsupported: false so the report is written whatever it finds. A case the rewrites leave refused is run
through prepare again with `offload: onnxruntime` (`offload_case`), a counted case's model first put between ops
TensorRT takes (`sandwich`: each input a float32 input into a Relu and a Cast back to its type, each output a Cast
to float32 and a Sigmoid), as a refused op sits in a real model: a single-op model offloaded would be all on ONNX
Runtime, with no TensorRT piece, no engine to build and nothing to ship. It is fixed by offload when prepare
succeeds, the prepared model carries the offload mark, the chain cut from it has a TensorRT piece and every one
builds (`partition.trials`, built again here rather than taken from the record), and the chain run on ONNX Runtime
gives the whole (sandwiched) model's outputs (within 1e-4; a random op's outputs only in shape and type). A chain all
on ONNX Runtime is not fixed. A case TensorRT takes as given, or refuses elsewhere than expected, is said so under
the summary; a crash inside prepare (a rule's, or offload's) is the case's row, with where it happened.

    python bench/unsupported_ops.py [--jobs 2] [--only SUBSTRING ...] [--json rows.json]
"""
from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, F16, I32, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64
U8, U32 = TensorProto.UINT8, TensorProto.UINT32
MS, ML, ACME = "com.microsoft", "ai.onnx.ml", "com.acme"
STANDARD, CUSTOM = "standard", "custom"  # a custom-domain op has no definition anywhere: no rewrite can exist
VARIANT = "variant"  # a counted case again with other prepare settings: shown, not counted


# --- models ---------------------------------------------------------------------------------------------------------

def model(nodes: list[onnx.NodeProto], inputs: list[tuple], outputs: list[tuple], opset: int = 18,
          inits: dict[str, np.ndarray] | None = None, domains: tuple[str, ...] = ()) -> onnx.ModelProto:
    """`inputs`, `outputs`: (name, element type, shape); an output's shape None is what shape inference gives."""
    graph = helper.make_graph(nodes, "case", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    ir_version = min(10, helper.find_min_ir_version_for(opsets, ignore_unknown=True))  # what ORT and the parser read
    made = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(made).graph
    except Exception:  # noqa: BLE001 - an op onnx cannot infer (a custom one): outputs as declared
        return made
    for out, new in zip(made.graph.output, inferred.output):
        if not out.type.tensor_type.HasField("shape"):
            out.CopyFrom(new)
    return made


def one(op: str, inputs: list[tuple], outputs: list[tuple], opset: int = 18, inits: dict | None = None,
        order: list[str] | None = None, domain: str = "", **attrs) -> onnx.ModelProto:
    """A model of one node `op`: its inputs the graph's inputs then the initializers (or `order`, "" for one left
    out)."""
    names = order if order is not None else [i[0] for i in inputs] + list(inits or {})
    node = helper.make_node(op, names, [o[0] for o in outputs], name=f"{op.lower()}0", domain=domain, **attrs)
    return model([node], inputs, outputs, opset, inits, (domain,) if domain else ())


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def deform_conv(mask: bool = False, group: int = 1, offset_group: int = 1) -> onnx.ModelProto:
    inputs = [("X", F, [1, 4, 6, 6]), ("offset", F, [1, offset_group * 18, 4, 4])]
    inputs += [("mask", F, [1, offset_group * 9, 4, 4])] if mask else []
    inits = {"W": rand(4, 4 // group, 3, 3), "B": rand(4, seed=1)}
    order = ["X", "W", "offset", "B"] + (["mask"] if mask else [])
    return one("DeformConv", inputs, [("Y", F, None)], 19, inits, order, group=group, offset_group=offset_group)


def dft(opset: int, inverse: int = 0, onesided: int = 0) -> onnx.ModelProto:
    shape = [1, 16, 2 if inverse else 1]
    if opset < 20:
        return one("DFT", [("x", F, shape)], [("y", F, None)], opset, axis=1, inverse=inverse, onesided=onesided)
    return one("DFT", [("x", F, shape)], [("y", F, None)], opset, {"axis": np.array(1, np.int64)},
               ["x", "", "axis"], inverse=inverse, onesided=onesided)


def mel_weight_matrix() -> onnx.ModelProto:
    """A spectrogram [1, 5, 33] (dft_length 64) times the mel filter bank MelWeightMatrix computes."""
    inits = {"bins": np.array(8, np.int64), "dft_length": np.array(64, np.int64), "rate": np.array(16000, np.int64),
             "low": np.array(0.0, np.float32), "high": np.array(8000.0, np.float32)}
    nodes = [helper.make_node("MelWeightMatrix", list(inits), ["mel"], name="melweightmatrix0"),
             helper.make_node("MatMul", ["spec", "mel"], ["y"], name="matmul0")]
    return model(nodes, [("spec", F, [1, 5, 33])], [("y", F, None)], 17, inits)


def scatter_nd(reduction: str) -> onnx.ModelProto:
    return one("ScatterND", [("data", F, [4, 3]), ("updates", F, [3, 3])], [("y", F, [4, 3])], 18,
               {"indices": np.array([[1], [3], [1]], np.int64)}, ["data", "indices", "updates"], reduction=reduction)


def scatter_elements(reduction: str) -> onnx.ModelProto:
    indices = np.array([[1, 0, 2, 0], [1, 2, 2, 0]], np.int64)
    return one("ScatterElements", [("data", F, [3, 4]), ("updates", F, [2, 4])], [("y", F, [3, 4])], 18,
               {"indices": indices}, ["data", "indices", "updates"], axis=0, reduction=reduction)


def resize(form: str) -> onnx.ModelProto:
    x = ("X", F, [1, 3, 8, 12])
    if form == "antialias":
        return one("Resize", [x], [("Y", F, None)], 19, {"scales": np.array([1, 1, 0.5, 0.5], np.float32)},
                   ["X", "", "scales"], mode="linear", antialias=1)
    if form == "tf_crop_and_resize":
        roi = np.array([0, 0, -0.1, 0.2, 1, 1, 0.8, 1.1], np.float32)  # partly outside: the extrapolation value
        return one("Resize", [x], [("Y", F, None)], 19, {"roi": roi, "sizes": np.array([1, 3, 6, 6], np.int64)},
                   ["X", "roi", "", "sizes"], mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
                   extrapolation_value=0.5)
    return one("Resize", [x], [("Y", F, None)], 19, {"sizes": np.array([6, 6], np.int64)}, ["X", "", "", "sizes"],
               mode="linear", axes=[2, 3], keep_aspect_ratio_policy=form)


def attention(elem: int = F, is_causal: int = 0, mask: bool = False) -> onnx.ModelProto:
    """Q, K, V [batch 1, 2 heads, 16 tokens, head size 64] (TensorRT-RTX 1.7 builds FP16 attention at head size 64,
    not at 8), an additive mask [16, 16] of the same type."""
    qkv = [(n, elem, [1, 2, 16, 64]) for n in "QKV"]
    inputs = qkv + ([("mask", elem, [16, 16])] if mask else [])
    return one("Attention", inputs, [("Y", elem, [1, 2, 16, 64])], 23, is_causal=is_causal)


def sequence() -> onnx.ModelProto:
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"], name="sequenceconstruct0"),
             helper.make_node("SequenceAt", ["s", "pos"], ["y"], name="sequenceat0")]
    return model(nodes, [("a", F, [2, 3]), ("b", F, [2, 3])], [("y", F, [2, 3])], 18,
                 {"pos": np.array(1, np.int64)})


def optional() -> onnx.ModelProto:
    nodes = [helper.make_node("Optional", ["x"], ["o"], name="optional0"),
             helper.make_node("OptionalGetElement", ["o"], ["y"], name="optionalgetelement0")]
    return model(nodes, [("x", F, [2, 3])], [("y", F, [2, 3])], 18)


def string_tensor() -> onnx.ModelProto:
    """Numbers through a string tensor and back (random check data covers no string input)."""
    nodes = [helper.make_node("Cast", ["x"], ["s"], name="cast_to_string", to=TensorProto.STRING),
             helper.make_node("Cast", ["s"], ["y"], name="cast_to_float", to=F)]
    return model(nodes, [("x", F, [3])], [("y", F, [3])], 18)


def cast_fp8() -> onnx.ModelProto:
    nodes = [helper.make_node("Cast", ["x"], ["q"], name="cast_to_fp8", to=TensorProto.FLOAT8E4M3FN),
             helper.make_node("Cast", ["q"], ["y"], name="cast_to_float", to=F)]
    return model(nodes, [("x", F, [4, 8])], [("y", F, [4, 8])], 19)


def mod_fmod0() -> onnx.ModelProto:
    divisor = np.array([1.5, -2.0, 0.75, 3.0, -1.25], np.float32)  # no divisor near 0
    return one("Mod", [("a", F, [2, 5])], [("y", F, [2, 5])], 28, {"b": divisor}, fmod=0)


def dropout_training(ratio: float) -> onnx.ModelProto:
    inits = {"ratio": np.array(ratio, np.float32), "training_mode": np.array(True)}
    return one("Dropout", [("x", F, [2, 4])], [("y", F, [2, 4])], 18, inits)


def linear_classifier() -> onnx.ModelProto:
    return one("LinearClassifier", [("x", F, [2, 4])], [("label", I64, [2]), ("scores", F, [2, 3])], 18,
               domain=ML, coefficients=rand(12).tolist(), intercepts=[0.1, -0.2, 0.3], classlabels_ints=[0, 1, 2])


def quantized_bias() -> onnx.ModelProto:
    """x + DequantizeLinear(an INT32 constant): a bias quantized as ONNX Runtime's QuantizeBias=True leaves it
    (onnxsim does not fold DequantizeLinear)."""
    nodes = [helper.make_node("DequantizeLinear", ["bias_q", "scale"], ["bias"], name="dequantizelinear0"),
             helper.make_node("Add", ["x", "bias"], ["y"], name="add0")]
    return model(nodes, [("x", F, [1, 4])], [("y", F, [1, 4])], 18,
                 {"bias_q": np.array([1, -2, 3, 40], np.int32), "scale": np.array(0.1, np.float32)})


def between(op: str) -> onnx.ModelProto:
    """A refused op with nodes TensorRT takes before and after it: what offload cuts into TensorRT and ONNX Runtime
    pieces (a single-op case leaves no TensorRT piece)."""
    relu = helper.make_node("Relu", ["x"], ["r"], name="relu0")
    if op == "TopK":  # parses, does not build
        nodes = [relu, helper.make_node("TopK", ["r", "k"], ["v", "i"], name="topk0"),
                 helper.make_node("Mul", ["v", "two"], ["y"], name="mul0")]
        return model(nodes, [("x", F, [1, 5000])], [("y", F, [1, 4000])], 18,
                     {"k": np.array([4000], np.int64), "two": np.array(2.0, np.float32)})
    if op == "NonZero":  # its count of indices is data-dependent: the piece after it gets a dimension only it sets
        nodes = [relu, helper.make_node("NonZero", ["r"], ["nz"], name="nonzero0"),
                 helper.make_node("Cast", ["nz"], ["f"], name="cast0", to=F),
                 helper.make_node("ReduceSum", ["f", "axes"], ["y"], name="reducesum0", keepdims=0)]
        return model(nodes, [("x", F, [3, 4])], [("y", F, [2])], 18, {"axes": np.array([1], np.int64)})
    lc = helper.make_node("LinearClassifier", ["r"], ["label", "scores"], name="linearclassifier0", domain=ML,
                          coefficients=rand(12).tolist(), intercepts=[0.1, -0.2, 0.3], classlabels_ints=[0, 1, 2])
    nodes = [relu, lc, helper.make_node("Sigmoid", ["scores"], ["y"], name="sigmoid0")]
    return model(nodes, [("x", F, [2, 4])], [("label", I64, [2]), ("y", F, [2, 3])], 18, domains=(ML,))


def non_max_suppression() -> onnx.ModelProto:
    inits = {"max_boxes": np.array([3], np.int64), "iou": np.array([0.5], np.float32),
             "score": np.array([0.0], np.float32)}
    return one("NonMaxSuppression", [("boxes", F, [1, 6, 4]), ("scores", F, [1, 1, 6])], [("selected", I64, None)],
               18, inits)


def microsoft(op: str) -> onnx.ModelProto:
    x = ("x", F, [2, 8])
    if op == "SkipLayerNormalization":
        return one(op, [("x", F, [1, 4, 8]), ("skip", F, [1, 4, 8])], [("y", F, [1, 4, 8])], 18,
                   {"gamma": rand(8), "beta": rand(8, seed=1)}, domain=MS, epsilon=1e-5)
    if op == "FusedMatMul":
        return one(op, [("a", F, [2, 3])], [("y", F, [2, 4])], 18, {"b": rand(4, 3)}, domain=MS, transB=1,
                   alpha=0.5)
    if op in ("BiasGelu", "FastGelu"):
        return one(op, [x], [("y", F, [2, 8])], 18, {"bias": rand(8)}, domain=MS)
    return one(op, [x], [("y", F, [2, 8])], 18, domain=MS, alpha=1.702)  # QuickGelu


def sandwich(bare: onnx.ModelProto) -> onnx.ModelProto:
    """The model between ops TensorRT takes, as a refused op sits in a real model: the offload run's model of every
    counted case. Each tensor input becomes a float32 input of its name and shape into a Relu, then, where the
    input was of another type, a Cast to it (a Floor first for an integer type: the Cast exact whatever its
    rounding); each tensor output is a Cast to float32 where it was of another type, then a Sigmoid, under its
    name. The bare model's tensors at its edges are renamed `<name>__bare`; tensors of other types inside it (a
    string, a uint32) stay inside, shapes stay as they were. A sequence or optional input or output would be left
    as it is (the zoo's graph inputs and outputs are all tensors)."""
    made = onnx.ModelProto()
    made.CopyFrom(bare)
    graph = made.graph
    edges = [vi for vi in [*graph.input, *graph.output] if vi.type.HasField("tensor_type")]
    inner = {vi.name: f"{vi.name}__bare" for vi in edges}
    for node in graph.node:
        node.input[:] = [inner.get(x, x) for x in node.input]
        node.output[:] = [inner.get(x, x) for x in node.output]
    head = [n for vi in graph.input if vi.name in inner for n in _into(vi.name, _elem(vi), inner[vi.name])]
    tail = [n for vi in graph.output if vi.name in inner for n in _out_of(vi.name, _elem(vi), inner[vi.name])]
    nodes = [*head, *graph.node, *tail]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # of the bare names
    for vi in edges:
        vi.type.tensor_type.elem_type = F
    return made


def _elem(vi: onnx.ValueInfoProto) -> int:
    return vi.type.tensor_type.elem_type


def _into(name: str, elem: int, inner: str) -> list[onnx.NodeProto]:
    """float32 `name` -> Relu (-> Floor where `elem` is an integer type) (-> Cast to `elem`) -> `inner`."""
    steps = ["Relu"] + (["Floor"] if np.issubdtype(helper.tensor_dtype_to_np_dtype(elem), np.integer) else [])
    steps += ["Cast"] if elem != F else []
    nodes, x = [], name
    for k, op in enumerate(steps):
        y = inner if k == len(steps) - 1 else f"{name}__{op.lower()}"
        attrs = {"to": elem} if op == "Cast" else {}
        nodes.append(helper.make_node(op, [x], [y], name=f"sandwich_{op.lower()}_{name}", **attrs))
        x = y
    return nodes


def _out_of(name: str, elem: int, inner: str) -> list[onnx.NodeProto]:
    """`inner` (-> Cast to float32 where `elem` is not) -> Sigmoid -> `name`."""
    if elem == F:
        return [helper.make_node("Sigmoid", [inner], [name], name=f"sandwich_sigmoid_{name}")]
    return [helper.make_node("Cast", [inner], [f"{name}__float"], name=f"sandwich_cast_{name}", to=F),
            helper.make_node("Sigmoid", [f"{name}__float"], [name], name=f"sandwich_sigmoid_{name}")]


# --- the cases ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str  # the op and the attribute case
    build: Callable[[], onnx.ModelProto]
    shapes: dict[str, list[int]] = field(default_factory=dict)  # prepare's input_shapes (dynamic inputs only)
    expect: str = "parse"  # what TensorRT refuses it at: "parse", or "build" (it parses, the trial build fails)
    family: str = STANDARD
    check: dict | None = None  # prepare's check (ranges for inputs random normal values do not fit)
    params: dict = field(default_factory=dict)  # other prepare settings (default: prepare's own)
    random: bool = False  # its outputs are random: the chain is compared to the whole model in shape and type only
    tensors: bool = False  # offload: give prepare saved check tensors (`feeds_of` the offload run's model)


def _ranges(**ranges: list[float]) -> dict:
    return {"data": {"random": True, "ranges": ranges}}


CASES: list[Case] = [
    Case("NonZero", partial(one, "NonZero", [("x", F, [3, 4])], [("y", I64, None)])),
    Case("Unique", partial(one, "Unique", [("x", F, [8])], [("y", F, None)])),
    Case("DeformConv", partial(deform_conv)),
    Case("DeformConv with mask", partial(deform_conv, mask=True)),
    Case("DeformConv group=2 offset_group=2", partial(deform_conv, group=2, offset_group=2)),
    Case("DFT opset 17", partial(dft, 17)),
    Case("DFT opset 20", partial(dft, 20)),
    Case("DFT inverse", partial(dft, 20, inverse=1)),
    Case("DFT onesided", partial(dft, 20, onesided=1)),
    Case("Col2Im", partial(one, "Col2Im", [("x", F, [1, 8, 9])], [("y", F, None)], 18,
                           {"image_shape": np.array([4, 4], np.int64), "block_shape": np.array([2, 2], np.int64)})),
    Case("MelWeightMatrix (constant inputs, then MatMul)", mel_weight_matrix),
    Case("MelWeightMatrix, prepare with simplify: false", mel_weight_matrix, family=VARIANT,
         params={"simplify": False}),
    *[Case(f"ScatterND reduction={r}", partial(scatter_nd, r)) for r in ("add", "mul", "max", "min")],
    *[Case(f"ScatterElements reduction={r}", partial(scatter_elements, r)) for r in ("add", "mul", "max", "min")],
    Case("Resize antialias=1", partial(resize, "antialias")),
    Case("Resize tf_crop_and_resize", partial(resize, "tf_crop_and_resize")),
    Case("Resize keep_aspect_ratio_policy=not_larger", partial(resize, "not_larger")),
    Case("Resize keep_aspect_ratio_policy=not_smaller", partial(resize, "not_smaller")),
    Case("Attention (opset 23, FP16) is_causal=1 with a mask", partial(attention, F16, is_causal=1, mask=True)),
    Case("SequenceConstruct + SequenceAt", sequence),
    Case("Optional + OptionalGetElement", optional),
    Case("string tensor (Cast to STRING and back)", string_tensor),
    Case("uint32 tensors (Add)", partial(one, "Add", [("a", U32, [4]), ("b", U32, [4])], [("y", U32, [4])]),
         check=_ranges(a=[0, 8], b=[0, 8]), tensors=True),
    Case("int64 MatMul", partial(one, "MatMul", [("a", I64, [2, 3])], [("y", I64, [2, 4])], 18,
                                 {"b": np.arange(12, dtype=np.int64).reshape(3, 4)}), check=_ranges(a=[0, 8])),
    *[Case(f"Det {n}x{n}", partial(one, "Det", [("x", F, [2, n, n])], [("y", F, [2])])) for n in (2, 3, 4)],
    Case("LpPool p=3", partial(one, "LpPool", [("x", F, [1, 2, 6, 6])], [("y", F, None)], kernel_shape=[2, 2],
                               strides=[2, 2], p=3)),
    Case("Bernoulli", partial(one, "Bernoulli", [("x", F, [2, 4])], [("y", F, [2, 4])]), check=_ranges(x=[0, 1]),
         random=True),
    Case("CenterCropPad", partial(one, "CenterCropPad", [("x", F, [1, 3, 8, 6])], [("y", F, None)], 18,
                                  {"shape": np.array([6, 8], np.int64)}, axes=[2, 3])),
    Case("MaxUnpool", partial(one, "MaxUnpool", [("x", F, [1, 1, 2, 2])], [("y", F, None)], 18,
                              {"i": np.array([5, 7, 13, 15], np.int64).reshape(1, 1, 2, 2)}, kernel_shape=[2, 2],
                              strides=[2, 2])),
    Case("MaxRoiPool", partial(one, "MaxRoiPool", [("x", F, [1, 1, 8, 8])], [("y", F, None)], 18,
                               {"rois": np.array([[0, 0, 0, 4, 4], [0, 2, 2, 7, 7]], np.float32)},
                               pooled_shape=[2, 2])),
    Case("Compress", partial(one, "Compress", [("x", F, [3, 2])], [("y", F, None)], 18,
                             {"condition": np.array([True, False, True])}, axis=0)),
    Case("BitwiseAnd", partial(one, "BitwiseAnd", [("a", I32, [4]), ("b", I32, [4])], [("y", I32, [4])]),
         check=_ranges(a=[0, 8], b=[0, 8])),
    Case("BitShift (uint8)", partial(one, "BitShift", [("x", U8, [4])], [("y", U8, [4])], 18,
                                     {"shift": np.array([1, 2, 3, 0], np.uint8)}, direction="LEFT"),
         check=_ranges(x=[0, 8])),
    Case("AffineGrid", partial(one, "AffineGrid", [("theta", F, [1, 2, 3])], [("grid", F, None)], 20,
                               {"size": np.array([1, 1, 4, 5], np.int64)}, align_corners=0)),
    Case("MatMulInteger", partial(one, "MatMulInteger", [("a", U8, [2, 3])], [("y", I32, [2, 4])], 18,
                                  {"b": np.arange(12, dtype=np.uint8).reshape(3, 4)})),
    Case("DynamicQuantizeLinear", partial(one, "DynamicQuantizeLinear", [("x", F, [2, 4])],
                                          [("y", U8, [2, 4]), ("scale", F, []), ("zero_point", U8, [])])),
    Case("DequantizeLinear of INT32 (a quantized bias)", quantized_bias),
    Case("Dropout training_mode=1 ratio=0.5", partial(dropout_training, 0.5), random=True),
    Case("Dropout training_mode=1 ratio=0", partial(dropout_training, 0.0)),
    Case("Mod fmod=0 on floats (opset 28)", mod_fmod0),
    Case("ai.onnx.ml LinearClassifier", linear_classifier),
    Case("ai.onnx.ml Normalizer (L2)", partial(one, "Normalizer", [("x", F, [2, 4])], [("y", F, [2, 4])], 18,
                                               domain=ML, norm="L2")),
    *[Case(f"com.microsoft {op}", partial(microsoft, op))
      for op in ("SkipLayerNormalization", "FusedMatMul", "BiasGelu", "FastGelu", "QuickGelu")],
    Case("custom-domain op (com.acme MyOp)", partial(one, "MyOp", [("x", F, [2, 4])], [("y", F, [2, 4])],
                                                      domain=ACME), family=CUSTOM),
    # these parse; the trial build fails
    Case("NonMaxSuppression", non_max_suppression, expect="build"),
    Case("TopK K=4000 (> 3840)", partial(one, "TopK", [("x", F, [1, 5000])], [("values", F, [1, 4000]),
                                                                              ("indices", I64, [1, 4000])], 18,
                                         {"k": np.array([4000], np.int64)}), expect="build"),
    Case("Attention (opset 23) FP32", partial(attention), expect="build"),
    Case("Cast to FP8 (E4M3FN) and back", cast_fp8, expect="build"),
    # offload between nodes TensorRT takes (not counted: the cases above, in context)
    Case("Relu, TopK K=4000, Mul", partial(between, "TopK"), expect="build", family=VARIANT),
    Case("Relu, NonZero, Cast, ReduceSum", partial(between, "NonZero"), family=VARIANT),
    Case("Relu, ai.onnx.ml LinearClassifier, Sigmoid", partial(between, "LinearClassifier"), family=VARIANT),
]


# --- one case -------------------------------------------------------------------------------------------------------

@dataclass
class Row:
    case: str
    expect: str
    family: str
    parser: str = ""  # what TensorRT said of the model as given: the refusal's code and line, or the build's error
    hit: str = "parse"  # where TensorRT refused the model as given: parse, build, or none (a case it takes)
    outcome: str = "none"  # rewrite | simplify (onnxsim folded the node away) | offload | none
    fixed_by: str = "none"  # the rule(s) kept, "offload", or "none"
    reason: str = ""  # trtflow's one line where no rewrite fixed it
    max_abs: float | None = None  # ONNX Runtime's largest difference, before against after the rewrite
    parses: bool = False  # the prepared model
    builds: bool | None = None  # its trial build (None: it does not parse)
    offload: str = ""  # prepare again with offload: onnxruntime: "" not tried, "ok", or why it did not fix it
    sandwiched: bool = False  # the offload run's model is the case's between Relu and Sigmoid (`sandwich`)
    on_ort: list[str] = field(default_factory=list)  # the nodes marked for ONNX Runtime: "name (op)"
    pieces: str = ""  # the chain's runtimes in order: "trt→ort→trt", or "ort only"
    trt_built: str = ""  # its TensorRT pieces that built in a trial of their own, of all: "2/2"
    chain_max_abs: float | None = None  # the chain on ONNX Runtime against the whole model, largest difference
    trace: str = ""  # the last lines of a crash's traceback
    random_op: bool = False  # the case's outputs are random (its chain compared in shape and type only)
    seconds: float = 0.0


OFFLOAD = "offload"
ALL_ORT = "the chain is all on ONNX Runtime: no TensorRT piece, so no engine to build or ship"
CHAIN_ATOL = 1e-4  # the chain runs the same nodes on the same runtime: anything above is a cutting error
BUILD_ERROR = re.compile(r"Error Code (\d+): ([A-Za-z ]+?)\s*\(")


def one_line(text: str, limit: int = 100_000) -> str:
    from trtflow.stages.trt.log_errors import shorten

    return shorten(text, limit)


def build_error(trial) -> str:
    """The failed trial build's error class and what it says: 'Error Code 4: API Usage Error (K exceeds ...)'."""
    detail = trial.detail or trial.error or ""
    found = BUILD_ERROR.search(detail)
    if not found:
        return one_line(trial.error or "the builder returned no engine", 160)
    what = re.sub(r"^\[[^\]]*\]\s*", "", detail[found.end():])  # Myelin's [file:line: function]
    what = re.sub(r"^.*?\bfailed\.\s*", "", what)  # an assertion's condition
    what = re.split(r"\.\s|\.$| In \w+ at ", what)[0]
    return f"Error Code {found.group(1)}: {found.group(2)} ({one_line(what, 120)})"


def refusal_line(reason: str) -> str:
    """The parser's reason, its first line ("Invalid Node - <name>" passed over where a line follows it)."""
    lines = [ln for ln in reason.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].startswith("Invalid Node - "):
        lines = lines[1:]
    return lines[0] if lines else ""


def parser_said(report) -> tuple[str, str]:
    """What TensorRT said of the model as given, and where it refused it (parse, build, or none)."""
    if not report.ran:
        return f"pre-flight did not run: {report.reason}", "parse"
    if report.failures:
        f = report.failures[0]
        more = f" (+{len(report.failures) - 1} more)" if len(report.failures) > 1 else ""
        return f"{f.code}: {one_line(refusal_line(f.reason), 160)}{more}", "parse"
    trial = report.trial_build
    if trial is not None and not trial.ok:
        return f"parses; build: {build_error(trial)}", "build"
    return "parses and builds", "none"


def why_not_fixed(report) -> str:
    """trtflow's reason, on one line: the refusal's hint (where trtflow has a rule, why it was not kept), or the
    failed trial build's error and hint. The hint's closing advice (a plugin, run it on the host, your own rewrite),
    the same for every op, is left out."""
    from trtflow.stages.trt.preflight import no_rewrite

    pre = report.preflight
    if pre.failures:
        f = pre.failures[0]
        hint = (f.hint or f.reason).removesuffix(no_rewrite(f))
        return one_line(hint.removesuffix("; no rewrite of trtflow's covers it: ").removesuffix(": "))
    trial = pre.trial_build
    if trial is not None and not trial.ok:
        return f"trial build fails: {build_error(trial)}; {trial.hint}"
    return ""


def row_of(case: Case, said: tuple[str, str], report) -> Row:
    """A case's row from the pre-flight of the model as given and prepare's report."""
    kept = [r for r in report.rewrites if r.kept]
    pre = report.preflight
    row = Row(case.name, case.expect, case.family, *said, parses=pre.parsed,
              builds=None if pre.trial_build is None else pre.trial_build.ok,
              fixed_by=", ".join(r.rule for r in kept) or "none",
              max_abs=max((r.max_abs for r in kept if r.max_abs is not None), default=None))
    fixed = row.hit != "none" and pre.parsed and bool(row.builds)
    row.outcome = "rewrite" if fixed and kept else "simplify" if fixed else "none"
    if row.outcome == "simplify":
        row.fixed_by = "none (onnxsim folded it)"
    if not fixed:
        tried = [r for r in report.rewrites if not r.kept]
        row.reason = why_not_fixed(report) or (f"{tried[0].rule}: {tried[0].reason}" if tried else "")
    return row


def prepare_params(case: Case, offload: str = "none"):
    from trtflow.pipelines.params.prepare import PrepareStage

    settings = {"kind": "prepare", "fail_on_unsupported": False, "input_shapes": case.shapes, "offload": offload,
                **case.params}
    check = {"data": {"tensors": "check.npz"}} if case.tensors and offload != "none" else case.check
    return PrepareStage.model_validate(settings | ({"check": check} if check else {}))


def prepare_inputs(case: Case, src: Path, out: Path, offload: str):
    """prepare's inputs: the model, and where offload needs them saved check tensors (one sample, `feeds_of`)."""
    from trtflow.artifact import Artifact, Inputs

    inputs = Inputs({"model": Artifact(src, "onnx", "bench")})
    if case.tensors and offload != "none":
        np.savez(out / "check.npz", **feeds_of(case, src))
        inputs["tensors"] = [Artifact(out / "check.npz", "npz", "bench")]
    return inputs


def crash_of(exc: BaseException) -> tuple[str, str]:
    """A crash's one line (its type, message and where it was raised) and its traceback's last lines."""
    from trtflow.text import first_line

    where = traceback.extract_tb(exc.__traceback__)[-1]
    tail = "".join(traceback.format_exception(exc)).rstrip().splitlines()[-6:]
    return (f"prepare crashed: {type(exc).__name__}: {first_line(exc)} (at {Path(where.filename).name}:"
            f"{where.lineno})", "\n".join(tail))


def run_prepare(case: Case, src: Path, out: Path, offload: str = "none"):
    """prepare on the case's model into `out`: (its report, "", "") or (None, why it stopped, a crash's
    traceback)."""
    from trtflow.errors import StageError
    from trtflow.stages.prepare import stage as prepare
    from trtflow.stages.prepare.report import PrepareReport
    from trtflow.text import first_line

    out.mkdir(parents=True)
    try:
        result = prepare.run(prepare_params(case, offload), prepare_inputs(case, src, out.parent, offload), out)
    except StageError as exc:
        return None, f"prepare stopped: {first_line(exc)}", ""
    except Exception as exc:  # noqa: BLE001 - a crash (inside a rule?) is a finding of the bench, said in its row
        return None, *crash_of(exc)
    return PrepareReport.model_validate_json(result.outputs["report"].read_text()), "", ""


def run_case(case: Case, folder: Path) -> Row:
    """The case's model through the pre-flight as given, then through prepare (in `folder`); where no rewrite
    fixes it, through prepare with offload: onnxruntime."""
    from trtflow.stages.trt.preflight import run_preflight

    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / (re.sub(r"[^A-Za-z0-9]+", "_", case.name).strip("_") + ".onnx")
    onnx.save(case.build(), str(src))
    said = parser_said(run_preflight(src, case.shapes))
    report, stopped, trace = run_prepare(case, src, folder / "prepare")
    if report is None:
        row = Row(case.name, case.expect, case.family, *said, reason=stopped, trace=trace)
    else:
        row = row_of(case, said, report)
    row.random_op = case.random
    if row.outcome == "none" and row.hit != "none":
        offload_case(case, src, row, folder / "offload")
    row.seconds = round(time.perf_counter() - t0, 1)
    return row


# --- offload --------------------------------------------------------------------------------------------------------

def feeds_of(case: Case, src: Path, seed: int = 1) -> dict[str, np.ndarray]:
    """One sample of the model's inputs: normal floats (uniform in the case's check ranges), small integers,
    booleans."""
    rng = np.random.default_rng(seed)
    ranges = (case.check or {}).get("data", {}).get("ranges", {})
    feeds = {}
    for vi in onnx.load(str(src)).graph.input:
        tt = vi.type.tensor_type
        shape = case.shapes.get(vi.name) or [d.dim_value for d in tt.shape.dim]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        low, high = ranges.get(vi.name, (None, None))
        if dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(dtype, np.floating):
            x = rng.standard_normal(shape) if low is None else rng.uniform(low, high, shape)
            feeds[vi.name] = x.astype(dtype)
        else:
            feeds[vi.name] = rng.integers(0, 8, shape).astype(dtype)
    return feeds


def largest_difference(want: dict[str, np.ndarray], got: dict[str, np.ndarray], random: bool) -> float:
    """The largest |got - want| over the outputs (inf where a shape or type differs; 0 for a random op whose
    outputs agree in shape and type)."""
    worst = 0.0
    for name, a in want.items():
        b = np.asarray(got[name])
        if a.shape != b.shape or a.dtype != b.dtype:
            return float("inf")
        if not random and a.size:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            diff = np.where(np.isnan(a64) & np.isnan(b64), 0.0, np.abs(a64 - b64))  # NaN where the whole has NaN
            worst = max(worst, float(np.nan_to_num(np.max(diff), nan=np.inf)))
    return worst


def chain_check(case: Case, src: Path, prepared: Path, folder: Path, row: Row) -> str:
    """Cut the prepared model by its mark, build each TensorRT piece alone, run the chain on ONNX Runtime against
    the model prepare was given (`src`); "ok" (a TensorRT piece at least, every one built, the chain exact) or why
    not."""
    from trtflow.stages.onnx.offload import cut
    from trtflow.stages.onnx.split import ChainSession
    from trtflow.stages.ort.runner import run, session
    from trtflow.stages.trt.partition import trials

    chain = cut(prepared, folder)
    if chain is None:
        return "the prepared model carries no offload mark"
    runtimes = [p.runtime for p in chain.pieces]
    row.pieces = "→".join("trt" if r == "tensorrt" else "ort" for r in runtimes)
    row.pieces = "ort only" if "tensorrt" not in runtimes else row.pieces
    feeds = feeds_of(case, src)
    built = trials(chain, feeds)
    row.trt_built = f"{sum(t.ok for t in built)}/{len(built)}"
    row.chain_max_abs = largest_difference(run(session(src), feeds), ChainSession(chain).run(feeds), case.random)
    if not built:
        return ALL_ORT
    if not all(t.ok for t in built):
        return f"a TensorRT piece of the chain does not build ({row.trt_built} built)"
    if row.chain_max_abs > CHAIN_ATOL:
        return f"the chain differs from the whole model by {row.chain_max_abs:.2g}"
    return "ok"


def offload_case(case: Case, src: Path, row: Row, folder: Path) -> None:
    """prepare with offload: onnxruntime on a case no rewrite fixed, a counted case's model `sandwich`ed; the row
    says what it gave."""
    from trtflow.stages.onnx import offload

    folder.mkdir(parents=True)
    if case.family == STANDARD:
        sandwiched = folder / src.name
        onnx.save(sandwich(onnx.load(str(src))), str(sandwiched))
        src, row.sandwiched = sandwiched, True
    report, row.offload, trace = run_prepare(case, src, folder / "prepare", "onnxruntime")
    row.trace = trace or row.trace  # a crash of the rewrite run stays said
    if report is None:
        return
    if report.offload is None:
        row.offload = "prepare marked no node for ONNX Runtime"
        fixed_in_context(report, row)
        return
    row.on_ort = [f"{n.name} ({n.op_type})" for n in report.offload.nodes]
    prepared = folder / "prepare" / "model.onnx"
    mark = offload.read_file(prepared)
    if mark is None or mark.nodes != [n.name for n in report.offload.nodes]:
        row.offload = "the prepared model's mark is not the report's nodes"
        return
    try:
        row.offload = chain_check(case, src, prepared, folder / "chain", row)
    except Exception as exc:  # noqa: BLE001 - a chain that does not cut or run is a finding, said in its row
        row.offload, row.trace = crash_of(exc)
        row.offload = row.offload.replace("prepare crashed", "the chain crashed", 1)
    if row.offload == "ok":
        row.outcome = row.fixed_by = OFFLOAD


def fixed_in_context(report, row: Row) -> None:
    """A sandwiched model prepare left whole to TensorRT (it parses and builds): the refused op went away between
    the sandwich's ops (onnxsim folded it, or a rule took it), which it did not in the bare model."""
    pre = report.preflight
    if not (row.sandwiched and pre.parsed and pre.trial_build is not None and pre.trial_build.ok):
        return
    kept = [r.rule for r in report.rewrites if r.kept]
    row.offload += ": the sandwiched model parses and builds whole"
    if kept:
        row.outcome, row.fixed_by = "rewrite", ", ".join(kept) + ", in the sandwich"
    elif report.simplification.applied:
        row.outcome, row.fixed_by = "simplify", "simplification: onnxsim folded it between the sandwich's ops"


def _run_named(name: str) -> Row:
    """A pool worker's task: the case by name, in a folder of its own."""
    with tempfile.TemporaryDirectory(prefix="trtflow-unsupported-") as tmp:
        return run_case(next(c for c in CASES if c.name == name), Path(tmp))


# --- the table and the summary --------------------------------------------------------------------------------------

def reason_group(row: Row) -> str:
    """A none's reason as a group of the summary (the op named in it left out)."""
    if row.family == CUSTOM:
        return "custom-domain op: no definition to rewrite from, nor for ONNX Runtime to run"
    if row.offload not in ("", "ok"):
        return "offload: " + re.sub(r"'[^']*'", "X", row.offload.split(" (")[0].split(": [")[0])
    if row.reason.startswith("prepare "):
        return row.reason.split(":")[0]
    if row.reason.startswith("trial build fails"):
        return f"parses, trial build fails ({row.reason.split(': ', 1)[1].split(' (')[0]}), no rule for it"
    if "rewrite was not kept" in row.reason:
        return "trtflow's rule does not cover this case"
    cause = re.sub(r"'[^']*'", "X", row.reason.split(" (")[0].split(";")[0])
    return f"no rule: {cause}"


def share(k: int, of: int) -> str:
    return f"{k} ({100 * k / of:.0f}%)" if of else str(k)


def summary(rows: list[Row]) -> list[str]:
    counted = [r for r in rows if r.hit != "none" and r.family == STANDARD]
    n, at_parse = len(counted), [r for r in counted if r.hit == "parse"]
    by = Counter(r.outcome for r in counted)
    fixed_at_parse = sum(r.outcome == "rewrite" for r in at_parse)
    fixed, all_ort = n - by["none"], sum(r.offload == ALL_ORT for r in counted)
    lines = [(f"{n} standard-op cases ({len(at_parse)} refused by the parser, {n - len(at_parse)} parse and fail "
              f"the trial build): fixed by rewrite {share(by['rewrite'], n)}, by prepare's simplification "
              f"{share(by['simplify'], n)}, by offload (TensorRT pieces built, the chain exact) "
              f"{share(by[OFFLOAD], n)}, none {share(by['none'], n)} (of them offloaded all to ONNX Runtime "
              f"{all_ort}); of the parser's refusals, fixed by rewrite {share(fixed_at_parse, len(at_parse))}"),
             (f"fixed by rewrite, simplification or offload {share(fixed, n)}; the issue's bar, >= 80% by rewrite "
              f"or offload: {'met' if n and fixed >= 0.8 * n else 'not met'}")]
    for outcome in ("simplify", OFFLOAD):
        cases = [r.case for r in counted if r.outcome == outcome]
        lines += [f"  {outcome}, {len(cases)}: {', '.join(cases)}"] if cases else []
    groups = Counter(reason_group(r) for r in counted if r.outcome == "none")
    for group, k in groups.most_common():
        cases = ", ".join(r.case for r in counted if r.outcome == "none" and reason_group(r) == group)
        lines.append(f"  none, {k}: {group}: {cases}")
    lines += [f"  not counted ({r.family}): {r.case}: {r.outcome if r.outcome != 'none' else reason_group(r)}"
              for r in rows if r.family != STANDARD]
    lines += [f"  expected at {r.expect}, TensorRT refused it at {r.hit}: {r.case}"
              for r in rows if r.hit != r.expect and r.hit != "none"]
    lines += [f"  accepted by this TensorRT as given (dropped): {r.case}" for r in rows if r.hit == "none"]
    lines += [f"  crashed: {r.case}: {r.offload or r.reason}" for r in rows if r.trace]
    return lines


def fixed_cell(r: Row) -> str:
    if r.outcome == OFFLOAD or r.outcome != "none" and r.sandwiched:  # fixed in the offload run
        return f"{r.fixed_by} (no rewrite: {one_line(r.reason, 160)})"
    if r.outcome != "none":
        return r.fixed_by
    tried = f"; offload: {one_line(r.offload, 160)}" if r.offload else ""
    return f"none: {one_line(r.reason, 220)}{tried}"


def offload_cells(r: Row) -> list[str]:
    """On ONNX Runtime, the pieces (with how many TensorRT ones built), the chain against the whole model."""
    if not r.on_ort:
        return ["-", "-", "-"]
    pieces = r.pieces or "-"
    if r.trt_built and r.trt_built != "0/0":
        pieces += f" (TensorRT built {r.trt_built})"
    chain = "-" if r.chain_max_abs is None else f"{r.chain_max_abs:.2g}"
    chain += " (random op: shape and type only)" if r.random_op and r.chain_max_abs is not None else ""
    return [", ".join(r.on_ort), pieces, chain]


def markdown(rows: list[Row]) -> str:
    lines = ["| case | TensorRT said (as given) | fixed by | max abs diff | prepared model parses | trial build "
             "| offload: on ONNX Runtime | pieces | chain vs whole, max abs diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = "-" if r.max_abs is None else f"{r.max_abs:.2g}"
        build = "-" if r.builds is None else "ok" if r.builds else "fails"
        cells = [r.case, r.parser, fixed_cell(r), diff, "yes" if r.parses else "no", build, *offload_cells(r)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (each spawns parse/build processes)")
    ap.add_argument("--only", nargs="*", default=[], help="run the cases whose name holds one of these")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    names = [c.name for c in CASES if not args.only or any(s.lower() in c.name.lower() for s in args.only)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(_run_named, names))
    print(markdown(rows))
    print()
    print("\n".join(summary(rows)))
    print(f"\n{len(rows)} cases in {time.perf_counter() - t0:.0f} s, {args.jobs} at a time")
    for r in rows:
        if r.trace:
            print(f"\n{r.case}: the traceback's last lines:\n{r.trace}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
