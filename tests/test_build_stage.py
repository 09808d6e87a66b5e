"""Stage `build` with the real TensorRT-RTX builder on the CPU: FP32/FP16/INT8 variants, two dynamic-shape
profiles, compute-capability targets, a failing parse, and profile mistakes caught before any build.

No engine can be deserialized or run here (no GPU): what is checked is what can be without one."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.assets import PPOCR, SQUEEZENET
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.build import BuildStage
from trtflow.stages.build import stage as build

pytestmark = pytest.mark.tensorrt

PROFILES = {"bs1": {"input": {"min": [1, 3, 224, 224], "opt": [1, 3, 224, 224], "max": [1, 3, 224, 224]}},
            "dynamic": {"input": {"min": [1, 3, 224, 224], "opt": [4, 3, 224, 224], "max": [8, 3, 224, 224]}}}


def stage(**kw) -> BuildStage:
    return BuildStage.model_validate({"kind": "build", **kw})


def run_build(models: list[Artifact], out: Path, **kw):
    out.mkdir(parents=True)
    return build.run(stage(**kw), Inputs({"models": models}), out)


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> list[Artifact]:
    """FP32, FP16 and INT8 SqueezeNet, made by the real precision and calibrate stages."""
    from trtflow.pipelines.params.calibrate import CalibrateStage
    from trtflow.pipelines.params.precision import PrecisionStage
    from trtflow.stages.calibrate import stage as calibrate
    from trtflow.stages.precision import stage as precision
    tmp = tmp_path_factory.mktemp("variants")
    fp32 = Artifact(SQUEEZENET, "onnx", "a", "prepare")
    random = {"random": True, "samples": 4, "shapes": {"input": [1, 3, 224, 224]}}
    (tmp / "fp16").mkdir()
    fp16 = precision.run(PrecisionStage.model_validate({"kind": "precision", "data": random, "holdout": 1}),
                         Inputs({"model": fp32}), tmp / "fp16").outputs["model"]
    (tmp / "int8").mkdir()
    int8 = calibrate.run(CalibrateStage.model_validate({"kind": "calibrate", "data": random, "method": "minmax",
                                                        "holdout": 0}),
                         Inputs({"model": fp32}), tmp / "int8").outputs["model"]
    return [fp32, Artifact(fp16, "onnx", "b", "fp16"), Artifact(int8, "onnx", "c", "int8")]


@pytest.mark.slow
def test_full_matrix_with_two_dynamic_profiles(tmp_path, variants, tensorrt_backend):
    result = run_build(variants, tmp_path / "out", profiles=PROFILES)
    report = json.loads(result.outputs["report"].read_text())
    assert [c["name"] for c in report["cells"]] == [f"{v}.{p}.native" for v in ("prepare", "fp16", "int8")
                                                    for p in ("bs1", "dynamic")]
    for cell in report["cells"]:
        engine = result.outputs["engines"] / cell["name"] / "engine.plan"
        assert cell["status"] == "ok" and engine.stat().st_size == cell["engine_bytes"] > 500_000
        info = json.loads((engine.parent / "build.json").read_text())
        assert info["runtime"].startswith("tensorrt") and info["layers"] > 10
        assert info["inputs"][0]["name"] == "input" and info["inputs"][0]["shape"] == [-1, 3, 224, 224]
        assert info["validity"]["checked"] and info["validity"]["validity"] in ("VALID", "INVALID", "SUBOPTIMAL")
        assert info["peak_host_memory_mb"] > 10 and (engine.parent / "build.log").exists()
        assert info["environment"]["tensorrt"]["version"] == tensorrt_backend.version
    dyn = next(c for c in report["cells"] if c["name"] == "fp16.dynamic.native")
    assert dyn["shapes"]["dynamic"]["input"][2] == [8, 3, 224, 224]
    sizes = {c["variant"]: c["engine_bytes"] for c in report["cells"] if "bs1" in c["name"]}
    assert sizes["fp16"] < sizes["prepare"], "FP16 weights take half the room"
    assert "6/6 engines" in result.summary


@pytest.mark.slow
def test_combined_profiles_and_targets(tmp_path, variants):
    result = run_build(variants[:1], tmp_path / "out", profiles=PROFILES, profile_mode="combined",
                       targets=["sm86", "sm120"])
    cells = json.loads(result.outputs["report"].read_text())["cells"]
    assert [c["name"] for c in cells] == ["prepare.bs1+dynamic.sm86", "prepare.bs1+dynamic.sm120"]
    assert all(c["options"]["compute_capability"] in ("sm86", "sm120") for c in cells)


def test_failing_parse_fails_the_cell_with_a_report(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Unique", ["x"], ["y"], name="uniq0")], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["K"])])
    bad = tmp_path / "unique.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(bad))
    with pytest.raises(StageFailed, match=r"1 of 1 engine\(s\) failed; prepare.static.native: parse failed: "
                                          r"uniq0 \(Unique\)") as info:
        run_build([Artifact(bad, "onnx", "x", "prepare")], tmp_path / "out")
    assert "**failed**" in info.value.result.summary
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    failure = report["cells"][0]["failures"][0]
    assert (failure["node"], failure["op_type"]) == ("uniq0", "Unique") and failure["importer"] is False
    assert failure["hint"].startswith("the parser has no importer for 'Unique'") and "host" in failure["hint"]


def _prepared_ppocr(tmp_path: Path) -> Artifact:
    from trtflow.stages.onnx.graph import sanitize_dims
    m = onnx.load(str(PPOCR))
    sanitize_dims(m)
    path = tmp_path / "ppocr.onnx"
    onnx.save(m, str(path))
    return Artifact(path, "onnx", "p", "prepare")


@pytest.mark.parametrize("profiles,message", [
    ({}, r"input 'x' dimension 0 \(x_dim0\) is dynamic, but no optimization profile is given"),
    ({"p": {"X": {"min": [1, 3, 48, 192], "opt": [1, 3, 48, 192], "max": [1, 3, 48, 192]}}},
     r"profiles.p: model 'prepare' has no input 'X' \(did you mean 'x'\?\)"),
    ({"p": {"x": {"min": [1, 3, 48], "opt": [1, 3, 48], "max": [1, 3, 48]}}},
     r"profiles.p.x: rank 3 does not match the model's input rank 4"),
    ({"p": {"x": {"min": [1, 1, 48, 192], "opt": [1, 1, 48, 192], "max": [1, 1, 48, 192]}}},
     r"profiles.p.x: dimension 1 is fixed at 3 in model 'prepare', but the profile gives 1/1/1"),
])
def test_profile_mistakes_are_caught_before_building(tmp_path, profiles, message):
    with pytest.raises(StageError, match=message):
        run_build([_prepared_ppocr(tmp_path)], tmp_path / "out", profiles=profiles)
    assert not (tmp_path / "out" / "engines").exists()


def test_ppocr_dynamic_height_and_width(tmp_path):
    shapes = {"min": [1, 3, 48, 48], "opt": [4, 3, 48, 192], "max": [16, 3, 48, 640]}
    result = run_build([_prepared_ppocr(tmp_path)], tmp_path / "out", profiles={"lines": {"x": shapes}})
    assert json.loads(result.outputs["report"].read_text())["cells"][0]["status"] == "ok"


@pytest.mark.slow
def test_options_the_backend_lacks(tmp_path, variants, monkeypatch, tensorrt_backend):
    if tensorrt_backend.flavour == "tensorrt-rtx":
        with pytest.raises(StageError, match=r"legacy_precision \(fp16\) needs TensorRT 10's builder flags"):
            run_build(variants[:1], tmp_path / "a", legacy_precision=["fp16"], profiles=PROFILES)
        with pytest.raises(StageError, match=r"unknown target 'sm99'"):
            run_build(variants[:1], tmp_path / "b", targets=["sm99"], profiles=PROFILES)
    # a machine without any TensorRT flavour: this checks trtflow's message, nothing about TensorRT
    monkeypatch.setattr(build, "find_tensorrt", lambda: None)
    with pytest.raises(StageError, match=r"no TensorRT flavour is installed: pip install tensorrt-rtx-cu13"):
        run_build(variants[:1], tmp_path / "c", profiles=PROFILES)


@pytest.mark.slow
def test_builder_options_and_timing_cache(tmp_path, variants):
    shared = tmp_path / "shared"
    shared.mkdir()
    (tmp_path / "out").mkdir()
    params = stage(profiles=PROFILES, optimization_level=2, workspace="256MiB")
    result = build.run(params, Inputs({"models": variants[1:2], "timing_cache": Artifact(shared, "shared-cache", "")}),
                       tmp_path / "out")
    cell = json.loads(result.outputs["report"].read_text())["cells"][0]
    assert cell["options"] == {"optimization_level": 2, "workspace": 256 * 2**20}
    assert list(shared.glob("timing-*.cache"))


def test_strip_plan_without_a_gpu_fails_the_cell_not_the_pipeline(tmp_path, variants, tensorrt_backend):
    # seen here: TensorRT-RTX 1.7 needs CUDA to build a weight-stripped plan; the cell reports the builder's error
    if tensorrt_backend.flavour != "tensorrt-rtx":
        pytest.skip("a TensorRT-RTX observation")
    with pytest.raises(StageFailed, match="the builder returned no engine"):
        run_build(variants[:1], tmp_path / "out", profiles={"bs1": PROFILES["bs1"]}, strip_plan=True)


@pytest.mark.slow
def test_an_int8_engine_larger_than_fp32_is_not_quiet(tmp_path, tensorrt_backend):
    """PP-OCR's classifier (small convs): TensorRT-RTX's INT8 engine is larger than its FP32 engine. The warning
    names the causes that apply: every engine carries its JIT kernels' CUDA source, INT8 adds an epilogue kernel
    per Conv; and when depthwise Convs are quantized (float_depthwise: false) under a static profile, the zero
    padding TensorRT-RTX stores."""
    from onnx import version_converter

    from trtflow.pipelines.params.calibrate import CalibrateStage
    from trtflow.stages.calibrate import stage as calibrate

    fp32 = _prepared_ppocr(tmp_path)
    onnx.save(version_converter.convert_version(onnx.load(str(fp32.path)), 17), str(fp32.path))
    shapes = {"x": [1, 3, 48, 192]}

    def int8(name: str, **recipe) -> Artifact:
        (tmp_path / name).mkdir()
        params = CalibrateStage.model_validate({"kind": "calibrate", "holdout": 0, "method": "minmax", **recipe,
                                                "data": {"random": True, "samples": 2, "shapes": shapes}})
        return Artifact(calibrate.run(params, Inputs({"model": fp32}), tmp_path / name).outputs["model"], "onnx",
                        name, "int8")

    static = {"lines": {"x": {"min": shapes["x"], "opt": shapes["x"], "max": shapes["x"]}}}
    result = run_build([fp32, int8("default")], tmp_path / "out", profiles=static)
    cells = {c["variant"]: c for c in json.loads(result.outputs["report"].read_text())["cells"]}
    assert cells["prepare"]["precision"] == "fp32" and cells["int8"]["precision"] == "int8"
    if tensorrt_backend.flavour != "tensorrt-rtx":
        return
    assert cells["int8"]["engine_bytes"] > cells["prepare"]["engine_bytes"]
    (warning,) = result.warnings
    assert "is larger than the FP32 engine" in warning and "CUDA source of every JIT-compiled kernel" in warning
    assert "min_weight_params: 48000" in warning and "FP16 variant" in warning
    # the RGB stem's 3 channels (and a few Convs' odd counts) are padded to 4; no depthwise Conv is quantized
    assert "of its INT8 Convs have input channels per group not a multiple of 4" in warning
    assert "give the profile a dynamic dimension" in warning and "float_depthwise" not in warning
    assert "**warning**" in result.summary
    padded = int8("padded", float_depthwise=False)
    (warning,) = run_build([fp32, padded], tmp_path / "padded-static", profiles=static).warnings
    assert warning.startswith("the INT8 engine int8.lines.native (") and "(11 depthwise)" in warning
    assert "float_depthwise: true" in warning
    assert "CUDA source" in warning
    dynamic = {"lines": {"x": {"min": [1, 3, 48, 48], "opt": shapes["x"], "max": [8, 3, 48, 320]}}}
    (warning,) = run_build([fp32, padded], tmp_path / "padded-dynamic", profiles=dynamic).warnings
    assert "depthwise" not in warning, "with a dynamic dimension, no zeros are stored"


@pytest.mark.slow
def test_a_changed_variant_rebuilds_only_its_own_engines(tmp_path, variants):
    """The stage's key covers all its models, so a new FP16 block list gave a new build stage result; with the
    engine cache (keyed per cell: model digest, profiles, target, TensorRT, options, GPU) the FP32 and INT8
    engines are taken as they were, the FP16 ones built. A cache entry whose engine was changed is not served."""
    shared = tmp_path / "shared"
    shared.mkdir()
    profiles = {"bs1": PROFILES["bs1"]}

    def run(models, out):
        out.mkdir()
        result = build.run(stage(profiles=profiles), Inputs({"models": models,
                                                             "engine_cache": Artifact(shared, "shared-cache", "")}),
                           out)
        return {c["name"]: c for c in json.loads(result.outputs["report"].read_text())["cells"]}, result

    first, _ = run(variants, tmp_path / "a")
    assert all(c["status"] == "ok" and "reused" not in c for c in first.values())
    fp16 = onnx.load(str(variants[1].path))
    fp16.doc_string = "another block list"  # a changed FP16 variant: another digest
    changed = tmp_path / "fp16-b.onnx"
    onnx.save(fp16, str(changed))
    second, result = run([variants[0], Artifact(changed, "onnx", "b2", "fp16"), variants[2]], tmp_path / "b")
    assert second["prepare.bs1.native"]["reused"] and second["int8.bs1.native"]["reused"]
    assert "reused" not in second["fp16.bs1.native"]
    engines = result.outputs["engines"]
    assert (engines / "prepare.bs1.native" / "engine.plan").read_bytes() == \
        (tmp_path / "a" / "engines" / "prepare.bs1.native" / "engine.plan").read_bytes()
    assert json.loads((engines / "int8.bs1.native" / "spec.json").read_text())["model"] == str(variants[2].path)
    assert "engine cache" in result.summary
    # an engine changed in the cache fails its digest and is built again
    entry = shared / "engines" / second["prepare.bs1.native"]["reused"]
    plan = entry / "engine.plan"
    data = bytearray(plan.read_bytes())
    data[len(data) // 2] ^= 0xFF
    plan.unlink()  # a hard link to the published engine: replace, never write through it
    plan.write_bytes(bytes(data))
    third, _ = run(variants, tmp_path / "c")
    assert "reused" not in third["prepare.bs1.native"] and third["int8.bs1.native"]["reused"]
    fourth, _ = run(variants, tmp_path / "d")  # the rebuilt engine replaced the bad entry
    assert fourth["prepare.bs1.native"]["reused"] == second["prepare.bs1.native"]["reused"]
