"""Stage `prepare` on the real PP-OCR classifier and on small planted models; TensorRT-RTX parses for real."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.assets import PPOCR
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError
from trtflow.pipelines.params.prepare import PrepareStage
from trtflow.stages.onnx.graph import constants_to_initializers
from trtflow.stages.onnx.model_io import has_external_data
from trtflow.stages.ort.runner import run, session
from trtflow.stages.prepare import stage as prepare


def params(**kw) -> PrepareStage:
    return PrepareStage.model_validate({"kind": "prepare", **kw})


def run_prepare(model: Path, out: Path, **kw):
    out.mkdir(parents=True, exist_ok=True)
    return prepare.run(params(**kw), Inputs({"model": Artifact(model, "onnx", "test")}), out)


def tiny_model(path: Path, nodes, inputs, outputs, opset=17, domains=(), initializers=()) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    onnx.save(helper.make_model(graph, opset_imports=imports), str(path))
    return path


@pytest.mark.slow
def test_real_classifier(tmp_path, tensorrt_available):
    result = run_prepare(PPOCR, tmp_path / "out", target_opset=17, input_shapes={"x": [1, 3, 48, 192]})
    report = json.loads(result.outputs["report"].read_text())
    model = onnx.load(str(result.outputs["model"]))
    onnx.checker.check_model(model, full_check=True)
    assert {o.domain: o.version for o in model.opset_import}[""] == 17
    assert report["before"]["opsets"]["ai.onnx"] == 11
    # PaddlePaddle's -1 and "?" dims are renamed, and all three dynamic input dims are recorded
    assert [(d["input"], d["axis"], d["name"]) for d in report["dynamic_dims"]] == \
        [("x", 0, "x_dim0"), ("x", 2, "x_dim2"), ("x", 3, "x_dim3")]
    assert report["simplification"]["applied"] and report["after"]["nodes"] < report["before"]["nodes"]
    assert report["conversion"]["check"]["ok"] is True
    # the prepared model computes what the shipped one does, on a realistic text-line-sized input
    x = np.random.default_rng(1).uniform(-1, 1, (4, 3, 48, 192)).astype(np.float32)
    ref = run(session(PPOCR), {"x": x})
    got = run(session(result.outputs["model"]), {"x": x})
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-5)
    if tensorrt_available:
        assert report["preflight"]["ran"] and report["preflight"]["parsed"]
        assert report["preflight"]["failures"] == [] and report["preflight"]["layers"] > 50
        trial = report["preflight"]["trial_build"]
        assert trial["ok"] and trial["shapes"] == {"x": [1, 3, 48, 192]} and trial["engine_bytes"] > 100_000
    assert "TensorRT pre-flight" in result.summary and "x_dim2" in result.summary
    assert not (tmp_path / "out" / "work").exists()


@pytest.mark.slow
@pytest.mark.tensorrt
def test_preflight_lists_every_unsupported_node(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    model = tiny_model(tmp_path / "bad.onnx", [
        helper.make_node("Relu", ["x"], ["r"], name="relu0"),
        helper.make_node("Unique", ["r"], ["y"], name="uniq0"),
        helper.make_node("MyOp", ["r"], ["z"], name="custom0", domain="com.acme"),
    ], [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["K"]),
             helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4])], domains=["com.acme"])
    with pytest.raises(StageError) as info:
        run_prepare(model, tmp_path / "a", simplify=False)
    msg = str(info.value)
    assert "2 node(s) of bad.onnx cannot be parsed" in msg and "uniq0 (Unique)" in msg and "custom0 (MyOp)" in msg
    assert "\n" not in msg

    result = run_prepare(model, tmp_path / "b", simplify=False, fail_on_unsupported=False)
    pre = json.loads(result.outputs["report"].read_text())["preflight"]
    assert [(f["node"], f["op_type"]) for f in pre["failures"]] == [("uniq0", "Unique"), ("custom0", "MyOp")]
    assert "plugin" in pre["failures"][1]["hint"] and pre["failures"][1]["domain"] == "com.acme"
    assert len(result.warnings) >= 2


def test_preflight_modes_without_tensorrt(tmp_path, monkeypatch):
    # a machine without any TensorRT flavour: this checks trtflow's message, nothing about TensorRT
    monkeypatch.setattr(prepare, "find_tensorrt", lambda: None)
    result = run_prepare(PPOCR, tmp_path / "a", simplify=False)
    pre = json.loads(result.outputs["report"].read_text())["preflight"]
    assert pre["ran"] is False and "pip install tensorrt-rtx-cu13" in pre["reason"]
    assert "pre-flight did not run" in result.summary
    with pytest.raises(StageError, match="preflight: required, but no TensorRT flavour is installed"):
        run_prepare(PPOCR, tmp_path / "b", simplify=False, preflight="required")


def test_truncated_and_missing_model(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(PPOCR.read_bytes()[:20_000])
    with pytest.raises(StageError, match=r"broken.onnx is not a valid ONNX model \(truncated or corrupt\)"):
        run_prepare(broken, tmp_path / "a")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_text("this is not a protobuf at all, just text\n" * 10)
    with pytest.raises(StageError, match="garbage.onnx is not a valid ONNX model"):
        run_prepare(garbage, tmp_path / "b")
    with pytest.raises(StageError, match="model file not found"):
        run_prepare(tmp_path / "absent.onnx", tmp_path / "c")


def test_target_opset_too_low(tmp_path):
    # LayerNormalization exists from opset 17 on: there is no way down to 13
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [8], np.ones(8, np.float32))
    model = tiny_model(tmp_path / "ln.onnx", [helper.make_node("LayerNormalization", ["x", "scale"], ["y"])],
                       [x], [y], initializers=[scale])
    with pytest.raises(StageError) as info:
        run_prepare(model, tmp_path / "out", target_opset=13, preflight="off")
    msg = str(info.value)
    assert msg.startswith("cannot convert ln.onnx from opset 17 to 13:") and "leave it unset" in msg


def test_an_opset_no_installed_tool_knows_is_refused(tmp_path):
    """Issue #27: a model declaring opset 99 passed prepare (exit 0)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    model = tiny_model(tmp_path / "future.onnx", [helper.make_node("Relu", ["x"], ["y"])], [x], [y], opset=99)
    with pytest.raises(StageError) as info:
        run_prepare(model, tmp_path / "out", preflight="off")
    known = onnx.defs.onnx_opset_version()
    assert str(info.value).startswith(f"future.onnx declares ONNX opset 99, newer than any this onnx "
                                      f"{onnx.__version__} knows (up to {known})")
    assert info.value.hint == f"export it at opset {known} or lower (TensorRT's parser documents the opsets it " \
                              f"supports)"


@pytest.mark.slow
def test_external_data_in_and_out(tmp_path):
    src = tmp_path / "ext" / "model.onnx"
    src.parent.mkdir()
    model = onnx.load(str(PPOCR))
    constants_to_initializers(model)  # PaddlePaddle exports weights as Constant nodes
    from trtflow.stages.onnx.model_io import _as_raw_data
    _as_raw_data(model)
    onnx.save_model(model, str(src), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (src.parent / "weights.bin").stat().st_size > 100_000
    result = run_prepare(src, tmp_path / "out", input_shapes={"x": [1, 3, 48, 192]})
    out = result.outputs["model"]
    assert has_external_data(onnx.load(str(out), load_external_data=False))
    assert (out.parent / "model.onnx.data").exists()
    x = np.random.default_rng(2).uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)
    np.testing.assert_allclose(run(session(out), {"x": x})["save_infer_model/scale_0.tmp_1"],
                               run(session(PPOCR), {"x": x})["save_infer_model/scale_0.tmp_1"],
                               rtol=1e-4, atol=1e-5)


def test_simplification_that_cannot_be_verified_is_not_applied(tmp_path):
    # a custom op ONNX Runtime cannot run: onnxsim's result could not be checked, so the model is kept as is
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])
    model = tiny_model(tmp_path / "custom.onnx", [
        helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["b"]),
        helper.make_node("MyOp", ["b"], ["z"], name="custom0", domain="com.acme")], [x], [z], domains=["com.acme"])
    result = run_prepare(model, tmp_path / "out", preflight="off")
    report = json.loads(result.outputs["report"].read_text())
    assert report["simplification"]["applied"] is False
    assert any("not simplified" in w for w in result.warnings)


@pytest.mark.slow
@pytest.mark.tensorrt
def test_a_model_that_parses_but_does_not_build(tmp_path):
    """Parsing is not building: the trial build at the check shapes catches what the build stage would hit."""
    from tests.graphs import baked_reshape

    path = tmp_path / "baked.onnx"
    onnx.save(baked_reshape(), str(path))
    with pytest.raises(StageError) as info:
        run_prepare(path, tmp_path / "a", simplify=False, input_shapes={"x": [1, 4]})
    msg = str(info.value)
    assert "baked.onnx parses, but the trial build at {'x': [1, 4]} fails" in msg
    assert "reshape changes volume" in msg and "set prepare.input_shapes to the shapes it runs with" in msg
    result = run_prepare(path, tmp_path / "b", simplify=False, input_shapes={"x": [2, 4]})
    assert json.loads(result.outputs["report"].read_text())["preflight"]["trial_build"]["ok"]
    warned = run_prepare(path, tmp_path / "c", simplify=False, input_shapes={"x": [1, 4]}, fail_on_unsupported=False)
    assert any("trial build" in w for w in warned.warnings)


@pytest.mark.tensorrt
def test_control_flow_that_parses_but_does_not_build(tmp_path, tensorrt_backend):
    """Seen before: a recurrent model with If branches passed the pre-flight ("parsed, 2437 layers") and every
    build failed with TensorRT-RTX's graphScope assertion."""
    from tests.graphs import lstm_in_if_unused_y

    if tensorrt_backend.flavour != "tensorrt-rtx":
        pytest.skip("a TensorRT-RTX 1.7 observation")
    path = tmp_path / "vad.onnx"
    onnx.save(lstm_in_if_unused_y(), str(path))
    with pytest.raises(StageError) as info:
        run_prepare(path, tmp_path / "a", simplify=False,
                    check={"data": {"random": True, "ranges": {"sr": [16000, 16000]}}})
    msg = str(info.value)
    assert "vad.onnx parses, but the trial build" in msg and "graphScope" in msg
    assert "an LSTM/GRU/RNN inside an If branch whose Y output is unused" in msg


def test_dimension_symbols_shared_between_inputs(tmp_path, tensorrt_available):
    """silero-VAD (opset 18): `batch` is axis 0 of `input` and axis 1 of `state`. Trial shapes and random check
    data give the symbol one value; with check data given, the trial build takes the data's shapes."""
    from tests.graphs import shared_batch_symbol
    from trtflow.stages.ort.runner import concrete_shapes

    assert concrete_shapes([("input", ["batch", 512]), ("state", [2, "batch", 128])], {}) == \
        {"input": [1, 512], "state": [2, 1, 128]}
    assert concrete_shapes([("input", ["batch", 512]), ("state", [2, "batch", 128])], {"input": [3, 512]}) == \
        {"input": [3, 512], "state": [2, 3, 128]}
    path = tmp_path / "vad.onnx"
    onnx.save(shared_batch_symbol(), str(path))
    result = run_prepare(path, tmp_path / "random", simplify=False)  # random check data: one batch for both
    assert json.loads(result.outputs["report"].read_text())["conversion"] is None
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "s0.npz", input=rng.standard_normal((2, 512)).astype(np.float32),
             state=np.zeros((2, 2, 128), np.float32))
    out = tmp_path / "given"
    out.mkdir()
    result = prepare.run(params(simplify=False, check={"data": {"tensors": "*.npz"}}),
                         Inputs({"model": Artifact(path, "onnx", "m"),
                                 "tensors": [Artifact(data / "s0.npz", "file", "s0")]}), out)
    report = json.loads(result.outputs["report"].read_text())
    if tensorrt_available:
        trial = report["preflight"]["trial_build"]
        assert trial["ok"], trial
        assert trial["shapes"] == {"input": [2, 512], "state": [2, 2, 128]}


def test_renamed_dims_survive_simplification(tmp_path, monkeypatch):
    """The report said PaddlePaddle's '?' and -1 dims were renamed while onnxsim had written the old names back
    into the output (rename runs before simplify). Here onnxsim is made to do that, as it was seen to."""
    from trtflow.stages.onnx.simplifier import onnxsim as load_onnxsim

    onnxsim = load_onnxsim()
    real = onnxsim.simplify

    def writes_old_names_back(model, **kw):
        simplified, ok = real(model, **kw)
        for vi in simplified.graph.output:
            vi.type.tensor_type.shape.dim[0].Clear()
            vi.type.tensor_type.shape.dim[0].dim_param = "?"
        return simplified, ok

    monkeypatch.setattr(onnxsim, "simplify", writes_old_names_back)
    result = run_prepare(PPOCR, tmp_path / "out", preflight="off")
    report = json.loads(result.outputs["report"].read_text())
    assert report["simplification"]["applied"]
    model = onnx.load(str(result.outputs["model"]))
    dims = {vi.name: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in list(model.graph.input) + list(model.graph.output)}
    for change in report["sanitized_dims"]:
        assert dims[change["tensor"]][change["axis"]] == change["now"], (change, dims)


def test_a_report_of_prepare_v2_still_reads():
    """prepare v2 stored the inventories, checks and pre-flight as plain dicts (a pre-flight that did not run had
    only ran/reason/failures; a check no `data`): such a report still validates and renders."""
    from trtflow.stages.prepare.report import PrepareReport

    io = [{"name": "x", "dtype": "float32", "shape": ["x_dim0", 3, 48, 192]}]
    inventory = {"ir_version": 8, "producer": "paddle2onnx 1.0", "opsets": {"ai.onnx": 11}, "nodes": 152,
                 "ops": {"ai.onnx": {"Conv": 50, "Relu": 40}}, "initializers": 80, "initializer_bytes": 580_000,
                 "inputs": io, "outputs": [{"name": "y", "dtype": "float32", "shape": ["y_dim0", 2]}]}
    check = {"ok": True, "rtol": 0.001, "atol": 0.0001, "input_shapes": {"x": [1, 3, 48, 192]},
             "runtime": "onnxruntime-cpu 1.22", "samples": 4,
             "outputs": {"y": {"ok": True, "max_abs": 2e-07, "max_rel": 1e-06}}, "directions": {}, "violations": []}
    v2 = {"source": {"path": "cls.onnx", "digest": "ab" * 32, "external_data": False},
          "before": inventory, "after": inventory, "full_check": None,
          "sanitized_dims": [{"tensor": "x", "axis": 0, "was": "?", "now": "x_dim0"}],
          "conversion": {"from": 11, "to": 17, "check": check},
          "simplification": {"requested": True, "applied": True, "tool": "onnxsim 0.4.36", "seconds": 0.5,
                             "check": check},
          "dynamic_dims": [{"input": "x", "axis": 0, "name": "x_dim0"}], "constants_to_initializers": 0,
          "preflight": {"ran": False, "reason": "disabled (preflight: off)", "failures": []},
          "timings": {"check": 0.1}, "warnings": []}
    report = PrepareReport.model_validate_json(json.dumps(v2))
    assert report.conversion.source == 11 and report.simplification.check.samples == 4
    text = report.summary("cls")
    assert "opset conversion** 11 → 17: matches on 4 random input(s)" in text
    assert "`x[0]` \\'\\?\\'→`x_dim0`" in text and "pre-flight did not run**: disabled" in text
    assert json.loads(report.model_dump_json())["conversion"]["from"] == 11
