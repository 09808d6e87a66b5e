"""Stage `precision`: FP16 with automatic FP32 fallback, on a planted overflow and on real models; every variant
is built into an engine by TensorRT-RTX on the CPU."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.assets import PPOCR, SQUEEZENET
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.stages.ort.runner import run, session
from trtflow.stages.precision import stage as precision


def overflow_model(path: Path) -> Path:
    """y = ((x @ W) * 20) / 1000: x @ W reaches ~8000 and the product ~160000, past FP16's 65504."""
    w = numpy_helper.from_array(np.full((16, 16), 1000.0, np.float32), "W")
    k20 = numpy_helper.from_array(np.array(20.0, np.float32), "k20")
    k1000 = numpy_helper.from_array(np.array(1000.0, np.float32), "k1000")
    w2 = numpy_helper.from_array(np.eye(16, dtype=np.float32) * 0.5, "W2")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="big_matmul"),
             helper.make_node("Mul", ["h", "k20"], ["h20"], name="overflowing_mul"),
             helper.make_node("Div", ["h20", "k1000"], ["small"], name="rescale"),
             helper.make_node("MatMul", ["small", "W2"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [w, k20, k1000, w2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def tensors_dir(tmp_path: Path, n: int = 8, low: float = 0.2, high: float = 0.5, seed: int = 0) -> list[Artifact]:
    """`n` samples of x [1, 16], uniform in [low, high), saved as .npy."""
    rng = np.random.default_rng(seed)
    arts = []
    for i in range(n):
        f = tmp_path / f"s{i}.npy"
        np.save(f, rng.uniform(low, high, (1, 16)).astype(np.float32))
        arts.append(Artifact(f, "file", f.name))
    return arts


def run_precision(model: Path, out: Path, extra_inputs=None, **kw):
    out.mkdir(parents=True)
    params = PrecisionStage.model_validate({"kind": "precision", **kw})
    return precision.run(params, Inputs({"model": Artifact(model, "onnx", "m"), **(extra_inputs or {})}), out)


@pytest.mark.slow
def test_planted_fp16_overflow_is_kept_in_fp32(tmp_path, tensorrt_available, engine_size):
    model = overflow_model(tmp_path / "overflow.onnx")
    data = {"tensors": tensors_dir(tmp_path)}
    spec = {"data": {"tensors": "*.npy"}, "holdout": 4}

    naive = run_precision(model, tmp_path / "naive", data, fallback={"auto": False}, **spec)
    assert naive.metrics["nan_inf"] > 0, "without fallback the FP16 variant overflows to inf"
    assert naive.warnings and "NaN/Inf" in naive.warnings[0]

    result = run_precision(model, tmp_path / "auto", data, **spec)
    report = json.loads(result.outputs["report"].read_text())
    kept = report["kept_fp32"]
    assert {"big_matmul", "overflowing_mul", "rescale"} <= set(kept) and "head" not in kept
    assert "data_max" in kept["overflowing_mul"]
    out = report["accuracy"]["outputs"]["y"]
    assert out["nan"] == 0 and out["inf"] == 0 and out["cosine"] > 0.9999
    x = np.full((1, 16), 0.3, np.float32)
    np.testing.assert_allclose(run(session(result.outputs["model"]), {"x": x})["y"],
                               run(session(model), {"x": x})["y"], rtol=2e-3)
    assert "simulated" in report["accuracy"]["runtime"] and "not a TensorRT number" in result.summary
    if tensorrt_available:
        assert engine_size(result.outputs["model"], None, tmp_path / "engine") > 1000


def underflow_model(path: Path) -> Path:
    """basic-pitch's pattern twice: `log(relu(x) + 1e-10)`, whose constant FP16 rounds to 0 (relu's zeros then
    reach Log as 0: -inf), and `log(|x| * 1e-7)`, whose constant survives but whose product on the data (below
    3e-8 for |x| < 0.3) FP16 rounds to 0; then a head that FP16 carries."""
    consts = [numpy_helper.from_array(np.array(1e-10, np.float32), "eps"),
              numpy_helper.from_array(np.array(1e-7, np.float32), "tiny_scale"),
              numpy_helper.from_array(np.eye(16, dtype=np.float32) * 0.01, "W")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "eps"], ["r_eps"], name="add_eps"),
             helper.make_node("Log", ["r_eps"], ["log_r"], name="log_r"),
             helper.make_node("Abs", ["x"], ["ax"], name="abs"),
             helper.make_node("Mul", ["ax", "tiny_scale"], ["small"], name="scale_down"),
             helper.make_node("Log", ["small"], ["log_small"], name="log_small"),
             helper.make_node("Add", ["log_r", "log_small"], ["both"], name="sum"),
             helper.make_node("MatMul", ["both", "W"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "underflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def signed_tensors(tmp_path: Path) -> list[Artifact]:
    """Samples of x in (-0.5, 0.5): relu makes zeros, |x| goes below 0.3."""
    return tensors_dir(tmp_path, low=-0.5, high=0.5, seed=1)


@pytest.mark.slow
def test_values_fp16_rounds_to_zero_are_kept_in_fp32(tmp_path):
    """Issue #51: basic-pitch adds 1e-10 before a Log; FP16 makes it 0 and every output NaN, while the precision
    stage kept nothing in FP32 (it guarded only the high end). Now a small constant FP16 would lose to 0 keeps its
    reader in FP32, and an activation measured on the data that FP16 would round to 0 where a Log (Div's
    divisor, Reciprocal, Pow, Sqrt) reads it keeps that node and its producer in FP32, each with its reason."""
    model = underflow_model(tmp_path / "underflow.onnx")
    data = {"tensors": signed_tensors(tmp_path)}
    spec = {"data": {"tensors": "*.npy"}, "holdout": 4}
    naive = run_precision(model, tmp_path / "naive", data, fallback={"auto": False}, **spec)
    assert naive.metrics["nan_inf"] > 0, "without the guard FP16 turns the logs of 0 into -inf"

    result = run_precision(model, tmp_path / "auto", data, **spec)
    report = json.loads(result.outputs["report"].read_text())
    kept = report["kept_fp32"]
    assert kept["add_eps"] == "constant eps holds 1e-10, which FP16 rounds to 0 (below 2.98e-08; 1 of its 1 values)"
    assert kept["log_r"].startswith("its input r_eps goes down to 1e-10 on the sample data, which FP16 rounds to 0 "
                                    "(Log of 0)")
    assert kept["scale_down"].startswith("its output small goes down to ") and "(Log of 0)" in kept["scale_down"]
    assert kept["log_small"].startswith("its input small goes down to ")
    assert not {"relu", "abs", "sum", "head"} & set(kept), kept
    out = report["accuracy"]["outputs"]["y"]
    assert out["nan"] == 0 and out["inf"] == 0 and out["cosine"] > 0.9999, out
    assert result.metrics["nan_inf"] == 0


def test_a_weight_tensor_with_a_few_tiny_values_stays_fp16():
    """The low-end rule keeps a constant in FP32 only where what FP16 loses matters: every value of a small
    constant (an epsilon), or more than 0.1% of a large one's magnitude; not a weight tensor with a few values
    below 3e-8 among thousands."""
    from trtflow.stages.onnx.fp16 import lost_to_zero
    weights = np.random.default_rng(0).normal(0, 0.1, 4096).astype(np.float32)
    weights[:3] = 1e-9
    assert lost_to_zero(weights) is None
    assert lost_to_zero(np.array([1.0, 1e-12], np.float32)).startswith("holds 1e-12, which FP16 rounds to 0")
    assert lost_to_zero(np.array([1e-5, 6e-8], np.float32)) is None  # subnormals FP16 keeps
    mostly_tiny = np.full(4096, 1e-9, np.float32)
    assert "4096 of its 4096 values" in lost_to_zero(mostly_tiny)


def test_block_lists_and_bad_names(tmp_path):
    model = overflow_model(tmp_path / "m.onnx")
    data = {"tensors": tensors_dir(tmp_path)}
    result = run_precision(model, tmp_path / "a", data, data={"tensors": "*.npy"}, fallback={"auto": False},
                           block_ops=["Div"], block_nodes=["big_.*"])
    kept = json.loads(result.outputs["report"].read_text())["kept_fp32"]
    assert kept == {"big_matmul": "named in block_nodes", "rescale": "op type Div in block_ops"}
    with pytest.raises(StageError, match=r"block_nodes: no node matches 'big_matmull' \(did you mean 'big_matmul'\?\)"):
        run_precision(model, tmp_path / "b", data, data={"tensors": "*.npy"}, block_nodes=["big_matmull"])
    with pytest.raises(StageError, match=r"block_ops: the model has no 'Softmax' node"):
        run_precision(model, tmp_path / "c", data, data={"tensors": "*.npy"}, block_ops=["Softmax"])


def test_a_block_nodes_pattern_that_matches_part_of_a_name_says_how_to_match_it():
    """Issue #51: block_nodes patterns match whole names (re.fullmatch), which the docs did not say, and a piece of
    one of tf2onnx's long names ("did you mean") found nothing. Now the refusal names the names it matches a part
    of and the pattern that would block them; a misspelt piece finds the name sharing the most of it."""
    from trtflow.text import pattern_hint
    names = ["model_1/normalized_log_1/add;model_1/normalized_log_1/add",
             "model_1/normalized_log_1/Log;model_1/normalized_log_1/Log", "model_1/conv2d_1/Conv2D"]
    assert pattern_hint("normalized_log_1/Log", names) == (
        " (a pattern matches whole node names; it matches part of 'model_1/normalized_log_1/Log;model_1/"
        "normalized_log_1/Log': '.*normalized_log_1/Log.*' would match them)")
    assert "and 1 more" in pattern_hint("normalized_log_1", names)
    assert pattern_hint("normalised_log_1/Log", names) == \
        " (did you mean 'model_1/normalized_log_1/Log;model_1/normalized_log_1/Log'?)"
    assert pattern_hint("softmax_head", names) == ""
    assert pattern_hint("model_1/conv2d_1/Conv2d", names) == " (did you mean 'model_1/conv2d_1/Conv2D'?)"
    assert pattern_hint("big_matmull", ["big_matmul", "head"]) == " (did you mean 'big_matmul'?)"


@pytest.mark.slow
def test_max_rel_error_refinement(tmp_path):
    model = overflow_model(tmp_path / "m.onnx")
    data = {"tensors": tensors_dir(tmp_path)}
    # data_max high enough that the magnitude rule lets the overflow through; the error rule must catch it
    result = run_precision(model, tmp_path / "a", data, data={"tensors": "*.npy"},
                           fallback={"data_max": 1e9, "max_rel_error": 0.01})
    kept = json.loads(result.outputs["report"].read_text())["kept_fp32"]
    assert any("max_rel_error" in why for why in kept.values())
    assert result.metrics["nan_inf"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("model,shapes", [(SQUEEZENET, {"input": [1, 3, 224, 224]}),
                                          (PPOCR, {"x": [1, 3, 48, 192]})])
def test_real_models_fp16_and_tensorrt_rtx_builds_them(tmp_path, model, shapes, tensorrt_available, engine_size):
    # as `prepare` hands it over: PP-OCR names both H and W "?", which TensorRT reads as one dimension (H == W)
    from trtflow.stages.onnx.graph import sanitize_dims
    m = onnx.load(str(model))
    sanitize_dims(m)
    model = tmp_path / "prepared.onnx"
    onnx.save(m, str(model))
    result = run_precision(model, tmp_path / "out", data={"random": True, "shapes": shapes, "samples": 4},
                           holdout=4)
    report = json.loads(result.outputs["report"].read_text())
    for out in report["accuracy"]["outputs"].values():
        assert out["nan"] == 0 and out["inf"] == 0 and out["cosine"] > 0.999
    fp16 = onnx.load(str(result.outputs["model"]))
    weights = list(fp16.graph.initializer) + [n.attribute[0].t for n in fp16.graph.node if n.op_type == "Constant"]
    assert any(w.data_type == TensorProto.FLOAT16 for w in weights)
    assert fp16.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT  # keep_io_types
    if tensorrt_available:
        assert engine_size(result.outputs["model"], shapes, tmp_path / "engine") > 100_000


def test_images_need_the_parity_preprocessing(tmp_path):
    with pytest.raises(StageError, match="data.images needs the parity stage's preprocessing"):
        run_precision(SQUEEZENET, tmp_path / "a", {"images": []}, data={"images": "*.png"})


def test_a_weight_in_a_constant_node_is_checked_too(tmp_path):
    """PP-OCR's detector keeps a BatchNorm variance of 9.8e7 in a Constant node: over FP16's 65504 it would be
    clamped (or become inf), so the node reading it stays FP32 even when the model comes without prepare."""
    from onnx import TensorProto, helper

    big = helper.make_tensor("var", TensorProto.FLOAT, [4], [9.8e7, 1.0, 2.0, 3.0])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["v"], name="variance", value=big),
         helper.make_node("Div", ["x", "v"], ["y"], name="normalize")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    # the activation rule (data_max) is set out of reach: the weight rule alone must catch it
    result = run_precision(path, tmp_path / "out", data={"random": True, "samples": 2}, holdout=2,
                           fallback={"data_max": 1e12})
    kept = json.loads(result.outputs["report"].read_text())["kept_fp32"]
    assert "init_max" in kept["normalize"] and "variance" in kept
    assert json.loads(result.outputs["report"].read_text())["accuracy"]["outputs"]["y"]["cosine"] > 0.999


@pytest.mark.parametrize("signal_name", ["KILL", "TERM"])
def test_a_killed_probe_is_a_crash_never_evidence_about_the_model(tmp_path, monkeypatch, signal_name):
    """The probe's child process killed from outside (the OOM killer, a scheduler): the stage fails as a crash
    (retried by `retries:`), and no variant with nodes kept in FP32 "because ONNX Runtime rejected them" is made.
    The child is real: the interpreter the probe starts kills itself with the signal."""
    import sys

    from trtflow.errors import TransientStageError
    from trtflow.stages.ort import probe
    killer = tmp_path / "python-killed"
    killer.write_text(f"#!/bin/sh\nkill -{signal_name} $$\n")
    killer.chmod(0o755)
    real = probe.child.call

    def killed_child(*args, **kwargs):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "executable", str(killer))
            return real(*args, **kwargs)
    monkeypatch.setattr(probe.child, "call", killed_child)
    model = overflow_model(tmp_path / "overflow.onnx")
    with pytest.raises(TransientStageError, match=f"the ONNX Runtime probe was killed \\(SIG{signal_name}\\)"):
        run_precision(model, tmp_path / "out", {"tensors": tensors_dir(tmp_path)}, data={"tensors": "*.npy"},
                      holdout=4)


@pytest.mark.slow
def test_a_variant_with_no_fp16_compute_is_a_warning(tmp_path):
    """Everything inside an If (control flow is not converted): the "FP16" variant is the FP32 model under another
    name, and the stage says so instead of passing silently (validate's repair then has nothing to do)."""
    w = numpy_helper.from_array(np.eye(16, dtype=np.float32) * 0.5, "W")
    branch = [helper.make_graph([helper.make_node("MatMul", ["x", "W"], [out], name=f"mm_{out}")], f"g_{out}", [],
                                [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 16])])
              for out in ("then_y", "else_y")]
    cond = numpy_helper.from_array(np.array(True), "cond")
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=branch[0], else_branch=branch[1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [w, cond])
    path = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    res = run_precision(path, tmp_path / "out", {"tensors": tensors_dir(tmp_path)},
                        data={"tensors": "*.npy"}, holdout=2)
    assert res.metrics["fp16_nodes"] == 0
    assert res.warnings[0].startswith("the FP16 variant has no FP16 compute: 2 of its nodes sit inside control flow "
                                      "(branch)"), res.warnings


def test_an_fp16_variant_doing_most_of_its_macs_in_fp32_is_named_so(tmp_path):
    """Issue #54: TensorRT builds the variant strongly typed, so a Conv kept in FP32 runs in FP32. Here the Conv the
    YAML keeps in FP32 holds 82% of the multiply-accumulates (8->32 channels 3x3 against 32->16 1x1 at 16x16): the
    "FP16" variant is mostly an FP32 engine, and the report, the summary and the warnings say so."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.1, (32, 8, 3, 3)).astype(np.float32), "W1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.1, (16, 32, 1, 1)).astype(np.float32), "W2")
    nodes = [helper.make_node("Conv", ["x", "W1"], ["h"], name="big_conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "W2"], ["y"], name="small_conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])], [w1, w2])
    path = tmp_path / "convs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    samples = []
    for i in range(4):
        np.save(tmp_path / f"s{i}.npy", rng.uniform(0, 1, (1, 8, 16, 16)).astype(np.float32))
        samples.append(Artifact(tmp_path / f"s{i}.npy", "file", f"s{i}.npy"))
    res = run_precision(path, tmp_path / "out", {"tensors": samples}, data={"tensors": "*.npy"}, holdout=2,
                        block_nodes=["big_conv"], preflight="off")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    shares = report["composition"]["mac_share"]
    assert shares["fp32"] == pytest.approx(589824 / (589824 + 131072)) and shares["int8"] == 0
    assert shares["fp16"] == pytest.approx(131072 / (589824 + 131072))
    assert report["composition"]["macs"] == 589824 + 131072
    assert report["composition"]["shapes"] == {"x": [1, 8, 16, 16]}
    assert res.metrics["fp32_mac_share"] > 0.8
    warning = [w for w in res.warnings if "multiply-accumulates in FP32" in w]
    assert warning == ["the FP16 variant does 82% of its multiply-accumulates in FP32 (more than 50%): on TensorRT "
                       "it runs mostly as an FP32 engine, and may be no faster than one"], res.warnings
    line = next(ln for ln in res.summary.splitlines() if ln.startswith("**compute by precision**"))
    assert "at x 1x8x16x16" in line and "MACs 18% FP16 · 82% FP32 (721 kMAC)" in line.replace("\\", ""), line

    # the same model without the block: all of it FP16, no warning
    res = run_precision(path, tmp_path / "free", {"tensors": samples}, data={"tensors": "*.npy"}, holdout=2,
                        preflight="off")
    assert res.metrics["fp32_mac_share"] == 0
    assert not [w for w in res.warnings if "multiply-accumulates" in w]
