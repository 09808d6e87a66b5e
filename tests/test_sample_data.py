"""Random inputs that real inputs could be: value ranges per input, table-bounded indices, and a clear error
naming the input when random values break the model (instead of a silently dropped simplification)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.graphs import bert_like, control_input
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError
from trtflow.pipelines.params.calibrate import CalibrateStage
from trtflow.pipelines.params.prepare import PrepareStage
from trtflow.stages.calibrate import stage as calibrate
from trtflow.stages.onnx.graph import index_bounds
from trtflow.stages.onnx.simplifier import onnxsim
from trtflow.stages.prepare import stage as prepare


def run_prepare(model: Path, out: Path, **kw):
    out.mkdir(parents=True)
    params = PrepareStage.model_validate({"kind": "prepare", "preflight": "off", **kw})
    return prepare.run(params, Inputs({"model": Artifact(model, "onnx", "m")}), out)


def test_table_bounds_are_found():
    assert index_bounds(onnx.load(str(bert_like(Path("/tmp") / "trtflow-bounds.onnx")))) == \
        {"input_ids": (0, 49), "token_type_ids": (0, 1)}


def test_token_type_ids_within_their_table_keep_the_simplification(tmp_path):
    """Seen before: random token_type_ids up to 7 broke the equivalence check, and the simplification was
    dropped silently (445 nodes kept where onnxsim alone gives 420)."""
    result = run_prepare(bert_like(tmp_path / "m.onnx"), tmp_path / "out", target_opset=17,
                         input_shapes={"input_ids": [2, 5], "token_type_ids": [2, 5]})
    report = json.loads(result.outputs["report"].read_text())
    assert report["conversion"]["check"]["ok"] is True
    assert report["simplification"]["applied"] is True and report["simplification"]["check"]["ok"] is True
    assert "Mul" not in report["after"]["ops"]["ai.onnx"]  # the constant arithmetic is folded
    alone, ok = onnxsim().simplify(onnx.load(str(tmp_path / "out" / "model.onnx")))  # nothing left for onnxsim
    assert ok and len(alone.graph.node) == report["after"]["nodes"]
    assert not result.warnings


def test_a_range_outside_the_table_names_the_input_and_the_fix(tmp_path):
    with pytest.raises(StageError) as info:
        run_prepare(bert_like(tmp_path / "m.onnx"), tmp_path / "out", target_opset=17,
                    check={"data": {"random": True, "ranges": {"token_type_ids": [0, 5]},
                                    "shapes": {"input_ids": [1, 4], "token_type_ids": [1, 4]}}})
    msg = str(info.value)
    assert msg.startswith("prepare: the model does not run on the random (seed 0) inputs:")
    assert "inputs token_type_ids reach node 'type_lookup'" in msg
    assert "check.data.ranges: {token_type_ids: [low, high]}" in msg


def test_a_control_input_needs_its_range(tmp_path):
    model = control_input(tmp_path / "m.onnx")
    with pytest.raises(StageError, match=r"sample_rate.*check\.data\.ranges: \{sample_rate: \[low, high\]\}"):
        run_prepare(model, tmp_path / "a", target_opset=17)
    result = run_prepare(model, tmp_path / "b", target_opset=17,
                         check={"data": {"random": True, "ranges": {"sample_rate": [16000, 16000]}}})
    report = json.loads(result.outputs["report"].read_text())
    assert report["conversion"]["check"]["ok"] is True and not result.warnings


def test_ranges_name_real_inputs(tmp_path):
    with pytest.raises(StageError, match=r"check.data.ranges: the model has no input 'token_types' "
                                         r"\(did you mean 'token_type_ids'\?\)"):
        run_prepare(bert_like(tmp_path / "m.onnx"), tmp_path / "out",
                    check={"data": {"random": True, "ranges": {"token_types": [0, 1]}}})


@pytest.mark.slow
def test_calibrate_with_random_token_ids(tmp_path):
    model = tmp_path / "m.onnx"
    bert_like(model, opset=17)
    (tmp_path / "out").mkdir()
    params = CalibrateStage.model_validate({"kind": "calibrate", "holdout": 2, "data": {
        "random": True, "samples": 4, "shapes": {"input_ids": [1, 6], "token_type_ids": [1, 6]}}})
    result = calibrate.run(params, Inputs({"model": Artifact(model, "onnx", "m")}), tmp_path / "out")
    assert result.metrics["quantize_linear_nodes"] >= 1
    out = json.loads(result.outputs["report"].read_text())["accuracy"]["outputs"]["y"]
    assert out["nan"] == 0 and out["cosine"] > 0.99
    assert any(w.startswith("calibrated on random inputs") for w in result.warnings)


@pytest.mark.slow
def test_poor_int8_accuracy_is_not_quiet(tmp_path):
    """A threshold at the 20th percentile clips most activations: the pre-flight falls below the bar and says so."""
    model = tmp_path / "m.onnx"
    bert_like(model, opset=17)
    (tmp_path / "out").mkdir()
    # entropy_check off: the check would rescue it with the full ranges
    params = CalibrateStage.model_validate({"kind": "calibrate", "holdout": 2, "method": "percentile",
                                            "percentile": 20, "entropy_check": False,
                                            "data": {"random": True, "samples": 4}})
    result = calibrate.run(params, Inputs({"model": Artifact(model, "onnx", "m")}), tmp_path / "out")
    bar = [w for w in result.warnings if "cosine" in w]
    assert bar and "< 0.99 against FP32" in bar[0] and "onnxruntime-cpu" in bar[0]
    assert "**warning**" in result.summary or "warning:" in result.summary


@pytest.mark.parametrize("write, expected", [
    (lambda p: np.savez(p, x=np.full((1, 3, 48, 192), np.nan, np.float32)),
     "calibrate: bad.npz: input 'x' holds 27648 NaN/Inf value(s) of 27648"),
    (lambda p: np.save(p.with_suffix(".npy"), np.array([{"x": 1}], dtype=object)) or
     p.with_suffix(".npy").rename(p),
     "calibrate: bad.npz is not an array numpy reads without unpickling (Object arrays cannot be loaded when "
     "allow_pickle=False)"),
    (lambda p: p.write_bytes(b"not a zip, not an array\n" * 10),
     "calibrate: bad.npz is not an array numpy reads without unpickling"),
], ids=["NaN", "object array", "not a zip"])
def test_sample_files_that_are_not_finite_arrays_are_bad_input(tmp_path, write, expected):
    """Issue #27: NaN samples were numpy's `autodetected range of [nan, nan]` as an unexpected error, an object
    array or a file that is not an array numpy's own text, retried as if transient. Now each is a StageError (never
    retried) naming the file and the input."""
    from tests.assets import PPOCR

    bad = tmp_path / "bad.npz"
    write(bad)
    params = CalibrateStage.model_validate({"kind": "calibrate", "data": {"tensors": "*.npz"}, "holdout": 0,
                                            "method": "minmax"})
    inputs = Inputs({"model": Artifact(PPOCR, "onnx", "m"), "tensors": [Artifact(bad, "file", "t")]})
    (tmp_path / "out").mkdir()
    with pytest.raises(StageError) as info:
        calibrate.run(params, inputs, tmp_path / "out")
    assert type(info.value) is StageError and str(info.value).startswith(expected), str(info.value)


def test_given_tensors_keep_the_models_unsigned_and_16_bit_integer_types():
    """A uint32 (or uint16, int16, uint64) input given as saved tensors reaches ONNX Runtime in its own type, not
    cast to float32 (found by bench/unsupported_ops.py: a uint32 Add refused 'expected tensor(uint32)'), and a
    random one is made in that type."""
    from types import SimpleNamespace

    import numpy as np

    from trtflow.stages.ort.runner import fit_to_input, random_input

    for onnx_type, dtype in (("tensor(uint32)", np.uint32), ("tensor(uint16)", np.uint16),
                             ("tensor(int16)", np.int16), ("tensor(uint64)", np.uint64)):
        spec = SimpleNamespace(name="x", shape=[1, 4], type=onnx_type)
        assert fit_to_input(np.arange(4, dtype=dtype), spec).dtype == dtype
        assert random_input(spec, {}, np.random.default_rng(0)).dtype == dtype
    unknown = SimpleNamespace(name="x", shape=[4], type="tensor(float8e4m3fn)")
    assert fit_to_input(np.arange(4, dtype=np.int8), unknown).dtype == np.int8  # as given, never made float32
