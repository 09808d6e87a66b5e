"""Issue #54: how much of a variant's compute runs at which precision, as TensorRT builds the graph (strongly
typed), and the release ranking an INT8 engine above an FP16 one only when that, or a GPU, supports it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtflow.pipelines.params.release import Select
from trtflow.stages.onnx.composition import Composition, Shares, composition
from trtflow.stages.release import selection
from trtflow.stages.release.report import Option


def _qdq_then_float() -> onnx.ModelProto:
    """x -Q/DQ-> Conv(8->16, 3x3, weights Q/DQ INT8) -> Relu between Q/DQ -> Conv(16->16, 1x1, float) -> y, at
    [N, 8, 16, 16]: the first Conv and the Relu are INT8 on TensorRT, the second Conv FP32."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-100, 100, (16, 8, 3, 3)).astype(np.int8), "w1_q"),
             numpy_helper.from_array(np.full(16, 0.01, np.float32), "w1_s"),
             numpy_helper.from_array(np.zeros(16, np.int8), "w1_z"),
             numpy_helper.from_array(np.array(0.02, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(rng.normal(0, 0.1, (16, 16, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w1_q", "w1_s", "w1_z"], ["w1"], axis=0),
             helper.make_node("Conv", ["xd", "w1"], ["h"], name="int8_conv", pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["h", "s", "z"], ["hq"]),
             helper.make_node("DequantizeLinear", ["hq", "s", "z"], ["hd"]),
             helper.make_node("Relu", ["hd"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="float_conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16, 16, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_macs_of_a_qdq_conv_are_int8_and_of_a_float_one_fp32_counted_at_the_shapes_given():
    model = _qdq_then_float()
    int8_macs, fp32_macs = 16 * 256 * 8 * 9, 16 * 256 * 16
    c = composition(model, {"x": [2, 8, 16, 16]})
    assert c.macs == 2 * (int8_macs + fp32_macs) and c.unsized == 0
    assert c.mac_share.int8 == pytest.approx(int8_macs / (int8_macs + fp32_macs))
    assert c.mac_share.fp32 == pytest.approx(fp32_macs / (int8_macs + fp32_macs)) and c.mac_share.fp16 == 0
    assert c.other_share.int8 == 1.0  # the Relu between Q/DQ pairs: TensorRT fuses it in INT8
    assert c.shapes == {"x": [2, 8, 16, 16]}
    assert c.mostly_fp32("int8") is None  # 18% in FP32
    assert composition(model, {}).shapes == {"x": [1, 8, 16, 16]}  # a dynamic dim not given: 1


def _option(name: str, precision: str, rate: float, fp32_macs: float, fp32_other: float,
            measured_by: str = "onnxruntime 1.23 (CPU)") -> Option:
    low = {"int8": "int8", "fp16": "fp16"}.get(precision, "fp32")
    macs = Shares(**{low: 1 - fp32_macs, "fp32": fp32_macs}) if low != "fp32" else Shares(fp32=1.0)
    other = Shares(**{low: 1 - fp32_other, "fp32": fp32_other}) if low != "fp32" else Shares(fp32=1.0)
    return Option(name=name, variant=precision, precision=precision, target="t", profiles=["p"], engine_bytes=1000,
                  engine_sha256="0" * 64, samples_per_s=rate, measured_by=measured_by,
                  composition=Composition(macs=10**9, mac_share=macs, other_share=other, shapes={"x": [1]}))


def test_an_int8_engine_with_an_fp32_remainder_is_not_ranked_above_fp16_on_cpu_numbers():
    rule = Select(prefer="throughput")
    ranked = selection.rank([_option("fp32.p", "fp32", 100, 1, 1), _option("fp16.p", "fp16", 150, 0, 0.02),
                             _option("int8.p", "int8", 300, 0.02, 0.85)], rule)
    assert [o.name for o in ranked] == ["int8.p", "fp16.p", "fp32.p"]  # by the CPU stand-in's numbers
    ranked, said = selection.int8_over_fp16(ranked, rule)
    assert [(o.name, o.rank) for o in ranked] == [("fp16.p", 1), ("int8.p", 2), ("fp32.p", 3)]
    assert said == ("int8.p ranked below fp16.p: it computes more in FP32 (2% of MACs and 85% of other ops, "
                    "against 0% of MACs and 2% of other ops), and no GPU measured them (onnxruntime 1.23 "
                    "(CPU) did)")


def test_an_int8_engine_with_an_fp16_remainder_or_measured_on_a_gpu_keeps_its_rank():
    rule = Select(prefer="throughput")
    fp16_remainder = [_option("fp16.p", "fp16", 150, 0, 0.02), _option("int8.p", "int8", 300, 0, 0.03)]
    ranked, said = selection.int8_over_fp16(selection.rank(fp16_remainder, rule), rule)
    assert [o.name for o in ranked] == ["int8.p", "fp16.p"]
    assert said.startswith("int8.p above fp16.p: supported by its composition (0% of MACs and 3% of other ops in "
                           "FP32, against 0% of MACs and 2% of other ops)")
    gpu = "trtexec (TensorRT 10.13)"
    on_gpu = [_option("fp16.p", "fp16", 150, 0, 0.02, gpu), _option("int8.p", "int8", 300, 0.02, 0.85, gpu)]
    ranked, said = selection.int8_over_fp16(selection.rank(on_gpu, rule), rule)
    assert [o.name for o in ranked] == ["int8.p", "fp16.p"]
    assert said == f"int8.p above fp16.p: measured on a GPU ({gpu})"
    size = Select(prefer="size")  # a smaller engine is smaller on any machine
    assert selection.int8_over_fp16(selection.rank(on_gpu, size), size)[1] == ""
