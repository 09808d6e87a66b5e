"""Issue #68, partial offload: a model whose middle TensorRT's parser refuses is cut at the parser's partition
into TensorRT and ONNX Runtime pieces; each TensorRT piece builds with the real parser and builder
(tensorrt_rtx, no GPU needed), and the chain of pieces run on ONNX Runtime computes exactly what the whole model
does."""
from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.records import read_chain
from trtflow.stages.onnx.split import Segment, prepared, run_chain, segments, split
from trtflow.stages.ort.runner import run, session
from trtflow.stages.trt.env import find_tensorrt

needs_trt = pytest.mark.skipif(find_tensorrt() is None, reason="no TensorRT flavour installed")


def _w(name: str, *shape: int) -> onnx.TensorProto:
    """A weight seeded by its name: a model is the same whichever tests built models before it in the process."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def _i64(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes, inputs, outputs, inits, opset=19) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "m", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _backbone(x: str = "x") -> list[onnx.NodeProto]:
    return [helper.make_node("Conv", [x, "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
            helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c2"], ["feat"], name="relu2")]


def _backbone_weights() -> list[onnx.TensorProto]:
    return [_w("w1", 8, 3, 3, 3), _w("b1", 8), _w("w2", 8, 8, 3, 3), _w("b2", 8)]


def detector() -> onnx.ModelProto:
    """A detector's post-processing: a score map thresholded, NonZero picking the locations that pass, the
    features at those locations gathered and decoded into boxes by a small head (TensorRT-RTX's parser refuses
    NonZero: it wants a plugin it has not got). Outputs: boxes [K, 4] and their scores [K]."""
    nodes = _backbone() + [
        helper.make_node("Conv", ["feat", "ws"], ["logit"], name="score_conv"),
        helper.make_node("Sigmoid", ["logit"], ["prob"], name="score"),
        helper.make_node("Reshape", ["prob", "flat"], ["prob_flat"], name="flatten_scores"),
        helper.make_node("Greater", ["prob_flat", "threshold"], ["keep"], name="threshold"),
        helper.make_node("NonZero", ["keep"], ["where"], name="select"),
        helper.make_node("Reshape", ["where", "flat"], ["idx"], name="indices"),
        helper.make_node("Reshape", ["feat", "per_location"], ["feat_cl"], name="features"),
        helper.make_node("Transpose", ["feat_cl"], ["feat_lc"], name="locations_first", perm=[1, 0]),
        helper.make_node("Gather", ["feat_lc", "idx"], ["picked"], name="pick_features", axis=0),
        helper.make_node("Gemm", ["picked", "wh", "bh"], ["raw"], name="box_head"),
        helper.make_node("Relu", ["raw"], ["boxes"], name="box_sizes"),
        helper.make_node("Gather", ["prob_flat", "idx"], ["scores"], name="pick_scores", axis=0)]
    return _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                  [helper.make_tensor_value_info("boxes", TP.FLOAT, ["K", 4]),
                   helper.make_tensor_value_info("scores", TP.FLOAT, ["K"])],
                  _backbone_weights() + [_w("ws", 1, 8, 1, 1), _i64("flat", [-1]), _i64("per_location", [8, 256]),
                                         numpy_helper.from_array(np.array(0.5, np.float32), "threshold"),
                                         _w("wh", 8, 4), _w("bh", 4)])


def deformable() -> onnx.ModelProto:
    """A DeformConv between convolutions, its offsets from a conv of the features (as DCNv1 blocks are): the
    parser refuses DeformConv when no rewrite replaced it."""
    nodes = _backbone() + [
        helper.make_node("Conv", ["feat", "w_off", "b_off"], ["offsets"], name="offsets", pads=[1, 1, 1, 1]),
        helper.make_node("DeformConv", ["feat", "w_dc", "offsets"], ["d"], name="deform", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),
        helper.make_node("Relu", ["d"], ["rd"], name="relu3"),
        helper.make_node("Conv", ["rd", "w_out"], ["y"], name="head", pads=[1, 1, 1, 1])]
    return _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                  [helper.make_tensor_value_info("y", TP.FLOAT, [1, 2, 16, 16])],
                  _backbone_weights() + [_w("w_off", 18, 8, 3, 3), _w("b_off", 18), _w("w_dc", 8, 8, 3, 3),
                                         _w("w_out", 2, 8, 3, 3)])


def plain_cnn() -> onnx.ModelProto:
    nodes = _backbone() + [helper.make_node("GlobalAveragePool", ["feat"], ["pooled"], name="pool"),
                           helper.make_node("Flatten", ["pooled"], ["y"], name="flat")]
    return _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                  [helper.make_tensor_value_info("y", TP.FLOAT, [1, 8])], _backbone_weights())


def vocabulary() -> onnx.ModelProto:
    """Outputs from every piece: a segmentation head's distinct class ids (Unique, which the parser refuses: the
    middle piece makes them, the model outputs them and the suffix reads them), the features (the prefix makes
    them, the model outputs them and the suffix reads them), and per class present an embedding weighted by its
    pixel count and the mean of the feature channel of that id."""
    nodes = _backbone() + [
        helper.make_node("Conv", ["feat", "wc"], ["logits"], name="classes"),
        helper.make_node("ArgMax", ["logits"], ["label"], name="label", axis=1, keepdims=0),
        helper.make_node("Reshape", ["label", "flat"], ["labels"], name="flatten"),
        helper.make_node("Unique", ["labels"], ["ids", "", "", "counts"], name="distinct", sorted=1),
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed", axis=0),
        helper.make_node("Cast", ["counts"], ["countf"], name="count_float", to=TP.FLOAT),
        helper.make_node("Unsqueeze", ["countf", "one"], ["count_col"], name="column"),
        helper.make_node("Mul", ["emb", "count_col"], ["summary"], name="weight"),
        helper.make_node("Gather", ["feat", "ids"], ["channels"], name="channels", axis=1),
        helper.make_node("ReduceMean", ["channels", "hw"], ["presence"], name="presence", keepdims=0)]
    return _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                  [helper.make_tensor_value_info("summary", TP.FLOAT, ["N", 6]),
                   helper.make_tensor_value_info("ids", TP.INT64, ["N"]),
                   helper.make_tensor_value_info("feat", TP.FLOAT, [1, 8, 16, 16]),
                   helper.make_tensor_value_info("presence", TP.FLOAT, [1, "N"])],
                  _backbone_weights() + [_w("wc", 5, 8, 1, 1), _i64("flat", [-1]), _w("table", 5, 6),
                                         _i64("one", [1]), _i64("hw", [2, 3])])


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def _whole(model: onnx.ModelProto, tmp_path, feeds: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    path = tmp_path / "whole.onnx"
    model_io.save(model, path)
    return run(session(path), feeds or _feeds())


def _partition(model: onnx.ModelProto, tmp_path):
    from trtflow.stages.trt.partition import partition

    path = tmp_path / "model.onnx"
    model_io.save(model, path)
    return partition(path, _feeds(), tmp_path / "offload")


def _same(chain_outputs: dict[str, np.ndarray], whole: dict[str, np.ndarray]) -> None:
    assert chain_outputs.keys() == whole.keys()
    for name, ref in whole.items():
        got = chain_outputs[name]
        assert got.dtype == ref.dtype and got.shape == ref.shape, name
        assert np.array_equal(got, ref), f"{name}: max |diff| {np.abs(got - ref).max()}"


@pytest.mark.slow
@needs_trt
def test_a_detector_with_nonzero_is_cut_into_tensorrt_onnxruntime_tensorrt(tmp_path):
    model = detector()
    found = _partition(model, tmp_path)
    assert found.runtimes() == ["tensorrt", "onnxruntime", "tensorrt"]
    (middle,) = [n for n in found.nodes if n.runtime == "onnxruntime"]
    assert middle.name == "select" and "refused" in middle.why
    assert not any(s.supported for s in found.parser.subgraphs)  # the flag the trials overrule
    prefix, _, suffix = found.chain.pieces
    assert {t.name for t in suffix.inputs} == {"feat_lc", "prob_flat", "where"}  # several inputs, from two pieces
    assert {t.name for t in prefix.outputs} == {"feat_lc", "prob_flat", "keep"}
    assert [t.ok for t in found.trials] == [True, True] and found.rounds == 1
    whole = _whole(model, tmp_path)
    assert 0 < len(whole["scores"]) < 256
    _same(run_chain(found.chain, _feeds()), whole)


@pytest.mark.slow
@needs_trt
def test_a_deformconv_in_the_middle_is_left_to_onnxruntime(tmp_path):
    model = deformable()
    found = _partition(model, tmp_path)
    assert found.runtimes() == ["tensorrt", "onnxruntime", "tensorrt"]
    assert [n.name for n in found.nodes if n.runtime == "onnxruntime"] == ["deform"]
    assert all(t.ok and t.build is not None and t.build.engine_bytes for t in found.trials)
    _same(run_chain(read_chain(tmp_path / "offload" / f"cut{found.rounds}"), _feeds()), _whole(model, tmp_path))


@needs_trt
def test_a_model_the_parser_takes_whole_is_one_tensorrt_piece(tmp_path):
    model = plain_cnn()
    found = _partition(model, tmp_path)
    assert found.parser.supported and found.runtimes() == ["tensorrt"]
    (piece,) = found.chain.pieces
    assert [t.name for t in piece.inputs] == ["x"] and [t.name for t in piece.outputs] == ["y"]
    _same(run_chain(found.chain, _feeds()), _whole(model, tmp_path))


@pytest.mark.slow
@needs_trt
def test_outputs_made_in_the_middle_and_read_later_leave_their_piece(tmp_path):
    model = vocabulary()
    found = _partition(model, tmp_path)
    assert found.runtimes() == ["tensorrt", "onnxruntime", "tensorrt"]
    prefix, middle, suffix = found.chain.pieces
    assert [t.name for t in middle.outputs] == ["ids", "counts"]  # `ids`: a model output and read later
    assert [t.name for t in prefix.outputs] == ["feat", "labels"]  # `feat`: a model output and read later
    assert [(t.name, t.dtype) for t in suffix.inputs] == [("ids", "INT64"), ("counts", "INT64"), ("feat", "FLOAT")]
    assert [t.name for t in suffix.outputs] == ["summary", "presence"]
    _same(run_chain(found.chain, _feeds()), _whole(model, tmp_path))


def test_segments_are_few_runs_in_a_topological_order(tmp_path):
    """Two branches from one input, each with an ONNX Runtime node: the greedy order puts both TensorRT prefixes
    first, both refused nodes next, so three runs instead of five; the chain still equals the model."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"), helper.make_node("Sigmoid", ["a"], ["a2"], name="a2"),
             helper.make_node("Neg", ["x"], ["b"], name="b"), helper.make_node("Sigmoid", ["b"], ["b2"], name="b2"),
             helper.make_node("Add", ["a2", "b2"], ["y"], name="y")]
    model = prepared(_model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
                            [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3]),
                             helper.make_tensor_value_info("a", TP.FLOAT, [2, 3])], []))
    cut = segments(model, ["tensorrt", "onnxruntime", "tensorrt", "onnxruntime", "tensorrt"])
    assert cut == [Segment(runtime="tensorrt", nodes=[0, 2]), Segment(runtime="onnxruntime", nodes=[1, 3]),
                   Segment(runtime="tensorrt", nodes=[4])]
    chain = split(model, cut, tmp_path / "cut")
    assert [[t.name for t in p.outputs] for p in chain.pieces] == [["a", "b"], ["a2", "b2"], ["y"]]
    feeds = {"x": _feeds()["x"][0, :2, 0, :3]}
    _same(run_chain(chain, feeds), _whole(model, tmp_path, feeds))


@pytest.mark.slow
@needs_trt
@pytest.mark.parametrize("how", ["refused", "unbuilt"])
def test_a_tensorrt_piece_that_fails_its_trial_goes_back_to_onnxruntime(tmp_path, monkeypatch, how):
    """The parser's partition is a claim, the trial build the proof. A piece the parser then refuses a node of
    gives ONNX Runtime that node only (and is cut again); a piece that parses and does not build gives it all its
    nodes. Here the trial of any piece holding the box head fails that way: a made-up answer (TensorRT-RTX takes
    this Gemm, and every other piece is tried for real), so this proves what the partition does with a failed trial,
    not which pieces a real TensorRT refuses (the tests above build those)."""
    from trtflow.stages.trt import partition as partitioning
    from trtflow.stages.trt.records import ParseFailure, PreflightReport, TrialBuild

    real = partitioning.run_preflight

    def preflight(model, shapes, **kwargs):
        if "box_head" not in {n.name for n in onnx.load(str(model)).graph.node}:
            return real(model, shapes, **kwargs)
        if how == "refused":
            return PreflightReport(ran=True, parsed=False, failures=[
                ParseFailure(node="box_head", op_type="Gemm", reason="made up by the test")])
        return PreflightReport(ran=True, parsed=True, trial_build=TrialBuild(ok=False, error="made up by the test"))

    monkeypatch.setattr(partitioning, "run_preflight", preflight)
    model = detector()
    found = _partition(model, tmp_path)
    on_ort = [n.name for n in found.nodes if n.runtime == "onnxruntime"]
    if how == "refused":  # the suffix cut around the box head: its Gather before, its Relu after
        assert found.runtimes() == ["tensorrt", "onnxruntime", "tensorrt", "onnxruntime", "tensorrt"]
        assert on_ort == ["select", "box_head"]
    else:
        assert found.runtimes() == ["tensorrt", "onnxruntime"]
        assert on_ort == ["select", "indices", "pick_features", "box_head", "box_sizes", "pick_scores"]
    assert found.rounds == 2 and [t.ok for t in found.trials].count(False) == 1
    assert "made up by the test" in next(n.why for n in found.nodes if n.name == "box_head")
    _same(run_chain(found.chain, _feeds()), _whole(model, tmp_path))


@pytest.mark.slow
@needs_trt
def test_a_piece_that_parses_but_does_not_build_gives_onnx_runtime_only_the_node_the_builder_names(tmp_path):
    """TopK with K over TensorRT's 3840 parses and fails the build naming its layer ('ITopKLayer topk0'): only the
    TopK moves to ONNX Runtime, the Relu before it and the Mul after it stay TensorRT pieces that build."""
    from trtflow.stages.trt.partition import partition

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
             helper.make_node("TopK", ["r", "k"], ["v", "i"], name="topk0"),
             helper.make_node("Mul", ["v", "two"], ["y"], name="mul0")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [1, 5000])],
                   [helper.make_tensor_value_info("y", TP.FLOAT, [1, 4000])],
                   [_i64("k", [4000]), numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    model_io.save(model, tmp_path / "topk.onnx")
    feeds = {"x": np.random.default_rng(0).random((1, 5000), np.float32)}
    cut = partition(tmp_path / "topk.onnx", feeds, tmp_path / "work")
    assert [(n.name, n.runtime) for n in cut.nodes] == [("relu0", "tensorrt"), ("topk0", "onnxruntime"),
                                                        ("mul0", "tensorrt")]
    assert "the builder named it" in cut.nodes[1].why and "3840" in cut.nodes[1].why
    assert all(t.ok for t in cut.trials if t.nodes != ["relu0", "topk0", "mul0"])
    whole = run(session(tmp_path / "topk.onnx"), feeds)
    assert np.array_equal(run_chain(cut.chain, feeds)["y"], whole["y"])


def test_an_fp8_tensor_crosses_a_cut_in_its_own_type(tmp_path):
    """ONNX Runtime hands an FP8 output back to NumPy as uint8; fed to the next piece so, it is refused
    ('expected tensor(Float8E4M3FN)'). The chain hands ONNX Runtime's own values on."""
    nodes = [helper.make_node("Cast", ["x"], ["q"], name="to_fp8", to=TP.FLOAT8E4M3FN),
             helper.make_node("Cast", ["q"], ["y"], name="to_float", to=TP.FLOAT)]
    model = prepared(_model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
                            [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3])], []))
    chain = split(model, segments(model, ["onnxruntime", "tensorrt"]), tmp_path / "cut")
    assert [t.dtype for t in chain.pieces[0].outputs] == ["FLOAT8E4M3FN"]
    feeds = {"x": np.array([[0.1, 1.5, -3.0], [448.0, 0.0, 7.25]], np.float32)}
    model_io.save(model, tmp_path / "whole.onnx")
    assert np.array_equal(run_chain(chain, feeds)["y"], run(session(tmp_path / "whole.onnx"), feeds)["y"])
