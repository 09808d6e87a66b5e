"""The rules for ONNX Runtime's dynamic quantization (stages/onnx/rewrites/integer.py): DynamicQuantizeLinear,
ConvInteger and MatMulInteger as float32 ops, exact, so ONNX Runtime's outputs before and after are equal bit for
bit (DynamicQuantizeLinear's all-zero input included, where ONNX Runtime takes scale 1); TensorRT-RTX parses and
builds each rewritten tiny model, and parses the rewritten ddddocr CRNN (a dynamically quantized captcha OCR) up to
its DynamicQuantizeLSTM, whose outputs and decoded text are the original's."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.rewrite_checks import check_rewrite, run_ort
from trtflow.stages.onnx.rewrites import rules_for
from trtflow.stages.onnx.rewrites.apply import Refused, apply
from trtflow.stages.onnx.rewrites.integer import (
    ConvIntegerAsConv,
    DynamicQuantizeLinearAsFloat,
    MatMulIntegerAsMatMul,
)

FLOAT, UINT8, INT8, INT32 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32
NP = {UINT8: np.uint8, INT8: np.int8}
RULES = {"DynamicQuantizeLinear": DynamicQuantizeLinearAsFloat(), "ConvInteger": ConvIntegerAsConv(),
         "MatMulInteger": MatMulIntegerAsMatMul()}


def _model(nodes: list, inputs: list, outputs: list, inits=(), opset: int = 13) -> onnx.ModelProto:
    """`inputs`, `outputs`: (name, elem type, shape); an output's shape None is what shape inference gives."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=min(10, helper.find_min_ir_version_for(opsets)))
    inferred = onnx.shape_inference.infer_shapes(model).graph
    for out, new in zip(model.graph.output, inferred.output):
        if not out.type.tensor_type.HasField("shape"):
            out.CopyFrom(new)
    return model


def _ints(shape, elem, seed: int, bits: int = 8) -> np.ndarray:
    low, high = (0, 2 ** bits) if elem == UINT8 else (-2 ** (bits - 1), 2 ** (bits - 1))
    return np.random.default_rng(seed).integers(low, high, shape).astype(NP[elem])


def _diff(before: list[np.ndarray], after: list[np.ndarray]) -> float:
    assert [a.dtype for a in before] == [a.dtype for a in after]
    return max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) for a, b in zip(before, after))


def _refusal(model: onnx.ModelProto, node: str, rule) -> str:
    with pytest.raises(Refused) as refused:
        apply(model, node, rule)
    return str(refused.value)


def test_the_rules_are_in_the_library():
    for op, rule in RULES.items():
        assert [type(r) for r in rules_for(op)] == [type(rule)]


# --- DynamicQuantizeLinear ----------------------------------------------------------------------------------------

def dql(shape=(2, 3, 4), opset: int = 13) -> onnx.ModelProto:
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], name="n")
    return _model([node], [("x", FLOAT, list(shape))], [("y", UINT8, list(shape)), ("s", FLOAT, []), ("z", UINT8, [])],
                  opset=opset)


def _ties() -> np.ndarray:
    """min -100, max 155: scale exactly 1, zero point 100, and x / scale lands on halves (rounded to even)."""
    x = np.array([-100, 155, 0.5, 1.5, 2.5, -3.5, -0.5, 154.5, -99.5, 7.49, 0, 3], np.float32)
    return np.concatenate([x, np.linspace(-100, 155, 12, dtype=np.float32)]).reshape(2, 3, 4)


DQL_DATA = {
    "normal": lambda: np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32),
    "positive": lambda: np.random.default_rng(2).uniform(0.1, 7.0, (2, 3, 4)).astype(np.float32),  # zero point 0
    "negative": lambda: np.random.default_rng(3).uniform(-3.0, -0.01, (2, 3, 4)).astype(np.float32),  # 255
    "all-zero": lambda: np.zeros((2, 3, 4), np.float32),  # ONNX Runtime: scale 1, zero point 0 (the spec: 0 / 0)
    "one-value": lambda: np.full((2, 3, 4), 0.37, np.float32),
    "tiny": lambda: np.random.default_rng(4).standard_normal((2, 3, 4)).astype(np.float32) * 1e-30,
    "ties": _ties,
}


@pytest.mark.parametrize("data", DQL_DATA)
@pytest.mark.parametrize("opset", [11, 21])  # the Reduce ops take their axes as an input from 18 (none given: all)
def test_dynamicquantizelinear_equals_onnxruntimes_bit_for_bit(data, opset):
    model, feeds = dql(opset=opset), {"x": DQL_DATA[data]()}
    new = apply(model, "n", DynamicQuantizeLinearAsFloat())
    before, after = run_ort(model, feeds), run_ort(new, feeds)
    assert _diff(before, after) == 0.0, (before, after)
    if data == "all-zero":
        assert before[1] == 1.0 and before[2] == 0 and not before[0].any()


def test_dynamicquantizelinear_equals_onnxruntimes_on_many_draws():
    """Scales of every size, a large tensor (ONNX Runtime quantizes it in blocks, on threads): equal everywhere."""
    model = dql((4, 3, 50, 70))
    new = apply(model, "n", DynamicQuantizeLinearAsFloat())
    rng = np.random.default_rng(5)
    for i in range(20):
        x = (rng.standard_normal((4, 3, 50, 70)) * 10.0 ** rng.uniform(-6, 6) + rng.uniform(-3, 3)).astype(np.float32)
        assert _diff(run_ort(model, {"x": x}), run_ort(new, {"x": x})) == 0.0, i


@pytest.mark.slow
@pytest.mark.tensorrt
def test_dynamicquantizelinear_parses_and_builds(tmp_path):
    """y and the zero point are the network's outputs: a Cast to uint8 straight into a network output parses."""
    assert check_rewrite(dql(), "n", DynamicQuantizeLinearAsFloat(), {"x": DQL_DATA["normal"]()}, 0.0, tmp_path) == 0


# --- ConvInteger --------------------------------------------------------------------------------------------------

def conv_integer(w_elem=UINT8, x_zp: int | None = 131, w_zp=77, w_input: bool = False, opset: int = 13,
                 **attrs) -> tuple[onnx.ModelProto, dict]:
    """x uint8 [1, 4, 9, 11] an input, w [6, 4 / group, 3, 3] a constant (or an input); the zero points
    constants (`w_zp` a list: one per output channel)."""
    attrs = {"pads": [1, 2, 1, 0], "strides": [2, 1], "kernel_shape": [3, 3]} | attrs
    group = attrs.get("group", 1)
    w = _ints((6, 4 // group, 3, 3), w_elem, 7)
    zps = [numpy_helper.from_array(np.asarray(x_zp, np.uint8), "xz")] if x_zp is not None else []
    if w_zp is not None:
        zps.append(numpy_helper.from_array(np.asarray(w_zp, NP[w_elem]), "wz"))
    names = ["x", "w"] + (["xz"] if x_zp is not None else [""] if w_zp is not None else []) + \
        (["wz"] if w_zp is not None else [])
    inputs = [("x", UINT8, [1, 4, 9, 11])] + ([("w", w_elem, list(w.shape))] if w_input else [])
    inits = zps + ([] if w_input else [numpy_helper.from_array(w, "w")])
    model = _model([helper.make_node("ConvInteger", names, ["y"], name="n", **attrs)], inputs, [("y", INT32, None)],
                   inits, opset)
    return model, {"x": _ints((1, 4, 9, 11), UINT8, 8)} | ({"w": w} if w_input else {})


CONV_CASES = {
    "zero-points-padded": {},
    "no-zero-points": {"x_zp": None, "w_zp": None},
    "w-zero-point-only": {"x_zp": None},
    "int8-weights-dilated": {"w_elem": INT8, "w_zp": -3, "dilations": [2, 1]},
    "grouped": {"group": 2, "w_zp": 0},
    "weights-an-input": {"w_input": True},
    "opset-10-no-round": {"opset": 10},
}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", CONV_CASES)
def test_convinteger_becomes_conv(case, tmp_path):
    model, feeds = conv_integer(**CONV_CASES[case])
    assert check_rewrite(model, "n", ConvIntegerAsConv(), feeds, 0.0, tmp_path) == 0


def test_convinteger_per_channel_weight_zero_point_equals_the_reference():
    """A 1-D w_zero_point (per output channel, as the spec allows; ONNX Runtime's ConvInteger takes only one)
    against ONNX's reference implementation."""
    from onnx.reference import ReferenceEvaluator

    model, feeds = conv_integer(w_zp=[3, 250, 0, 128, 77, 19])
    new = apply(model, "n", ConvIntegerAsConv())
    (want,), (got,) = ReferenceEvaluator(model).run(None, feeds), run_ort(new, feeds)
    assert got.dtype == np.int32 and np.array_equal(want, got)


# --- MatMulInteger ------------------------------------------------------------------------------------------------

def matmul_integer(a_shape=(2, 5, 16), b_elem=UINT8, a_zp=128, b_zp=121, b_input: bool = False, b_bits: int = 8,
                   ) -> tuple[onnx.ModelProto, dict]:
    """a uint8 an input, b [16, 8] a constant (or an input) of `b_bits` bits; zero points constants (lists: per
    row / column)."""
    b = _ints((16, 8), b_elem, 9, b_bits)
    inits = [numpy_helper.from_array(np.asarray(a_zp, np.uint8), "az"),
             numpy_helper.from_array(np.asarray(b_zp, NP[b_elem]), "bz")]
    inputs = [("a", UINT8, list(a_shape))] + ([("b", b_elem, [16, 8])] if b_input else [])
    inits += [] if b_input else [numpy_helper.from_array(b, "b")]
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"], name="n")
    model = _model([node], inputs, [("y", INT32, None)], inits)
    return model, {"a": _ints(a_shape, UINT8, 10)} | ({"b": b} if b_input else {})


MATMUL_CASES = {
    "batched": {},
    "int8-b-per-column": {"b_elem": INT8, "b_zp": list(range(-4, 4)), "b_bits": 7},  # see the test below
    "b-an-input": {"b_input": True, "a_shape": (5, 16)},
}


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("case", MATMUL_CASES)
def test_matmulinteger_becomes_matmul(case, tmp_path):
    model, feeds = matmul_integer(**MATMUL_CASES[case])
    assert check_rewrite(model, "n", MatMulIntegerAsMatMul(), feeds, 0.0, tmp_path) == 0


def test_matmulinteger_of_int8_weights_is_exact_where_onnxruntime_saturates():
    """ONNX Runtime's uint8 x int8 kernel on a CPU without VNNI (AVX2's pmaddubsw) adds two raw products at a time
    into int16, saturating at 32767 (why quantize_dynamic has reduce_range: 7-bit weights never saturate, the case
    above); the rewrite computes the spec's exact sums, ONNX's reference implementation's. Where this ONNX Runtime
    saturates (this machine), prepare's check measures the difference and keeps the node."""
    from onnx.reference import ReferenceEvaluator

    model, feeds = matmul_integer(b_elem=INT8, b_zp=-3)
    new = apply(model, "n", MatMulIntegerAsMatMul())
    (want,), (got,) = ReferenceEvaluator(model).run(None, feeds), run_ort(new, feeds)
    assert got.dtype == np.int32 and np.array_equal(want, got)


def test_matmulinteger_per_row_a_zero_point_is_the_specs():
    """A 1-D a_zero_point of a 2-D a is one per row (the spec; ONNX Runtime takes one only, and ONNX's reference
    implementation broadcasts it along the rows): against the integer product in numpy."""
    zero = [0, 255, 128, 3, 90]
    model, feeds = matmul_integer(a_shape=(5, 16), a_zp=zero)
    new = apply(model, "n", MatMulIntegerAsMatMul())
    b = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "b"))
    want = (feeds["a"].astype(np.int64) - np.array(zero)[:, None]) @ (b.astype(np.int64) - 121)
    (got,) = run_ort(new, feeds)
    assert got.dtype == np.int32 and np.array_equal(want, got)


# --- DynamicQuantizeLinear with what reads it ---------------------------------------------------------------------

def quantized_conv() -> onnx.ModelProto:
    """What quantize_dynamic makes of a Conv: x quantized, ConvInteger, the int32 result scaled back to float."""
    w = _ints((6, 3, 3, 3), UINT8, 11)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="q"),
             helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], name="c", pads=[1, 1, 1, 1]),
             helper.make_node("Cast", ["acc"], ["accf"], to=FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.asarray(119, np.uint8), "wz"),
             numpy_helper.from_array(np.asarray(0.013, np.float32), "ws")]
    return _model(nodes, [("x", FLOAT, [1, 3, 12, 16])], [("y", FLOAT, None)], inits)


def quantized_attention() -> onnx.ModelProto:
    """Two activations quantized and multiplied (attention's Q K^T): one rewrite takes both quantizers."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["q"], ["qq", "qs", "qz"], name="dq"),
             helper.make_node("DynamicQuantizeLinear", ["k"], ["kq", "ks", "kz"], name="dk"),
             helper.make_node("MatMulInteger", ["qq", "kq", "qz", "kz"], ["acc"], name="m"),
             helper.make_node("Cast", ["acc"], ["accf"], to=FLOAT),
             helper.make_node("Mul", ["qs", "ks"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    return _model(nodes, [("q", FLOAT, [2, 6, 8]), ("k", FLOAT, [2, 8, 5])], [("y", FLOAT, None), ("kq", UINT8, None)])


@pytest.mark.tensorrt
def test_dynamicquantizelinear_takes_the_convinteger_reading_it(tmp_path):
    model = quantized_conv()
    feeds = {"x": np.random.default_rng(12).standard_normal((1, 3, 12, 16)).astype(np.float32)}
    assert check_rewrite(model, "q", DynamicQuantizeLinearAsFloat(), feeds, 0.0, tmp_path) == 0
    new = apply(model, "q", DynamicQuantizeLinearAsFloat())
    assert {"DynamicQuantizeLinear", "ConvInteger"}.isdisjoint(n.op_type for n in new.graph.node)
    with pytest.raises(KeyError):  # gone with the quantizer: prepare skips it
        apply(new, "c", ConvIntegerAsConv())


@pytest.mark.tensorrt
def test_dynamicquantizelinear_takes_a_matmul_of_two_quantized_activations(tmp_path):
    """kq is also a graph output: it stays uint8, cast into the output."""
    rng = np.random.default_rng(13)
    feeds = {"q": rng.standard_normal((2, 6, 8)).astype(np.float32),
             "k": rng.uniform(-1, 3, (2, 8, 5)).astype(np.float32)}
    assert check_rewrite(quantized_attention(), "dq", DynamicQuantizeLinearAsFloat(), feeds, 0.0, tmp_path) == 0


def test_what_the_rules_refuse():
    # a ConvInteger alone reading a quantizer's uint8 would need a uint8 tensor between nodes
    assert "dynamicquantizelinear-float" in _refusal(quantized_conv(), "c", ConvIntegerAsConv())
    # a quantizer read by another op than the integer ones
    other = dql()
    other.graph.node.append(helper.make_node("Cast", ["y"], ["yf"], to=FLOAT))
    other.graph.output.append(helper.make_tensor_value_info("yf", FLOAT, None))
    assert "read by Cast" in _refusal(other, "n", DynamicQuantizeLinearAsFloat())
    # sums float32 would not hold exactly: b an input, K = 1024, 1024 * 255 * 255 > 2^24
    nodes = [helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="n")]
    big = _model(nodes, [("a", UINT8, [4, 1024]), ("b", UINT8, [1024, 4])], [("y", INT32, None)])
    assert "2^24" in _refusal(big, "n", MatMulIntegerAsMatMul())
    # ... and where K is not known
    dynamic = _model(nodes, [("a", UINT8, [4, "k"]), ("b", UINT8, ["k", 4])], [("y", INT32, None)])
    assert "static shapes" in _refusal(dynamic, "n", MatMulIntegerAsMatMul())


# --- a real model: ddddocr's dynamically quantized CRNN -----------------------------------------------------------

DDDDOCR = "ddddocr==1.6.1"
LSTM_IN, LSTM_OUT, LOGITS = "227", "361", "387"  # the DynamicQuantizeLSTM's input and output; [T, 1, 8210] out


def rewrite_all(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every rule on every node it is for, one node at a time in the graph's order as prepare applies them (a
    DynamicQuantizeLinear takes its ConvInteger with it: that node is gone when its turn comes)."""
    for name, op in [(n.name, n.op_type) for n in model.graph.node if n.op_type in RULES]:
        if any(n.name == name for n in model.graph.node):
            model = apply(model, name, RULES[op])
    return model


@pytest.fixture(scope="module")
def crnn() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    from tests.assets import wheel_file

    model = onnx.load(wheel_file(DDDDOCR, "ddddocr/common_old.onnx"))
    return model, rewrite_all(model)


def captcha(text: str, width: int = 160) -> np.ndarray:
    """`text` drawn dark on a white 64 x width grayscale image, / 255: ddddocr's input1 [1, 1, 64, width]."""
    import cv2

    img = np.full((64, width), 255, np.uint8)
    cv2.putText(img, text, (6, 46), cv2.FONT_HERSHEY_SIMPLEX, 1.4, 30, 3, cv2.LINE_AA)
    return (img.astype(np.float32) / 255.0)[None, None]


def decode(logits: np.ndarray) -> list[int]:
    """Greedy CTC: argmax per step, repeats collapsed, blank (0) dropped."""
    best = logits.argmax(axis=-1).reshape(-1)
    return [int(c) for i, c in enumerate(best) if c != 0 and (i == 0 or c != best[i - 1])]


@pytest.mark.slow
def test_crnn_rewritten_keeps_ddddocrs_outputs(crnn):
    """All 22 DynamicQuantizeLinear, 21 ConvInteger and the MatMulInteger replaced (the DynamicQuantizeLSTM left to
    ONNX Runtime); the logits equal the original's (max abs diff measured 0.0: the rewrite is exact) and so does the
    decoded text, on two captchas and two widths."""
    model, new = crnn
    ops = [n.op_type for n in new.graph.node]
    assert not {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"} & set(ops)
    assert ops.count("DynamicQuantizeLSTM") == 1 and ops.count("Conv") == 21 and ops.count("MatMul") == 1
    for text, width in (("a7kq", 160), ("x3Mp9", 200)):
        feeds = {"input1": captcha(text, width)}
        (logits,), (logits_new,) = run_ort(model, feeds), run_ort(new, feeds)
        assert logits.shape == (width // 8, 1, 8210)
        assert _diff([logits], [logits_new]) <= 1e-6
        assert decode(logits) == decode(logits_new) and len(decode(logits)) >= 3


@pytest.mark.slow
@pytest.mark.tensorrt
def test_crnn_rewritten_parses_but_for_its_lstm_and_builds(crnn, tmp_path):
    """The parser refuses only the DynamicQuantizeLSTM of the rewritten model; with that node cut out (its input a
    network output, its output a network input) the rest parses and a trial engine builds."""
    import onnx_graphsurgeon as gs

    from trtflow.stages.trt.preflight import run_preflight

    _, new = crnn
    path = tmp_path / "rewritten.onnx"
    onnx.save(new, path)
    report = run_preflight(path)
    assert report.ran and [f.op_type for f in report.failures] == ["DynamicQuantizeLSTM"], report.failures

    graph = gs.import_onnx(new)
    tensors = graph.tensors()
    lstm_out = tensors[LSTM_OUT]
    lstm_out.shape, lstm_out.dtype = [20, 2, 1, 512], np.float32
    tensors[LSTM_IN].dtype = np.float32
    graph.inputs, graph.outputs = [tensors["input1"], lstm_out], [tensors[LSTM_IN], tensors[LOGITS]]
    cut = gs.export_onnx(graph.cleanup().toposort(), do_type_check=False)
    cut.ir_version = new.ir_version
    del cut.opset_import[:]
    cut.opset_import.extend(new.opset_import)
    onnx.save(cut, tmp_path / "cut.onnx")
    report = run_preflight(tmp_path / "cut.onnx", {"input1": [1, 1, 64, 160], LSTM_OUT: [20, 2, 1, 512]})
    assert report.parsed, report.failures
    assert report.trial_build is not None and report.trial_build.ok, report.trial_build
