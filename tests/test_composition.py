"""Issue #54: how much of a variant's compute runs at which precision, as TensorRT builds the graph (strongly
typed), and the release ranking an INT8 engine above an FP16 one only when that, or a GPU, supports it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtflow.pipelines.params.release import Select
from trtflow.stages.onnx.composition import composition
from trtflow.stages.onnx.records import Composition, Shares
from trtflow.stages.release import estimate, selection
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
            measured_by: str = "onnxruntime 1.23 (CPU)", target: str = "sm86") -> Option:
    """An engine of 1 GMAC and 50 M other-op elements per inference, its estimate on `target` made as release
    makes it."""
    low = {"int8": "int8", "fp16": "fp16"}.get(precision, "fp32")
    macs = Shares(**{low: 1 - fp32_macs, "fp32": fp32_macs}) if low != "fp32" else Shares(fp32=1.0)
    other = Shares(**{low: 1 - fp32_other, "fp32": fp32_other}) if low != "fp32" else Shares(fp32=1.0)
    made = Composition(macs=10**9, mac_share=macs, other_share=other, shapes={"x": [1]}, elements=5 * 10**7)
    gpu, said = estimate.gpu_class(target, [])
    return Option(name=name, variant=precision, precision=precision, target=target, profiles=["p"],
                  engine_bytes=1000, engine_sha256="0" * 64, samples_per_s=rate, measured_by=measured_by,
                  composition=made, estimate=estimate.estimate(made, gpu, said))


def test_cpu_numbers_never_rank_fp32_above_the_precisions_a_gpu_runs_faster():
    """Issue #69 item 1: ONNX Runtime on a CPU runs FP32 fastest and emulates FP16 and INT8; ranked by its
    numbers, FP32 shipped on every machine without a GPU. Across precisions the estimate decides, said so."""
    rule = Select(prefer="throughput")
    ranked = selection.rank([_option("fp32.p", "fp32", 5219, 1, 1), _option("fp16.p", "fp16", 2455, 0, 0.02),
                             _option("int8.p", "int8", 2639, 0, 0.03)], rule)
    assert [o.name for o in ranked] == ["fp32.p", "int8.p", "fp16.p"]  # by the CPU stand-in's numbers
    ranked, said = selection.across_precisions(ranked, rule)
    assert [(o.name, o.rank) for o in ranked] == [("int8.p", 1), ("fp16.p", 2), ("fp32.p", 3)]
    assert said.startswith("estimated, not measured: INT8 ~") and "on sm86 (GeForce RTX 3090 figures)" in said
    assert "onnxruntime 1.23 (CPU)'s numbers order the engines of one precision" in said
    assert "replaces the estimate" in said
    rates = {o.name: o.estimate.samples_per_s for o in ranked}
    assert rates["int8.p"] > rates["fp16.p"] > 1.5 * rates["fp32.p"]  # memory-bound here: bytes halve


def test_an_int8_engine_with_an_fp32_remainder_is_not_ranked_above_fp16_on_cpu_numbers():
    rule = Select(prefer="throughput")
    ranked = selection.rank([_option("fp32.p", "fp32", 100, 1, 1), _option("fp16.p", "fp16", 150, 0, 0.02),
                             _option("int8.p", "int8", 300, 0.02, 0.85)], rule)
    assert [o.name for o in ranked] == ["int8.p", "fp16.p", "fp32.p"]  # by the CPU stand-in's numbers
    ranked, said = selection.across_precisions(ranked, rule)
    assert [(o.name, o.rank) for o in ranked] == [("fp16.p", 1), ("int8.p", 2), ("fp32.p", 3)]
    assert said.startswith("estimated, not measured: FP16 ~")


def test_engines_of_one_precision_keep_the_cpu_order_and_a_gpu_measurement_decides_across():
    rule = Select(prefer="throughput")
    two = [_option("fp16.a", "fp16", 100, 0, 0.02), _option("fp16.b", "fp16", 150, 0, 0.02),
           _option("fp32.a", "fp32", 400, 1, 1)]
    ranked, said = selection.across_precisions(selection.rank(two, rule), rule)
    assert [o.name for o in ranked] == ["fp16.b", "fp16.a", "fp32.a"] and said.startswith("estimated")
    gpu = "trtexec (TensorRT 10.13)"
    on_gpu = [_option("fp16.p", "fp16", 150, 0, 0.02, gpu), _option("int8.p", "int8", 300, 0.02, 0.85, gpu)]
    ranked, said = selection.across_precisions(selection.rank(on_gpu, rule), rule)
    assert [o.name for o in ranked] == ["int8.p", "fp16.p"]
    assert said == f"by the numbers a GPU measured ({gpu})"
    size = Select(prefer="size")  # a smaller engine is smaller on any machine
    assert selection.across_precisions(selection.rank(on_gpu, size), size)[1] == ""


def test_a_shipped_engine_of_another_precision_is_challenged_on_the_estimate():
    rule = Select(prefer="throughput")
    options = [_option("fp32.p", "fp32", 5219, 1, 1), _option("fp16.p", "fp16", 2455, 0, 0.02)]
    ranked, _ = selection.across_precisions(selection.rank(options, rule), rule)
    kept, said = selection.keep_previous(ranked, "fp32.p", rule)
    assert kept[0].name == "fp16.p" and said.startswith("fp16.p replaces fp32.p: ") and "by the estimate" in said
    same = [_option("fp32.p", "fp32", 5219, 1, 1), _option("int8.p", "int8", 2639, 0.5, 0.5)]
    ranked, _ = selection.across_precisions(selection.rank(same, rule), rule)
    kept, said = selection.keep_previous(ranked, "fp32.p", rule)
    assert ranked[0].name == "int8.p" and kept[0].name == "int8.p", said


def test_the_gpu_class_is_the_target_or_the_gpu_a_native_build_ran_on_else_assumed_and_said():
    assert estimate.gpu_class("sm89", [])[1] == "sm89 (GeForce RTX 4090 figures)"
    assert estimate.gpu_class("native", ["8.6"])[1] == "sm86 (GeForce RTX 3090 figures)"
    gpu, said = estimate.gpu_class("native", [])
    assert gpu.target == "sm75" and said.startswith("sm75 assumed (target native names no GPU")
    assert estimate.gpu_class("sm121", [])[1].startswith("sm75 assumed (sm121 is not in the table")


def _lstm_encoder(path) -> onnx.ModelProto:
    """A speaker-encoder-shaped model, trained for a few steps: 2 LSTM layers over 40 mel bins, then a Linear
    to a 32-d embedding (most of its compute is in the LSTMs)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(40, 64, num_layers=2, batch_first=True)
            self.proj = torch.nn.Linear(64, 32)

        def forward(self, x):
            h, _ = self.lstm(x)
            return self.proj(h[:, -1])

    net = Encoder()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x = torch.randn(8, 50, 40)
    for _ in range(5):
        loss = (net(x) - x[:, :32, 0]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.onnx.export(net.eval(), (x[:1],), str(path), dynamo=False, opset_version=17, input_names=["x"],
                      output_names=["e"], dynamic_axes={"x": {0: "n", 1: "t"}, "e": {0: "n"}})
    return onnx.load(path)


@pytest.mark.slow
def test_the_recurrent_layers_of_an_int8_variant_count_in_fp32(tmp_path):
    """Issue #69 item 4: an LSTM encoder whose Linear is quantized was shown "100% INT8" (LSTMs not counted)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    model = _lstm_encoder(tmp_path / "fp32.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": np.random.default_rng(i).normal(size=(1, 50, 40)).astype(np.float32)}
                                 for i in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(tmp_path / "fp32.onnx"), str(tmp_path / "int8.onnx"), Reader(), quant_format=QuantFormat.QDQ)
    c = composition(onnx.load(tmp_path / "int8.onnx"), {"x": [1, 100, 40]})
    lstm = 100 * (4 * 64 * (40 + 64) + 4 * 64 * (64 + 64))  # two layers, every step, W and R
    proj = 64 * 32
    assert c.macs == lstm + proj and c.unsized == 0, c
    assert c.mac_share.fp32 == pytest.approx(lstm / (lstm + proj)) and c.mac_share.int8 > 0
    assert c.mostly_fp32("int8") is not None  # the card warns it runs mostly as an FP32 engine
    assert composition(model, {"x": [1, 100, 40]}).macs == lstm + proj


def _body(name: str, k: int, rng) -> onnx.GraphProto:
    """A graph of one MatMul reading the outer graph's `x` [1, 16] by a [16, k] weight."""
    w = numpy_helper.from_array(rng.normal(size=(16, k)).astype(np.float32), f"{name}_w")
    return helper.make_graph([helper.make_node("MatMul", ["x", f"{name}_w"], [f"{name}_y"])], name, [],
                             [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, k])], [w])


def test_ops_inside_if_and_loop_bodies_count_a_loop_by_its_trip_count():
    rng = np.random.default_rng(0)
    cond = numpy_helper.from_array(np.array(True), "cond")
    trips = numpy_helper.from_array(np.array(5, np.int64), "trips")
    loop_body = helper.make_graph(
        [helper.make_node("MatMul", ["x", "lw"], ["step"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "loop", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("step", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(rng.normal(size=(16, 8)).astype(np.float32), "lw")])
    nodes = [helper.make_node("If", ["cond"], ["branch"], then_branch=_body("big", 64, rng),
                              else_branch=_body("small", 4, rng)),
             helper.make_node("Loop", ["trips", "cond"], ["steps"], body=loop_body)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("branch", TensorProto.FLOAT, [1, None]),
                               helper.make_tensor_value_info("steps", TensorProto.FLOAT, [None, 1, 8])],
                              [cond, trips])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    c = composition(model, {})
    assert c.macs == 16 * 64 + 5 * 16 * 8 and c.untimed == 0, c  # the larger branch, and the body five times
    computed = onnx.ModelProto()
    computed.CopyFrom(model)
    computed.graph.node[1].input[0] = "n"
    computed.graph.input.append(helper.make_tensor_value_info("n", TensorProto.INT64, []))
    c = composition(computed, {})
    assert c.macs == 16 * 64 + 16 * 8 and c.untimed == 1 and "trip count unknown" in c.line()


def test_einsum_and_a_gru_count_their_multiply_accumulates():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(1, 3 * 8, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(size=(1, 3 * 8, 8)).astype(np.float32), "R"),
             numpy_helper.from_array(rng.normal(size=(4, 6)).astype(np.float32), "E")]
    nodes = [helper.make_node("GRU", ["x", "W", "R"], ["h"], hidden_size=8),
             helper.make_node("Einsum", ["x", "E"], ["z"], equation="tbi,ij->tbj")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, 2, 4])],
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    c = composition(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {})
    assert c.macs == 10 * 2 * (3 * 8 * 4 + 3 * 8 * 8) + 10 * 2 * 4 * 6 and c.unsized == 0, c
