"""Small ONNX graphs, built with onnx.helper, for the shapes of real models the tests need: each reproduces a
pattern seen in a real model (named in its docstring). Shared by the test modules."""
from __future__ import annotations

from pathlib import Path

import zlib

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper, numpy_helper


def seeded(name: str) -> np.random.Generator:
    """Numbers seeded by a name: a graph (or a feed) is the same whichever tests made one before it in the process."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def _w(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((seeded(name).standard_normal(shape) * 0.3).astype(np.float32), name)


def _model(nodes, inputs, outputs, inits, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def yolo_like() -> onnx.ModelProto:
    """Box decoding scales by a width read from the feature map's shape: Shape -> Gather -> Cast(to=FLOAT)."""
    return _model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Shape", ["y"], ["s"], name="shape"),
         helper.make_node("Gather", ["s", "idx"], ["wd"], name="width", axis=0),
         helper.make_node("Cast", ["wd"], ["wf"], name="to_float", to=TP.FLOAT),
         helper.make_node("Mul", ["y", "wf"], ["z"], name="scale")],
        [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, "W"])],
        [helper.make_tensor_value_info("z", TP.FLOAT, [1, 4, 8, "W"])],
        [_w("w", 4, 3, 3, 3), numpy_helper.from_array(np.array(3, np.int64), "idx")])


def if_with_outer_refs() -> onnx.ModelProto:
    """Both branches read `h` (computed in FP16 outside) and a weight from the enclosing graph."""
    then = helper.make_graph([helper.make_node("MatMul", ["h", "w2"], ["t"], name="then_mm")], "then", [],
                             [helper.make_tensor_value_info("t", TP.FLOAT, [2, 4])])
    other = helper.make_graph([helper.make_node("Identity", ["h"], ["e"], name="else_id")], "else", [],
                              [helper.make_tensor_value_info("e", TP.FLOAT, [2, 4])])
    return _model(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
         helper.make_node("ReduceSum", ["x"], ["sx"], name="sum", keepdims=0),
         helper.make_node("Greater", ["sx", "zero"], ["pos"], name="is_pos"),
         helper.make_node("If", ["pos"], ["b"], name="branch", then_branch=then, else_branch=other),
         helper.make_node("Relu", ["b"], ["y"], name="relu")],
        [helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])],
        [_w("w1", 4, 4), _w("w2", 4, 4), numpy_helper.from_array(np.array(0, np.float32), "zero")])


def partly_fp16() -> onnx.ModelProto:
    """A front-end already in FP16 (its own Casts and an FP16 weight), FP32 layers after it."""
    w16 = numpy_helper.from_array((seeded("w16").standard_normal((4, 4)) * 0.3).astype(np.float16), "w16")
    return _model(
        [helper.make_node("Cast", ["x"], ["x16"], name="to_half", to=TP.FLOAT16),
         helper.make_node("MatMul", ["x16", "w16"], ["f16"], name="front"),
         helper.make_node("Cast", ["f16"], ["f"], name="to_single", to=TP.FLOAT),
         helper.make_node("MatMul", ["f", "w"], ["g"], name="body"),
         helper.make_node("Tanh", ["g"], ["y"], name="act")],
        [helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])], [w16, _w("w", 4, 4)])


def loop_carried() -> onnx.ModelProto:
    """A recurrent cell: a Loop carries a float state that its body updates with a weight from outside."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "w"], ["m"], name="cell_mm"),
         helper.make_node("Add", ["m", "x"], ["a"], name="cell_add"),
         helper.make_node("Tanh", ["a"], ["s_out"], name="cell_act"),
         helper.make_node("Identity", ["c_in"], ["c_out"], name="keep_going")],
        "body", [helper.make_tensor_value_info("i", TP.INT64, []), helper.make_tensor_value_info("c_in", TP.BOOL, []),
                 helper.make_tensor_value_info("s_in", TP.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("c_out", TP.BOOL, []), helper.make_tensor_value_info("s_out", TP.FLOAT, [2, 4])])
    return _model(
        [helper.make_node("MatMul", ["x0", "w0"], ["x"], name="embed"),
         helper.make_node("Loop", ["steps", "", "s0"], ["s"], name="recur", body=body),
         helper.make_node("MatMul", ["s", "w0"], ["y"], name="head")],
        [helper.make_tensor_value_info("x0", TP.FLOAT, [2, 4]), helper.make_tensor_value_info("s0", TP.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])],
        [_w("w0", 4, 4), _w("w", 4, 4), numpy_helper.from_array(np.array(3, np.int64), "steps")], opset=17)


def celu_in_the_middle() -> onnx.ModelProto:
    """Celu has no FP16 form in ONNX: the converted graph is invalid until Celu stays FP32."""
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"), helper.make_node("Celu", ["a"], ["b"], name="celu"),
         helper.make_node("MatMul", ["b", "w"], ["y"], name="mm2")],
        [helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])], [_w("w", 4, 4)])


def lstm_model() -> onnx.ModelProto:
    """x -> MatMul -> LSTM (hidden 8) -> MatMul: ONNX Runtime's CPU provider crashes loading its FP16 form."""
    hidden, feat = 8, 4
    w = numpy_helper.from_array((seeded("W").standard_normal((1, 4 * hidden, feat)) * 0.3).astype(np.float32), "W")
    r = numpy_helper.from_array((seeded("R").standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32), "R")
    return _model(
        [helper.make_node("MatMul", ["x", "proj"], ["xp"], name="proj_mm"),
         helper.make_node("LSTM", ["xp", "W", "R"], ["seq"], name="lstm", hidden_size=hidden),
         helper.make_node("Squeeze", ["seq", "axis1"], ["s"], name="squeeze"),
         helper.make_node("MatMul", ["s", "head"], ["y"], name="head_mm")],
        [helper.make_tensor_value_info("x", TP.FLOAT, [5, 2, feat])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [5, 2, 3])],
        [_w("proj", feat, feat), w, r, _w("head", hidden, 3), numpy_helper.from_array(np.array([1], np.int64), "axis1")])


def bert_like(path: Path, opset: int = 14) -> Path:
    """input_ids into a 50-row word table, token_type_ids into a 2-row type table (as BERT's), a projection, and
    constant arithmetic onnxsim folds away."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((50, 16)).astype(np.float32), "word"),
             numpy_helper.from_array(rng.standard_normal((2, 16)).astype(np.float32), "types"),
             numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "proj"),
             numpy_helper.from_array(np.full((8,), 0.5, np.float32), "k1"),
             numpy_helper.from_array(np.full((8,), 0.25, np.float32), "k2")]
    nodes = [helper.make_node("Gather", ["word", "input_ids"], ["we"], name="word_lookup"),
             helper.make_node("Gather", ["types", "token_type_ids"], ["te"], name="type_lookup"),
             helper.make_node("Add", ["we", "te"], ["emb"], name="emb_add"),
             helper.make_node("MatMul", ["emb", "proj"], ["h"], name="proj_mm"),
             helper.make_node("Add", ["k1", "k2"], ["k"], name="fold_me"),
             helper.make_node("Mul", ["k", "k"], ["kk"], name="fold_me_too"),
             helper.make_node("Add", ["h", "kk"], ["y"], name="bias")]
    ids = [helper.make_tensor_value_info(n, TP.INT64, ["N", "S"]) for n in ("input_ids", "token_type_ids")]
    graph = helper.make_graph(nodes, "bert_like", ids, [helper.make_tensor_value_info("y", TP.FLOAT, ["N", "S", 8])],
                              inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def control_input(path: Path) -> Path:
    """A scalar `sample_rate` selects a branch; only 16000 takes the one that runs for this input."""
    x = helper.make_tensor_value_info("x", TP.FLOAT, [1, 4])
    good = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="relu_branch")], "good", [],
                             [helper.make_tensor_value_info("a", TP.FLOAT, [1, 4])])
    bad = helper.make_graph([helper.make_node("Gather", ["x", "past_end"], ["b"], name="gather_branch", axis=1)],
                            "bad", [], [helper.make_tensor_value_info("b", TP.FLOAT, [1, 1])],
                            [numpy_helper.from_array(np.array([9], np.int64), "past_end")])
    nodes = [helper.make_node("Equal", ["sample_rate", "sr16k"], ["is16k"], name="which_rate"),
             helper.make_node("If", ["is16k"], ["y"], name="branch", then_branch=good, else_branch=bad)]
    graph = helper.make_graph(nodes, "control", [x, helper.make_tensor_value_info("sample_rate", TP.INT64, [])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [1, "W"])],
                              [numpy_helper.from_array(np.array(16000, np.int64), "sr16k")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    return path


def fpn(path: Path) -> Path:
    """Upsampled features concatenated with full-size ones, H and W dynamic: ONNX Runtime's symbolic shape
    inference cannot match the dimensions and saves its partial model into the current directory."""
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="down", strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["a", "", "scales"], ["u"], name="up", mode="nearest"),
             helper.make_node("Conv", ["x", "w2"], ["b"], name="side", pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["u", "b"], ["c"], name="cat", axis=1),
             helper.make_node("Conv", ["c", "w3"], ["y"], name="head", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "fpn", [helper.make_tensor_value_info("x", TP.FLOAT, [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, [1, 4, "H", "W"])],
                              [w("w1", 4, 3, 3, 3), w("w2", 4, 3, 3, 3), w("w3", 4, 8, 3, 3),
                               numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def only_inside_if() -> onnx.ModelProto:
    """Every MatMul sits inside the branches of an If (a recurrent model whose body is in If branches)."""
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"], name="then_mm")], "then", [],
                             [helper.make_tensor_value_info("t", TP.FLOAT, [2, 4])])
    other = helper.make_graph([helper.make_node("MatMul", ["x", "w2"], ["e"], name="else_mm")], "else", [],
                              [helper.make_tensor_value_info("e", TP.FLOAT, [2, 4])])
    return _model(
        [helper.make_node("ReduceSum", ["x"], ["sx"], name="sum", keepdims=0),
         helper.make_node("Greater", ["sx", "zero"], ["pos"], name="is_pos"),
         helper.make_node("If", ["pos"], ["y"], name="branch", then_branch=then, else_branch=other)],
        [helper.make_tensor_value_info("x", TP.FLOAT, [2, 4])], [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])],
        [_w("w", 4, 4), _w("w2", 4, 4), numpy_helper.from_array(np.array(0, np.float32), "zero")])


def baked_reshape() -> onnx.ModelProto:
    """A batch-dynamic input reshaped to a constant shape traced at export (batch 2): parses, and builds only at
    batch 2 (seen in a Transformer encoder exported with a fixed sequence length baked into a Reshape)."""
    return _model([helper.make_node("Reshape", ["x", "shape"], ["r"], name="baked_reshape"),
                   helper.make_node("Relu", ["r"], ["y"], name="relu")],
                  [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4])],
                  [helper.make_tensor_value_info("y", TP.FLOAT, [2, 4])],
                  [numpy_helper.from_array(np.array([2, 4], np.int64), "shape")])


def lstm_in_if_unused_y() -> onnx.ModelProto:
    """An LSTM inside an If branch whose `Y` output (all time steps) nobody reads, as a torch LSTMCell exports
    under `if sr == 16000:` (Silero-VAD style): ONNX Runtime runs it and TensorRT-RTX 1.7 parses it, but its
    builder asserts (graphScope.cpp::analyze::471, ScopeType::kUNDEFINED). Found by reducing such a model."""
    hidden = 4
    weights = [numpy_helper.from_array((seeded(n).standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32), n)
               for n in ("W", "R")]
    lstm = helper.make_node("LSTM", ["x", "W", "R", "", "", "h0", "c0"], ["Y_unused", "Yh", "Yc"],
                            name="branch_lstm", hidden_size=hidden)
    then = helper.make_graph([lstm, helper.make_node("Concat", ["Yh", "Yc"], ["st"], name="new_state", axis=0)],
                             "then", [], [helper.make_tensor_value_info("Yh", TP.FLOAT, [1, 1, hidden]),
                                          helper.make_tensor_value_info("st", TP.FLOAT, [2, 1, hidden])])
    other = helper.make_graph([helper.make_node("Identity", ["h0"], ["eh"], name="keep_h"),
                               helper.make_node("Identity", ["state"], ["est"], name="keep_state")], "else", [],
                              [helper.make_tensor_value_info("eh", TP.FLOAT, [1, 1, hidden]),
                               helper.make_tensor_value_info("est", TP.FLOAT, [2, 1, hidden])])
    return _model(
        [helper.make_node("Split", ["state", "split2"], ["h0", "c0"], name="split_state", axis=0),
         helper.make_node("Equal", ["sr", "k16000"], ["is16k"], name="which_rate"),
         helper.make_node("If", ["is16k"], ["y", "state_out"], name="by_rate", then_branch=then, else_branch=other)],
        [helper.make_tensor_value_info("x", TP.FLOAT, [1, 1, hidden]),
         helper.make_tensor_value_info("state", TP.FLOAT, [2, 1, hidden]),
         helper.make_tensor_value_info("sr", TP.INT64, [])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [1, 1, hidden]),
         helper.make_tensor_value_info("state_out", TP.FLOAT, [2, 1, hidden])],
        weights + [numpy_helper.from_array(np.array([1, 1], np.int64), "split2"),
                   numpy_helper.from_array(np.array(16000, np.int64), "k16000")])


def shared_batch_symbol() -> onnx.ModelProto:
    """silero-VAD's signature: the symbol `batch` is axis 0 of `input` [batch, 512] and axis 1 of `state`
    [2, batch, 128]; the new state mixes both, so a trial build must give `batch` one value."""
    return _model(
        [helper.make_node("MatMul", ["input", "w"], ["h"], name="project"),
         helper.make_node("Unsqueeze", ["h", "zero"], ["h1"], name="as_state"),
         helper.make_node("Add", ["h1", "state"], ["s"], name="mix"),
         helper.make_node("Tanh", ["s"], ["stateN"], name="act")],
        [helper.make_tensor_value_info("input", TP.FLOAT, ["batch", 512]),
         helper.make_tensor_value_info("state", TP.FLOAT, [2, "batch", 128])],
        [helper.make_tensor_value_info("stateN", TP.FLOAT, [2, "batch", 128])],
        [_w("w", 512, 128), numpy_helper.from_array(np.array([0], np.int64), "zero")])


def embedding_table(rows: int = 2, name: str = "token_type_ids") -> onnx.ModelProto:
    """A BERT-style lookup with one output: `name` [batch, 16] indexes a table of `rows` embeddings (a
    token-type table has 2): random integers beyond the table are ONNX Runtime's `Gather ... indices element out
    of data bounds`."""
    return _model(
        [helper.make_node("Gather", ["table", name], ["e"], name="lookup", axis=0),
         helper.make_node("ReduceMean", ["e", "axes"], ["y"], name="pool", keepdims=0)],
        [helper.make_tensor_value_info(name, TP.INT64, ["batch", 16])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["batch", 8])],
        [_w("table", rows, 8), numpy_helper.from_array(np.array([1], np.int64), "axes")], opset=18)


def text_map(path: Path) -> Path:
    """A text detector's shape (PP-OCRv4's DBNet head): Convs to a Sigmoid probability map [N, 1, H, W] that stays
    near 0 (sigmoid(-12)) where the input holds no bright strokes and rises to 1 on them."""
    rng = np.random.default_rng(43)

    def w(name: str, *shape: int, mean: float = 0.0) -> onnx.TensorProto:
        return numpy_helper.from_array((mean + rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    model = _model(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], name="stem", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
         helper.make_node("Conv", ["r1", "w2", "b2"], ["h2"], name="body", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
         helper.make_node("Conv", ["r2", "w3", "b3"], ["logits"], name="head"),
         helper.make_node("Sigmoid", ["logits"], ["prob"], name="sigmoid")],
        [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("prob", TP.FLOAT, ["N", 1, 32, 32])],
        [w("w1", 32, 3, 3, 3, mean=0.1), numpy_helper.from_array(np.zeros(32, np.float32), "b1"),
         w("w2", 32, 32, 3, 3, mean=0.02), numpy_helper.from_array(np.zeros(32, np.float32), "b2"),
         w("w3", 1, 32, 1, 1, mean=0.3), numpy_helper.from_array(np.array([-12.0], np.float32), "b3")])
    onnx.save(model, str(path))
    return path


def dead_segmenter(path: Path) -> Path:
    """A segmentation net at its random initialization whose output ignores its input (DeepLabV3 with random weights
    gave identical min/max/std for two different images): its stem's ReLUs are dead on every input (the bias far
    below what the weights make of the pixels), so the class logits are the head's bias everywhere."""
    rng = np.random.default_rng(2)
    model = _model(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], name="stem", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["h1"], ["r1"], name="relu"),
         helper.make_node("Conv", ["r1", "w2", "b2"], ["logits"], name="classifier")],
        [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TP.FLOAT, ["N", 4, 16, 16])],
        [numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.1).astype(np.float32), "w1"),
         numpy_helper.from_array(np.full(16, -50.0, np.float32), "b1"),
         numpy_helper.from_array((rng.standard_normal((4, 16, 1, 1)) * 0.1).astype(np.float32), "w2"),
         numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b2")])
    onnx.save(model, str(path))
    return path


def masked_attention(path: Path, query_noise: float = 0.0, out_noise: float = 0.0) -> Path:
    """MiniLM's attention pattern: the mask made an additive bias of float32's lowest value (HuggingFace's
    `(1 - mask) * finfo(float32).min`, -3.4e38: finite, huge, constant) added to the scores before the Softmax.
    `query_noise` / `out_noise` perturb the query and output projections' weights (a variant that drifts a little
    early and a lot late)."""
    rng = np.random.default_rng(5)
    wq, wv, wo = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((8, 8), (8, 16), (16, 16)))
    noise = np.random.default_rng(6)
    wq = wq + (noise.standard_normal(wq.shape) * query_noise * 0.3).astype(np.float32)
    wo = wo + (noise.standard_normal(wo.shape) * out_noise * 0.3).astype(np.float32)
    model = _model(
        [helper.make_node("Cast", ["mask"], ["mask_f"], name="mask_cast", to=TP.FLOAT),
         helper.make_node("Sub", ["one", "mask_f"], ["mask_inv"], name="mask_invert"),
         helper.make_node("Mul", ["mask_inv", "lowest"], ["mask_bias"], name="mask_bias"),
         helper.make_node("MatMul", ["x", "wq"], ["scores"], name="query"),
         helper.make_node("Add", ["scores", "mask_bias"], ["masked"], name="masked_scores"),
         helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
         helper.make_node("MatMul", ["probs", "wv"], ["context"], name="value"),
         helper.make_node("MatMul", ["context", "wo"], ["y"], name="out_proj")],
        [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 8]),
         helper.make_tensor_value_info("mask", TP.INT64, ["N", 8])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["N", 16])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
         numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest"),
         numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(wv, "wv"), numpy_helper.from_array(wo, "wo")])
    onnx.save(model, str(path))
    return path


def matmul_stack(path: Path, layers: int = 3) -> Path:
    """`layers` MatMuls of 256 tokens by a 1024-wide weight: tens of milliseconds a run on ONNX Runtime's CPU, as a
    transformer's blocks are (ViT-B/16 at batch 8: about 1.7 s a run on this machine's harness)."""
    w = numpy_helper.from_array((np.random.default_rng(7).standard_normal((1024, 1024)) * 0.03).astype(np.float32),
                                "w")
    nodes = [helper.make_node("MatMul", [f"h{i}" if i else "x", "w"], [f"h{i + 1}"], name=f"block{i}")
             for i in range(layers)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [256, 1024])],
                   [helper.make_tensor_value_info(f"h{layers}", TP.FLOAT, [256, 1024])], [w])
    onnx.save(model, str(path))
    return path
