"""A verdict you can act on (issue #24): a failing engine is never shipped. SqueezeNet with a planted FP16
overflow (real photos, real TensorRT-RTX builds on the CPU; engines simulated on ONNX Runtime: no GPU here):
validate fails the FP16 engine; repair finds the two planted nodes, builds the repaired variant at the failing
engine's profiles and validates it in the same run; benchmark measures only what passed. A repair that must give
back more than `repair_max_giveback` fails the stage: the precision is not viable."""
from __future__ import annotations

import json

import pytest

from tests.test_validate_stage import IMAGES, overflowing_squeezenet, photos, run_stage
from trtflow.artifact import Artifact
from trtflow.errors import StageFailed
from trtflow.pipelines.params.benchmark import BenchmarkStage
from trtflow.pipelines.params.build import BuildStage
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.benchmark import stage as benchmark
from trtflow.stages.build import stage as build
from trtflow.stages.precision import stage as precision
from trtflow.stages.trt.engines import VARIANT, built_engines
from trtflow.stages.validate import stage as validate


@pytest.mark.slow
def test_failing_engine_is_replaced_by_its_repair_or_fails_the_stage(tmp_path, tensorrt_backend):
    model = overflowing_squeezenet(tmp_path)
    inputs = photos(tmp_path)
    reference = Artifact(model, "onnx", "ref", "prepare")
    fp16 = run_stage(precision, PrecisionStage, tmp_path / "fp16", {"model": reference, **inputs}, data=IMAGES,
                     holdout=1, fallback={"auto": False})
    variant = Artifact(fp16.outputs["model"], "onnx", "fp16", "fp16")
    one = {"min": [1, 3, 224, 224], "opt": [1, 3, 224, 224], "max": [1, 3, 224, 224]}
    built = run_stage(build, BuildStage, tmp_path / "build", {"models": [reference, variant]},
                      profiles={"static": {"input": one}})
    engines = Artifact(built.outputs["engines"], "engines", "e", "build")
    stage_inputs = {"reference": reference, "models": [reference, variant], "engines": engines, **inputs}

    # the planted overflow needs 2 nodes kept in FP32: more than 1% of the variant's FP16 nodes
    with pytest.raises(StageFailed) as failed:
        run_stage(validate, ValidateStage, tmp_path / "strict", stage_inputs, data=IMAGES, repair=True,
                  repair_max_giveback=0.01)
    line = str(failed.value)
    assert line.startswith("validate: FP16 is not viable for this model at these tolerances: fp16.static.native")
    assert "NaN/Inf" in line and "deploy the FP32 (or BF16) variant" in line
    assert "giving back 1 of its" in line and "still fails" in line  # the search stops past the limit
    report = json.loads(failed.value.result.outputs["report"].read_text())
    assert not report["passed"] and report["shipped"] == ["prepare.static.native"]
    assert not built_engines(failed.value.result.outputs["engines"]), "a repair that is no repair is not built"

    fixed = run_stage(validate, ValidateStage, tmp_path / "v", stage_inputs, data=IMAGES, repair=True)
    report = json.loads(fixed.outputs["report"].read_text())
    names = {c["name"]: c for c in report["candidates"]}
    assert set(report["repair"]["nodes"]) == {"planted_up", "planted_down"}
    repaired = "fp16.static.native.repaired"
    assert not names["fp16.static.native"]["passed"] and names[repaired]["passed"]
    assert names[repaired]["engine"] and "simulated FP16" in names[repaired]["runtime"]
    assert report["passed"] and report["shipped"] == ["prepare.static.native", repaired]
    assert "passes in its place" in report["not_shipped"]["fp16.static.native"]
    assert fixed.metrics["not_shipped"] == ["fp16.static.native"]
    cell = fixed.outputs["engines"] / repaired
    assert (cell / "engine.plan").stat().st_size > 100_000 and (cell / VARIANT).exists()
    assert json.loads((cell / "spec.json").read_text())["profiles"] == json.loads(
        (built.outputs["engines"] / "fp16.static.native" / "spec.json").read_text())["profiles"]

    measured = run_stage(benchmark, BenchmarkStage, tmp_path / "bench",
                         {"engines": engines, "models": [reference, variant],
                          "validation": Artifact(fixed.outputs["report"], "json", "r", "validate"),
                          "repaired": Artifact(fixed.outputs["engines"], "engines", "x", "validate")},
                         tool="builtin", duration=0.2, warmup=0.05)
    bench = json.loads(measured.outputs["report"].read_text())
    assert sorted(c["candidate"] for c in bench["cells"]) == sorted(["prepare.static.native", repaired])
    assert list(bench["not_measured"]) == ["fp16.static.native"]
