"""Issue #43: numbers that agree. Calibrate's INT8 pre-flight and validate measure a variant through the same
simulation and comparison (stages/ort/simulation.py), so on the same samples they give the same number, and each
report says on how many samples and which graph; a comparison that cannot catch errors (the reference's output does
not vary with its input, or the samples are one input) says so."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.graphs import dead_segmenter, masked_attention, text_map
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageFailed
from trtflow.pipelines.params.calibrate import CalibrateStage
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.calibrate import stage as calibrate
from trtflow.stages.compare.accuracy import Comparison
from trtflow.stages.precision import stage as precision
from trtflow.stages.validate import stage as validate


def _stage(module, schema, out: Path, inputs: dict, **kw):
    out.mkdir(parents=True)
    return module.run(schema.model_validate({"kind": schema.model_fields["kind"].annotation.__args__[0], **kw}),
                      Inputs(inputs), out)


def _validate(out: Path, reference: Path, variant: Artifact, tensors: list[Artifact]) -> tuple[dict, list[str]]:
    """validate's report and warnings (it may fail: the report is written all the same)."""
    try:
        result = _stage(validate, ValidateStage, out, {"reference": Artifact(reference, "onnx", "ref", "prepare"),
                                                       "models": [variant], "tensors": tensors},
                        data={"tensors": "*.npy"}, locate_first_bad_layer=False)
    except StageFailed as failed:
        result = failed.result
    return json.loads(result.outputs["report"].read_text()), result.warnings


def _scenes(folder: Path, n: int, strokes: bool, seed: int) -> list[Artifact]:
    """Sensor noise, and with `strokes` a bright bar of text (what the detector marks)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = (rng.standard_normal((1, 3, 32, 32)) * 0.02).astype(np.float32)
        if strokes:
            row = int(rng.integers(0, 24))
            x[:, :, row:row + 3, 4:28] += 2.0
        path = folder / f"{'text' if strokes else 'blank'}{i}.npy"
        np.save(path, x)
        out.append(Artifact(path, "file", path.name))
    return out


@pytest.mark.slow
def test_calibrate_preflight_and_validate_agree_on_the_same_samples(tmp_path):
    """The PP-OCRv4 detector's case, planted: calibrated and held out on scenes without text, where the map is
    sigmoid(-12) everywhere, the pre-flight passed its INT8 variant quietly while validate, on scenes with text,
    measured it at cosine ~0.82. The pre-flight now says its samples cannot catch errors; validate given the
    pre-flight's own samples gives its number, on the graph both reports name."""
    model = text_map(tmp_path / "det.onnx")
    blank = _scenes(tmp_path, 8, strokes=False, seed=0)
    cal = _stage(calibrate, CalibrateStage, tmp_path / "cal", {"model": Artifact(model, "onnx", "prepare"),
                                                              "tensors": blank},
                 data={"tensors": "*.npy"}, holdout=2)
    report = json.loads(cal.outputs["report"].read_text())
    pre = report["accuracy"]
    assert pre["samples"] == 2 and report["holdout"] == "samples 7-8 of saved tensors"
    assert pre["graph"].startswith("model.onnx sha256:") and pre["graph"] in cal.summary
    assert "2 held-out samples (samples 7\\-8 of saved tensors)" in cal.summary
    # the pre-flight's samples cannot catch errors: a warning on the console (the stage's warnings) and in the summary
    blind = [w for w in cal.warnings if "the pre-flight on 2 held-out samples says nothing" in w]
    assert blind and "does not vary with its input" in blind[0], cal.warnings
    assert "does not vary with its input" in cal.summary
    # both count the same INT8 nodes: validate's repair counts the nodes reading quantized weights
    assert report["quantized_nodes"] == 3 and f"{report['quantized_nodes']} quantized nodes" in cal.summary

    variant = Artifact(cal.outputs["model"], "onnx", "int8", "int8")
    same, same_warnings = _validate(tmp_path / "same", model, variant, blank[-2:])
    (cand,) = same["candidates"]
    assert cand["accuracy"]["samples"] == pre["samples"] and cand["accuracy"]["graph"] == pre["graph"]
    for name, got in cand["accuracy"]["outputs"].items():
        assert got["cosine"] == pytest.approx(pre["outputs"][name]["cosine"], abs=1e-9)
        assert got["max_abs"] == pytest.approx(pre["outputs"][name]["max_abs"], abs=1e-9)
    assert any("does not vary with its input" in w for w in same_warnings), same_warnings

    text, _ = _validate(tmp_path / "text", model, variant, _scenes(tmp_path, 4, strokes=True, seed=1))
    (cand,) = text["candidates"]
    assert not cand["passed"] and cand["accuracy"]["outputs"]["prob"]["cosine"] < 0.95
    assert cand["accuracy"]["graph"] == pre["graph"] and cand["accuracy"].get("blind") is None


def test_a_reference_whose_output_ignores_its_input_is_named(tmp_path):
    """DeepLabV3 with random weights: the same output whatever the input, so every variant showed error 0 and
    passed, which it could not have failed. The FP16 pre-flight and validate both warn."""
    model = dead_segmenter(tmp_path / "seg.onnx")
    data = {"random": True, "samples": 4}
    fp16 = _stage(precision, PrecisionStage, tmp_path / "fp16", {"model": Artifact(model, "onnx", "prepare")},
                  data=data, holdout=2, preflight="off")
    assert any("says nothing: the reference's output does not vary with its input" in w for w in fp16.warnings), \
        fp16.warnings
    variant = Artifact(fp16.outputs["model"], "onnx", "fp16", "fp16")
    result = _stage(validate, ValidateStage, tmp_path / "v", {"reference": Artifact(model, "onnx", "ref", "prepare"),
                                                              "models": [variant]}, data=data)
    report = json.loads(result.outputs["report"].read_text())
    assert report["passed"] and report["candidates"][0]["accuracy"]["outputs"]["logits"]["max_abs"] < 1e-2
    warning = next(w for w in result.warnings if "does not vary with its input" in w)
    assert "cannot catch errors" in warning and "over 4 distinct samples" in warning, warning
    assert "does not vary with its input" in result.summary


def test_identical_samples_are_named():
    """A comparison whose samples are one input repeated cannot catch errors on any other; distinct samples on which
    the output varies raise nothing."""
    x = np.linspace(0, 1, 12, dtype=np.float32).reshape(1, 12)
    same = Comparison()
    for _ in range(3):
        same.add({"y": x * 2}, {"y": x * 2}, {"x": x})
    assert "its 3 samples are one and the same input" in same.result("test").blind
    varied = Comparison()
    for k in range(3):
        varied.add({"y": x * k}, {"y": x * k}, {"x": x + k})
    assert varied.result("test").blind is None


def test_localization_tells_first_past_bound_from_largest_drift_and_masks_from_overflow(tmp_path):
    """MiniLM's report named layer 0's LayerNorm as the first node that goes wrong while the largest drift was a
    late Gemm, and listed the attention mask's -3.4e38 as beyond FP16's 65504 although FP16 passed. A variant
    drifting a little at the query projection and a lot at the output projection: both are named, each for what it
    is; the mask's constant is a sentinel, not an overflow."""
    reference = masked_attention(tmp_path / "ref.onnx")
    variant = masked_attention(tmp_path / "variant.onnx", query_noise=0.05, out_noise=1.0)
    with pytest.raises(StageFailed) as failed:
        _stage(validate, ValidateStage, tmp_path / "v",
               {"reference": Artifact(reference, "onnx", "ref", "prepare"),
                "models": [Artifact(variant, "onnx", "drifted", "drifted")]},
               data={"random": True, "samples": 4, "ranges": {"mask": [0, 1]}})
    result = failed.value.result
    loc = json.loads(result.outputs["report"].read_text())["candidates"][0]["layerwise"]
    assert loc["first_bad"]["node"] == "query" and loc["worst"][0]["node"] == "out_proj", loc
    assert "**first node past its bound**" in result.summary and "`query`" in result.summary
    assert "**largest drift**: `out_proj` (MatMul)" in result.summary
    assert loc["overflow"] == [] and {r["tensor"] for r in loc["sentinels"]} >= {"mask_bias", "masked"}, loc
    assert "65504" not in result.summary
