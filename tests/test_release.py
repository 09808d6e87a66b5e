"""Stage `release` on engines the real TensorRT-RTX builder made on the CPU: the Triton config follows the
engine's IO and profiles and parses with Triton's own schema (tritonclient's model_config_pb2), an engine that
failed validation is never shipped, versions increase with each engine released.

No engine runs here, and Triton's TensorRT backend would not load a TensorRT-RTX engine anyway: what is checked is
the configuration Triton reads and the rules it applies to it (tests/test_example.py has the model card in a
browser)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format

from tests.assets import PPOCR, SQUEEZENET
from tests.test_validate_stage import IMAGES, overflowing_squeezenet, photos, run_stage
from tests.triton_server import stub_backend_utils
from trtflow.artifact import Artifact, Inputs, Provenance, StageResult
from trtflow.errors import StageError, StageFailed
from trtflow.flows.store import LocalStore, claim_all
from trtflow.pipelines.params.build import BuildStage
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.pipelines.params.release import ReleaseStage
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.build import stage as build
from trtflow.stages.precision import stage as precision
from trtflow.stages.release import stage as release
from trtflow.stages.release.triton import config as triton_config
from trtflow.stages.trt.engines import built_engines
from trtflow.stages.validate import stage as validate

pytestmark = pytest.mark.tensorrt

# these releases share one store's ledger: each one changes the contract on purpose
ANY_CONTRACT = {"require": "built", "prefer": "size", "contract": "allow_change"}
LINES = {"x": {"min": [1, 3, 48, 48], "opt": [8, 3, 48, 192], "max": [32, 3, 48, 640]}}


def triton_reads(text: str):
    """The config as Triton reads it: its own generated schema, protobuf's text format."""
    from tritonclient.grpc import model_config_pb2  # noqa: F401 - needs grpcio: load the generated file instead
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def parse(text: str):
    try:
        return triton_reads(text)
    except (ImportError, RuntimeError):  # tritonclient without its grpc extra: the same generated module, by file
        return text_format.Parse(text, triton_config.model_config_pb2().ModelConfig())


def engines(tmp: Path, models: list[Artifact], **kw) -> Path:
    out = tmp / f"build{len(list(tmp.glob('build*')))}"
    out.mkdir(parents=True)
    return build.run(BuildStage.model_validate({"kind": "build", "engine_cache": False, "timing_cache": False,
                                                **kw}), Inputs({"models": models}), out).outputs["engines"]


def released(tmp: Path, engines_dir: Path, shared: Path | None = None, died: bool = False, **kw) -> StageResult:
    """A release stage's run and what the runner does around it: the versions it claims, created in the store's
    shared/ before its result is published, and their publication marks after (none where the run `died` between
    the two)."""
    out = tmp / f"release{len(list(tmp.glob('release*')))}"
    out.mkdir(parents=True)
    inputs = Inputs({"engines": Artifact(engines_dir, "engines", "e", "build"),
                     **{k: Artifact(v, "json", k, k) for k, v in kw.pop("reports", {}).items()},
                     **kw.pop("more", {})})
    inputs["releases"] = Artifact(shared or tmp / "shared", "shared-cache", "")
    inputs.lineage = (Provenance("source", "model", "", {"model": "abc"}),)
    params = ReleaseStage.model_validate({"kind": "release", **kw,
                                          "triton": {"model_name": "cls", **kw.get("triton", {})}})
    result = release.run(params, inputs, out)
    store = LocalStore(inputs["releases"].path.parent)
    assert claim_all(store, result.claims) is None
    if not died:
        assert claim_all(store, result.after_publish) is None
    return result


def release_of(tmp: Path, engines_dir: Path, shared: Path | None = None, **kw) -> tuple[dict, Path]:
    result = released(tmp, engines_dir, shared, **kw)
    return json.loads(result.outputs["report"].read_text()), result.outputs["report"].parent


def config_of(out: Path, target: str = "native", model: str = "cls"):
    return parse((out / "triton" / target / model / "config.pbtxt").read_text())


@pytest.fixture(scope="module")
def cls(tmp_path_factory) -> Artifact:
    """PP-OCR's direction classifier with its anonymous dimensions named, as the prepare stage leaves it (PaddlePaddle
    names height and width both '?', which TensorRT reads as one dimension)."""
    import onnx

    from trtflow.stages.onnx.graph import sanitize_dims
    model = onnx.load(str(PPOCR))
    sanitize_dims(model)
    path = tmp_path_factory.mktemp("cls") / "cls.onnx"
    onnx.save(model, str(path))
    return Artifact(path, "onnx", "p", "prepare")


@pytest.mark.slow
def test_config_follows_the_profiles(tmp_path, cls, tensorrt_backend):
    report, out = release_of(tmp_path, engines(tmp_path, [cls], profiles={"lines": LINES}),
                             select=ANY_CONTRACT)
    c = config_of(out)
    assert c.platform == "tensorrt_plan" and c.max_batch_size == 32
    assert [(i.name, list(i.dims)) for i in c.input] == [("x", [3, 48, -1])]  # H pinned by the profile, W not
    assert [(o.name, list(o.dims)) for o in c.output] == [("save_infer_model/scale_0.tmp_1", [2])]
    assert list(c.dynamic_batching.preferred_batch_size) == [8] and c.instance_group[0].kind == 1  # KIND_GPU
    assert report["targets"][0]["max_batch_size"] == 32
    plan = out / "triton" / "native" / "cls" / "1" / "model.plan"
    assert plan.read_bytes() == built_engines(tmp_path / "build0" / "engines")[0].plan.read_bytes()

    # a smaller batch and a fixed width: max_batch_size and dims follow
    smaller = {"x": {"min": [1, 3, 48, 192], "opt": [2, 3, 48, 192], "max": [4, 3, 48, 192]}}
    _, out = release_of(tmp_path, engines(tmp_path, [cls], profiles={"lines": smaller}),
                        select=ANY_CONTRACT)
    c = config_of(out)
    assert c.max_batch_size == 4 and list(c.input[0].dims) == [3, 48, 192]
    assert list(c.dynamic_batching.preferred_batch_size) == [2]

    # told there is no batch dimension (an output counting detections would need it): full shapes; or a cap
    _, out = release_of(tmp_path, tmp_path / "build1" / "engines", select=ANY_CONTRACT,
                        triton={"max_batch_size": 0})
    assert config_of(out).max_batch_size == 0 and list(config_of(out).input[0].dims) == [-1, 3, 48, 192]
    with pytest.raises(StageError, match="triton.max_batch_size 8, but the engine takes batches of at most 4"):
        release_of(tmp_path, tmp_path / "build1" / "engines", select=ANY_CONTRACT,
                   triton={"max_batch_size": 8})

    # a profile that does not take a batch of 1: no batch dimension Triton could fill, the engine's full shape
    no_one = {"x": {"min": [2, 3, 48, 48], "opt": [8, 3, 48, 192], "max": [32, 3, 48, 640]}}
    report, out = release_of(tmp_path, engines(tmp_path, [cls], profiles={"lines": no_one}),
                             select=ANY_CONTRACT)
    c = config_of(out)
    assert c.max_batch_size == 0 and list(c.input[0].dims) == [-1, 3, 48, -1]
    assert not c.HasField("dynamic_batching")
    assert "does not take a batch of 1" in report["targets"][0]["batch_note"]

    # two profiles in one engine: an instance group per profile, max_batch_size the least of their maxima
    two = {"small": smaller, "lines": LINES}
    _, out = release_of(tmp_path, engines(tmp_path, [cls], profiles=two, profile_mode="combined"),
                        select=ANY_CONTRACT)
    c = config_of(out)
    assert c.max_batch_size == 4
    assert [list(g.profile) for g in c.instance_group] == [["0"], ["1"]]


@pytest.mark.slow
def test_triton_settings_pass_through_checked_by_its_schema_and_warmup_per_profile(tmp_path, cls, tensorrt_backend):
    """optimization, response_cache and parameters reach config.pbtxt as given (a key Triton's schema has not got
    is refused with the key named); model_warmup runs each profile at its opt shape (random data: the release
    declares no samples)."""
    built = engines(tmp_path, [cls], profiles={"lines": LINES})
    _, out = release_of(tmp_path, built, select=ANY_CONTRACT, triton={
        "optimization": {"cuda": {"graphs": True}, "priority": "PRIORITY_MAX"}, "response_cache": True,
        "parameters": {"note": "a b"}})
    c = config_of(out)
    assert c.optimization.cuda.graphs and c.optimization.priority == 1 and c.response_cache.enable
    assert c.parameters["note"].string_value == "a b"
    (warm,) = c.model_warmup
    assert warm.name == "opt-lines" and warm.batch_size == 8 and warm.inputs["x"].random_data
    assert list(warm.inputs["x"].dims) == [3, 48, 192]
    with pytest.raises(StageError, match="triton.optimization is not Triton's `optimization` block: .*graph"):
        release_of(tmp_path, built, select=ANY_CONTRACT, triton={"optimization": {"cuda": {"graph": True}}})


@pytest.mark.slow
def test_the_same_engine_under_another_contract_is_a_new_version(tmp_path, cls, tensorrt_backend):
    """The engine of version 1 released again with a smaller batch cap: clients of version 1 could send 32, so it
    is refused by default, and with allow_change it ships as version 2, never as version 1 with another config."""
    built = engines(tmp_path, [cls], profiles={"lines": LINES})
    shared = tmp_path / "shared"
    first, _ = release_of(tmp_path, built, shared, select={"require": "built", "prefer": "size"})
    assert first["targets"][0]["version"] == 1
    with pytest.raises(StageFailed, match="would change its serving contract: max_batch_size 32 -> 16"):
        release_of(tmp_path, built, shared, select={"require": "built", "prefer": "size"},
                   triton={"max_batch_size": 16})
    again, out = release_of(tmp_path, built, shared, select=ANY_CONTRACT, triton={"max_batch_size": 16})
    assert again["targets"][0]["version"] == 2 and again["targets"][0]["new_version"]
    assert again["targets"][0]["contract_changes"] == ["max_batch_size 32 -> 16"]
    assert (out / "triton" / "native" / "cls" / "2" / "model.plan").is_file()


@pytest.mark.slow
def test_a_version_claimed_by_a_run_that_died_is_announced_by_the_run_that_publishes_it(tmp_path, cls,
                                                                                        tensorrt_backend):
    """Issue #49 item 7, on a local store: version 2 (a smaller batch cap) claimed by a run that died before its
    release was published. The next run ships version 2 as new, its contract compared with version 1 (it was said
    not new, compared with itself, and never announced); once published it is not new again. A ledger written
    before publications were marked counts every version as published."""
    from trtflow.events import StageRan
    from trtflow.stages.release.triton import versions

    built = engines(tmp_path, [cls], profiles={"lines": LINES})
    shared = tmp_path / "shared"
    assert release_of(tmp_path, built, shared, select=ANY_CONTRACT)[0]["targets"][0]["version"] == 1
    smaller = {"select": ANY_CONTRACT, "triton": {"max_batch_size": 16}}
    released(tmp_path, built, shared, died=True, **smaller)
    assert (shared / "releases" / "cls" / "native" / "2.json").is_file()

    result = released(tmp_path, built, shared, **smaller)
    (shipped,) = result.metrics["versions"]["released"]
    assert (shipped["version"], shipped["new"]) == (2, True)
    assert shipped["previous_version"] == 1
    assert shipped["contract_changes"] == ["max_batch_size 32 -> 16"]
    assert "native: the serving contract changed since version 1: max_batch_size 32 -> 16" in result.warnings
    (event,) = versions.announce(StageRan(tmp_path / "pipeline.yaml", "release", "k", tmp_path, result.metrics))
    assert event.version == 2 and event.payload["contract_changes"] == ["max_batch_size 32 -> 16"]
    assert event.payload["previous_version"] == 1

    again = released(tmp_path, built, shared, **smaller)
    assert [(r["version"], r["new"], r["contract_changes"]) for r in again.metrics["versions"]["released"]] == [(2, False, [])]
    assert versions.announce(StageRan(tmp_path / "pipeline.yaml", "release", "k", tmp_path, again.metrics)) == []

    marks = shared / "releases" / "cls" / "native.published"
    assert sorted(p.name for p in marks.iterdir()) == ["1.json", "2.json", "since.json"]
    (marks / "3.json").write_text("{}")  # a mark is read as strictly as a version's record
    with pytest.raises(StageError, match=r"native.published/3.json: unreadable release ledger \(version: Field"):
        released(tmp_path, built, shared, **smaller)
    shutil.rmtree(marks)  # the ledger as a trtflow that marks nothing wrote it
    legacy = released(tmp_path, built, shared, **smaller)
    assert [(r["version"], r["new"]) for r in legacy.metrics["versions"]["released"]] == [(2, False)]


@pytest.mark.slow
def test_a_config_triton_would_refuse_is_caught(tmp_path, cls, tensorrt_backend):
    """The checks mirror Triton's load rules: each mistake a hand-written config makes is named."""
    eng = built_engines(engines(tmp_path, [cls], profiles={"lines": LINES}))[0]
    good = triton_config.make("cls", eng, ReleaseStage.model_validate({"kind": "release"}).triton)
    assert triton_config.problems(parse(triton_config.to_text(good)), eng) == []
    for edit, expect in [
        ("max_batch_size: 64", "profile 'lines' takes batches 1..32, Triton sends 1..64"),
        ("data_type: TYPE_FP16", "TYPE_FP16, but the engine's is FLOAT"),
        ("dims: 3\n  dims: 48\n  dims: -1", None),  # the written one: fine
        ("dims: 3\n  dims: 64\n  dims: -1", "dimension 2 is 64, outside profile 'lines' (48..48)"),
        ("kind: KIND_GPU", None),
        ("kind: KIND_CPU", "runs on GPU only"),
        ("preferred_batch_size: 128", "preferred batch sizes [128] are not within 1..max_batch_size (32)"),
        ('name: "x"', None),
        ('name: "image"', "inputs ['image'] are not the engine's ['x']"),
    ]:
        text = triton_config.to_text(good)
        field = edit.split(":")[0]
        lines = text.splitlines()
        if field == "dims":
            start = next(i for i, ln in enumerate(lines) if ln.strip().startswith("dims"))
            lines[start:start + 3] = edit.splitlines()
        elif field == "name":
            i = next(i for i, ln in enumerate(lines) if ln.strip() == 'name: "x"')
            lines[i] = "  " + edit
        else:
            i = next(i for i, ln in enumerate(lines) if ln.strip().startswith(field + ":"))
            lines[i] = lines[i][:len(lines[i]) - len(lines[i].lstrip())] + edit
        found = triton_config.problems(parse("\n".join(lines)), eng)
        if expect is None:
            assert found == [], (edit, found)
        else:
            assert any(expect in f for f in found), (edit, found)
    with pytest.raises(ValueError, match="not a Triton model configuration"):
        triton_config.parse('name: "cls"\nmax_batch: 4\n')  # a field Triton's schema has not got


@pytest.fixture(scope="module")
def overflow(tmp_path_factory) -> dict:
    """SqueezeNet with a planted FP16 overflow: its FP32 engine passes validation, its FP16 engine fails."""
    tmp = tmp_path_factory.mktemp("overflow")
    model = overflowing_squeezenet(tmp)
    inputs = photos(tmp)
    fp16 = run_stage(precision, PrecisionStage, tmp / "fp16", {"model": Artifact(model, "onnx", "prepare"), **inputs},
                     data=IMAGES, holdout=1, fallback={"auto": False})
    models = [Artifact(model, "onnx", "m", "prepare"), Artifact(fp16.outputs["model"], "onnx", "f", "fp16")]
    profile = {"input": {"min": [1, 3, 224, 224], "opt": [2, 3, 224, 224], "max": [4, 3, 224, 224]}}
    built = engines(tmp, models, profiles={"b4": profile})
    with pytest.raises(StageFailed) as failed:
        run_stage(validate, ValidateStage, tmp / "v", {"engines": Artifact(built, "engines", "e", "build"),
                                                       "models": models, "reference": models[0], **inputs},
                  data=IMAGES, locate_first_bad_layer=False)
    return {"engines": built, "validation": failed.value.result.outputs["report"], "tmp": tmp, "models": models,
            "inputs": inputs}


@pytest.mark.slow
def test_an_engine_that_failed_validation_is_never_shipped(tmp_path, tensorrt_backend, overflow):
    verdict = json.loads(overflow["validation"].read_text())
    assert verdict["not_shipped"] and all(n.startswith("fp16.") for n in verdict["not_shipped"])
    # prefer size: the FP16 engine is the smaller one, and would be chosen if validation were not read
    report, out = release_of(tmp_path, overflow["engines"], reports={"validation": overflow["validation"]},
                             select={"prefer": "size"})
    target = report["targets"][0]
    assert target["chosen"]["name"] == "prepare.b4.native"
    fp16 = next(o for o in target["options"] if o["name"] == "fp16.b4.native")
    assert fp16["engine_bytes"] < target["chosen"]["engine_bytes"]
    assert fp16["refused"].startswith("failed validation") and fp16["validated"] is False
    shipped = out / "triton" / "native" / "cls" / "1" / "model.plan"
    assert shipped.read_bytes() == (overflow["engines"] / "prepare.b4.native" / "engine.plan").read_bytes()
    # require: built does not let it through either: validation failed it
    report, _ = release_of(tmp_path, overflow["engines"], reports={"validation": overflow["validation"]},
                           select={"prefer": "size", "require": "built"})
    assert report["targets"][0]["chosen"]["name"] == "prepare.b4.native"
    # when every engine is refused, nothing is shipped and the stage fails with the report kept
    with pytest.raises(StageFailed, match="nothing to ship for target 'native'.*fp16.b4.native: failed validation"):
        release_of(tmp_path, overflow["engines"], reports={"validation": overflow["validation"]},
                   select={"prefer": "size", "variants": ["fp16"]})


@pytest.mark.slow
def test_the_declared_preprocessing_ships_as_a_python_backend_model_and_an_ensemble(tmp_path, tensorrt_backend,
                                                                                   overflow, monkeypatch):
    """triton.preprocess: the parity stage's steps run by trtflow's own Preprocessor in a Python-backend model, and an
    ensemble from encoded image to logits. model.py runs here against a stand-in of triton_python_backend_utils (it
    proves the preprocessing it serves is the checked one, byte for byte; not Triton itself)."""
    import importlib.util

    import numpy as np

    from tests.assets import PHOTOS
    from trtflow.stages.image.preprocess import load
    pre = photos(tmp_path)["preprocess"]
    report, out = release_of(tmp_path, overflow["engines"], more={"preprocess": pre}, triton={"preprocess": True},
                             select={"prefer": "size", "require": "built", "variants": ["prepare"]})
    target = report["targets"][0]
    assert target["models"] == ["cls", "cls_preprocess", "cls_ensemble"]
    repo = out / target["repository"]
    engine, preprocess, ensemble = (parse((repo / m / "config.pbtxt").read_text()) for m in target["models"])
    assert preprocess.backend == "python" and [list(o.dims) for o in preprocess.output] == [[1, 3, 224, 224]]
    assert ensemble.platform == "ensemble" and [s.model_name for s in ensemble.ensemble_scheduling.step] == [
        "cls_preprocess", "cls"]
    assert [(o.name, list(o.dims)) for o in ensemble.output] == [("logits", [-1, 1000])]
    assert all((repo / m / "1").is_dir() for m in target["models"])

    Tensor = stub_backend_utils(monkeypatch)
    spec = importlib.util.spec_from_file_location("served_model", repo / "cls_preprocess" / "1" / "model.py")
    served = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(served)
    model = served.TritonPythonModel()
    model.initialize({"model_config": "{}"})
    requests = [{"IMAGE": Tensor("IMAGE", np.frombuffer(p.read_bytes(), np.uint8))} for p in PHOTOS]
    responses = model.execute(requests + [{"IMAGE": Tensor("IMAGE", np.frombuffer(b"not an image", np.uint8))}])
    checked = load(pre.path)
    for path, (outputs, error) in zip(PHOTOS, responses):
        assert error is None and outputs[0].name == "input"
        assert outputs[0].array.dtype == np.float32 and np.array_equal(outputs[0].array, checked(path)), path
    outputs, error = responses[-1]
    assert outputs == [] and "cannot decode the image" in error


@pytest.mark.slow
def test_an_optional_variant_that_fails_is_left_out_and_the_rest_ships(tmp_path, tensorrt_backend, overflow):
    """FP16 fails validation (a planted overflow): declared optional, validate passes with FP16 excluded and says
    why; the release ships the FP32 engine and its card names why FP16 may not ship. Without the declaration the
    stage fails (as the overflow fixture shows)."""
    models, inputs = overflow["models"], overflow["inputs"]
    result = run_stage(validate, ValidateStage, tmp_path / "v", {
        "engines": Artifact(overflow["engines"], "engines", "e", "build"), "models": models,
        "reference": models[0], **inputs}, data=IMAGES, locate_first_bad_layer=False, optional=["fp16"])
    report = json.loads(result.outputs["report"].read_text())
    assert report["passed"] and report["shipped"] == ["prepare.b4.native"]
    assert list(report["excluded"]) == ["fp16"] and "fp16.b4.native" in report["excluded"]["fp16"]
    assert any(w.startswith("optional variant 'fp16' excluded from benchmark and release: 1 of 2 candidate(s) "
                            "fail") for w in result.warnings), result.warnings
    released, out = release_of(tmp_path, overflow["engines"], reports={"validation": result.outputs["report"]},
                               select={"prefer": "size"})
    target = released["targets"][0]
    assert target["chosen"]["name"] == "prepare.b4.native"
    refused = next(o for o in target["options"] if o["name"] == "fp16.b4.native")["refused"]
    assert refused.startswith("failed validation: ") and refused.endswith("(optional variant: excluded)")
    assert "optional variant: excluded" in (out / "card" / "model-card.html").read_text()


@pytest.mark.slow
def test_a_rebuild_that_loses_the_shipped_variant_keeps_the_previous_version(tmp_path, tensorrt_backend, overflow):
    """A fleet rebuild: version 1 shipped the FP16 engine; the rebuild's FP16 fails validation (declared optional,
    left out). The target keeps version 1 (no new version, no repository written, the card and the stage's result
    say why and what would replace it); `select.lost_variant: replace` ships the FP32 engine as version 2."""
    shared = tmp_path / "shared"
    first, _ = release_of(tmp_path, overflow["engines"], shared,
                          select={"prefer": "size", "require": "built", "variants": ["fp16"]})
    assert first["targets"][0]["chosen"]["name"] == "fp16.b4.native" and first["targets"][0]["version"] == 1
    models, inputs = overflow["models"], overflow["inputs"]
    checked = run_stage(validate, ValidateStage, tmp_path / "v", {
        "engines": Artifact(overflow["engines"], "engines", "e", "build"), "models": models,
        "reference": models[0], **inputs}, data=IMAGES, locate_first_bad_layer=False, optional=["fp16"])
    reports = {"validation": checked.outputs["report"]}
    out = tmp_path / "held"
    out.mkdir()
    inputs = Inputs({"engines": Artifact(overflow["engines"], "engines", "e", "build"),
                     "validation": Artifact(reports["validation"], "json", "v", "validate"),
                     "releases": Artifact(shared, "shared-cache", "")})
    inputs.lineage = (Provenance("source", "model", "", {"model": "abc"}),)
    result = release.run(ReleaseStage.model_validate({"kind": "release", "select": {"prefer": "size"},
                                                      "triton": {"model_name": "cls"}}), inputs, out)
    target = json.loads(result.outputs["report"].read_text())["targets"][0]
    assert target["chosen"] is None and target["version"] == 1 and target["previous"] == "fp16.b4.native"
    assert "optional variant 'fp16', which this run left out" in target["held"]
    assert "prepare.b4.native passed and would replace it" in target["held"], target["held"]
    assert result.claims == [] and result.metrics["versions"]["released"] == []
    assert result.metrics["versions"]["held"] == [{"model": "cls", "target": "native", "version": 1, "engine": "fp16.b4.native",
                                       "why": target["held"]}]
    assert not (out / "triton" / "native").exists()
    assert "Previous version 1 kept" in (out / "card" / "model-card.md").read_text()
    assert "version 1 stays the one served" in " ".join(result.warnings)
    replaced, _ = release_of(tmp_path, overflow["engines"], shared, reports=reports,
                             select={"prefer": "size", "lost_variant": "replace"})
    assert replaced["targets"][0]["chosen"]["name"] == "prepare.b4.native"
    assert replaced["targets"][0]["version"] == 2 and replaced["targets"][0]["held"] is None


@pytest.mark.slow
def test_versions_increase_with_each_engine_released(tmp_path, tensorrt_backend, overflow):
    shared = tmp_path / "shared"
    first, _ = release_of(tmp_path, overflow["engines"], shared, select={"prefer": "size", "require": "built"})
    again, _ = release_of(tmp_path, overflow["engines"], shared, select={"prefer": "size", "require": "built"})
    assert first["targets"][0]["version"] == again["targets"][0]["version"] == 1
    assert first["targets"][0]["new_version"] and not again["targets"][0]["new_version"]
    other, out = release_of(tmp_path, overflow["engines"], shared,
                            select={"prefer": "size", "require": "built", "variants": ["prepare"]})
    assert other["targets"][0]["chosen"]["name"] == "prepare.b4.native" and other["targets"][0]["version"] == 2
    assert (out / "triton" / "native" / "cls" / "2" / "model.plan").is_file()
    records = sorted((shared / "releases" / "cls" / "native").iterdir())
    assert [(r.name, json.loads(r.read_text())["candidate"]) for r in records] == [
        ("1.json", "fp16.b4.native"), ("2.json", "prepare.b4.native")]


def _released(shared: Path, out: Path) -> list[tuple[str, str]]:
    return sorted((r.name, json.loads(r.read_text())["candidate"]) for r in (shared / "releases" / "cls" /
                                                                               "native").glob("*.json"))


@pytest.mark.parametrize("version", [-3, 0, 10**20, "7"])
def test_a_ledger_version_triton_would_not_load_stops_the_release(tmp_path, tensorrt_backend, overflow, version):
    """A ledger (here the one-file ledger of earlier stores, which is still read) whose entry for the shipped engine
    is not a positive int64 stops the release with one line; nothing is claimed (it gave triton/native/cls/-3)."""
    shared = tmp_path / "shared"
    first, out = release_of(tmp_path, overflow["engines"], shared, select={"prefer": "size", "require": "built"})
    digest = first["targets"][0]["chosen"]["engine_sha256"]
    legacy = shared / "releases" / "cls" / "native.json"
    legacy.write_text(json.dumps({"releases": [
        {"version": version, "engine": digest, "candidate": "x", "created": "2026-01-01"},
        {"version": 7, "engine": "0" * 64, "candidate": "y", "created": "2026-01-01"}]}))
    with pytest.raises(StageError, match=r"release: .*native.json: unreadable release ledger \(version"):
        release_of(tmp_path, overflow["engines"], shared, select={"prefer": "size", "require": "built"})
    legacy.write_text(json.dumps({"releases": [
        {"version": 7, "engine": "0" * 64, "candidate": "y", "created": "2026-01-01"}]}))
    again, out = release_of(tmp_path, overflow["engines"], shared, select={"prefer": "size", "require": "built"})
    assert again["targets"][0]["version"] == 8, "never lower than a version already released"
    assert [p.name for p in (out / "triton" / "native" / "cls").iterdir() if p.is_dir()] == ["8"]


def test_an_unreadable_ledger_stops_the_release_and_keeps_its_history(tmp_path, tensorrt_backend, overflow):
    """Engines A (v1) and B (v2) released, the record of v2 truncated: the next release stops with one line naming
    the file (it restarted at 1, released C as v1 and erased A and B), and the records are as they were."""
    shared = tmp_path / "shared"
    rule = {"prefer": "size", "require": "built"}
    release_of(tmp_path, overflow["engines"], shared, select=rule)
    release_of(tmp_path, overflow["engines"], shared, select={**rule, "variants": ["prepare"]})
    before = _released(shared, tmp_path)
    assert [name for name, _ in before] == ["1.json", "2.json"]
    record = shared / "releases" / "cls" / "native" / "2.json"
    record.write_text(record.read_text()[:20])
    with pytest.raises(StageError, match=r"native/2.json: unreadable release ledger.*nothing was released"):
        release_of(tmp_path, overflow["engines"], shared, select=rule)
    record.unlink()
    (shared / "releases" / "cls" / "native" / "02.json").write_text("{}")
    with pytest.raises(StageError, match=r"02.json: unreadable release ledger \(not a version's record"):
        release_of(tmp_path, overflow["engines"], shared, select=rule)
    assert sorted(p.name for p in (shared / "releases" / "cls" / "native").iterdir()) == ["02.json", "1.json"]


def test_the_ledger_is_never_written_through_a_symlink(tmp_path, tensorrt_backend, overflow):
    """`shared/releases/<model>` a symlink to a directory outside the store: the release is refused with one line
    and nothing appears outside (the ledger was written there)."""
    shared, outside = tmp_path / "shared", tmp_path / "outside"
    (shared / "releases").mkdir(parents=True)
    outside.mkdir()
    (shared / "releases" / "cls").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StageError, match="unreadable release ledger.*symlink"):
        release_of(tmp_path, overflow["engines"], shared, select={"prefer": "size", "require": "built"})
    assert list(outside.iterdir()) == []
    from trtflow.errors import StoreError
    from trtflow.stages.release.triton import versions
    claim = versions.claim("cls", "native", 1, "a" * 64, "x")
    with pytest.raises(StoreError, match="shared/releases/cls/native/1.json cannot be written.*symlink"):
        LocalStore(tmp_path).claim(claim.path, claim.data)
    assert list(outside.iterdir()) == []


def _bench(tmp: Path, rates: dict[str, float], spread: float, across: dict[str, float] | None = None,
           batches: dict[str, int] | None = None, medians: dict[str, float] | None = None) -> Path:
    """A benchmark report measuring each candidate at `rates` samples/s, its iterations' p90 `spread` above the
    median (the jitter the release weighs a change against), and `across` this machine's runs of it (3 runs)."""
    from trtflow.stages.benchmark.report import BenchmarkReport, Gate, Measurement, RunSpread
    cells = [Measurement(cell=f"{c}.opt", candidate=c, variant=c.split(".")[0], precision="fp32", profile="b4",
                         point="opt", shapes={"input": [1, 3, 224, 224]}, environment={},
                         batch=(batches or {}).get(c, 1), samples_per_s=rate,
                         run_spread=(RunSpread(runs=3, throughput=across[c], median_samples_per_s=(medians or {}).get(c))
                                     if across and c in across else None),
                         result={"has_summary": True, "runtime": "trtexec (test numbers, as a GPU would give them)",
                                 "latency_ms": {"median": 1000 / rate, "p90": 1000 / rate * (1 + spread),
                                                "p99": 1000 / rate * (1 + 2 * spread)}})
             for c, rate in rates.items()]
    path = tmp / f"bench{len(list(tmp.glob('bench*')))}.json"
    path.write_text(BenchmarkReport(tool="builtin", trtexec=None, trtexec_looked=[], tensorrt_version=None,
                                    cells=cells, telemetry={}, gate=Gate(), warnings=[]).model_dump_json())
    return path


def test_numbers_that_move_within_their_noise_do_not_change_the_shipped_engine(tmp_path, tensorrt_backend, overflow):
    """Two runs of one pipeline shipped fp16.dynamic, then int8.bs1, as the CPU numbers moved within their noise.
    Now the engine the previous version shipped stays while another beats it by no more than the margin: the
    largest of select.min_gain, the benchmark's spread within its run (its iterations' (p90 - median) / median)
    and across this machine's runs of the two engines; it is replaced when one beats it by more on the median of
    select.min_runs (3) runs of both here, or on one run's numbers where min_runs is 1. The card says the margin
    and how many runs it comes from."""
    shared = tmp_path / "shared"
    rule = {"require": "built", "prefer": "throughput"}
    a, b = "prepare.b4.native", "fp16.b4.native"

    def shipped(rates: dict[str, float], spread: float = 0.10, across: dict | None = None,
                medians: dict | None = None, **select) -> dict:
        report, out = release_of(tmp_path, overflow["engines"], shared, select={**rule, **select},
                                 reports={"benchmark": _bench(tmp_path, rates, spread, across, medians=medians)})
        target = report["targets"][0]
        if target["stability"]:
            from trtflow import markdown
            assert f"Selection: {markdown.text(target['stability'])}." in (out / "card" / "model-card.md").read_text()
        return target

    assert shipped({a: 100.0, b: 95.0})["chosen"]["name"] == a
    for rates in ({a: 100.0, b: 104.0}, {a: 92.0, b: 100.0}, {a: 100.0, b: 109.9}):  # each within 10%
        again = shipped(rates)
        assert again["chosen"]["name"] == a and again["version"] == 1 and not again["new_version"], rates
        assert again["stability"].startswith(f"{a} kept: {b} is ") and "within the margin 10.0% (the largest of: " \
            "select.min_gain 5.0%; the spread within this run 10.0%; no spread across runs yet" in again["stability"]
    quiet = shipped({a: 100.0, b: 104.0}, spread=0.01)  # a quiet run: select.min_gain still holds
    assert quiet["chosen"]["name"] == a and "within the margin 5.0%" in quiet["stability"]
    # 25% better, but the same engines moved 30% apart across this machine's runs: noise
    noisy = shipped({a: 100.0, b: 125.0}, across={a: 0.30, b: 0.12})
    assert noisy["chosen"]["name"] == a, noisy["stability"]
    assert "within the margin 30.0% (" in noisy["stability"] and \
        "the spread across this machine's runs of them (3 and 3 runs) 30.0%" in noisy["stability"]
    # one run's outlier (b three times a's in this run, under a burner) against three runs' medians (8% apart)
    outlier = shipped({a: 100.0, b: 300.0}, across={a: 0.04, b: 0.06}, medians={a: 100.0, b: 108.0})
    assert outlier["chosen"]["name"] == a and "is 8.0% better on throughput (the median of this machine's runs)" \
        in outlier["stability"], outlier["stability"]
    # one run's lead beyond the margin, before three runs of both here: reported, not acted on (a run that measured
    # int8.bs1 at 2.5x prepare.bs1 under the suite's other worker replaced it on its second run)
    early = shipped({a: 100.0, b: 125.0})
    assert early["chosen"]["name"] == a and early["stability"] == (
        f"{a} kept: {b} is 25.0% better on throughput in this run, more than the margin 10.0% (the largest of: "
        f"select.min_gain 5.0%; the spread within this run 10.0%; no spread across runs yet: the engines were measured "
        f"here once); it replaces the shipped "
        f"engine once the median of 3 runs of both on this machine says so (now 1 and 1; select.min_runs)")
    moved = shipped({a: 100.0, b: 125.0}, across={a: 0.04, b: 0.06}, medians={a: 100.0, b: 125.0})
    assert moved["chosen"]["name"] == b and moved["version"] == 2, moved["stability"]
    assert moved["stability"].startswith(f"{b} replaces {a}: 25.0% better on throughput (the median of this "
                                         f"machine's runs), more than the margin 10.0% (the largest of: ")
    shared = tmp_path / "another store" / "shared"
    assert shipped({a: 100.0, b: 95.0})["chosen"]["name"] == a
    asked = shipped({a: 100.0, b: 125.0}, min_runs=1)  # one run's numbers, as the pipeline asks
    assert asked["chosen"]["name"] == b and asked["stability"].startswith(f"{b} replaces {a}: 25.0% better on "
                                                                          f"throughput, more than the margin")


@pytest.mark.slow
def test_an_engine_that_would_change_the_contract_does_not_compete(tmp_path, cls, tensorrt_backend):
    """Issue #50: the dynamic-batch engine shipped as version 1; a re-measured benchmark ranked a batch-1 engine
    first and the release then refused its own choice ("would change its serving contract"): exit 1 on a run where
    nothing changed. Now only the engines that keep version 1's contract compete: the batch-1 engine is listed with
    what it would change, the dynamic one ships again as version 1; the card says numbers of different batches were
    compared. With no engine keeping the contract, the release fails naming the best one and what it changes."""
    one = {"x": {"min": [1, 3, 48, 192], "opt": [1, 3, 48, 192], "max": [1, 3, 48, 192]}}
    built = engines(tmp_path, [cls], profiles={"lines": LINES, "one": one})
    dynamic, single = "prepare.lines.native", "prepare.one.native"
    shared = tmp_path / "shared"
    rule = {"require": "built", "prefer": "throughput"}
    batches = {dynamic: 8, single: 1}
    first, _ = release_of(tmp_path, built, shared, select=rule,
                          reports={"benchmark": _bench(tmp_path, {dynamic: 200.0, single: 150.0}, 0.01,
                                                       batches=batches)})
    assert first["targets"][0]["chosen"]["name"] == dynamic and first["targets"][0]["max_batch_size"] == 32
    assert f"{dynamic} at batch 8, {single} at batch 1" in first["targets"][0]["stability"]
    again, out = release_of(tmp_path, built, shared, select=rule,
                            reports={"benchmark": _bench(tmp_path, {dynamic: 150.0, single: 300.0}, 0.01,
                                                         batches=batches)})
    target = again["targets"][0]
    assert (target["chosen"]["name"], target["version"], target["new_version"]) == (dynamic, 1, False)
    refused = next(o for o in target["options"] if o["name"] == single)
    assert refused["refused"].startswith("its serving contract is not version 1's: ") and \
        "max_batch_size 32 -> 1" in refused["refused"] and refused["refused"].endswith("(select.contract: fixed)")
    assert "its serving contract is not version 1" in (out / "card" / "model-card.md").read_text()
    with pytest.raises(StageFailed, match=r"no engine for target 'native' keeps the serving contract of 'cls' "
                                          r"version 1: prepare.lines.native would change its serving contract: .*"
                                          r"max_batch_size 32 -> 16.*select.contract: allow_change"):
        release_of(tmp_path, built, shared, select=rule, triton={"max_batch_size": 16},
                   reports={"benchmark": _bench(tmp_path, {dynamic: 150.0, single: 300.0}, 0.01, batches=batches)})


def test_an_older_engine_never_comes_back_as_current_silently(tmp_path, tensorrt_backend, overflow):
    """Issue #50: engine A shipped as version 1, B as version 2; a configuration whose best engine is A again (an
    older pipeline run again) is refused by default, naming both versions; where B is still an option it stays
    (version 2). With select.rollback: allow, A ships as version 3 saying it rolls back to version 1's engine (the
    report, the card, the event, the console's warning)."""
    from trtflow.events import StageRan
    from trtflow.stages.release.triton import versions
    shared = tmp_path / "shared"
    a, b = "prepare.b4.native", "fp16.b4.native"
    size = {"require": "built", "prefer": "size"}
    assert release_of(tmp_path, overflow["engines"], shared, select={**size, "variants": ["prepare"]}
                      )[0]["targets"][0]["version"] == 1
    assert release_of(tmp_path, overflow["engines"], shared, select=size)[0]["targets"][0]["chosen"]["name"] == b
    rule = {"require": "built", "prefer": "throughput", "min_gain": 0.0, "min_runs": 1}
    kept, _ = release_of(tmp_path, overflow["engines"], shared, select=rule,
                         reports={"benchmark": _bench(tmp_path, {a: 200.0, b: 100.0}, 0.0)})
    target = kept["targets"][0]
    assert (target["chosen"]["name"], target["version"], target["new_version"]) == (b, 2, False)
    assert f"{b} (version 2) kept: {a} ranked first, but it is the engine of version 1, and shipping it would " \
           f"roll back (select.rollback: allow lets it)" in target["stability"]
    old_config = {**size, "variants": ["prepare"]}  # B is not among its engines
    with pytest.raises(StageFailed, match=rf"nothing to ship for target 'native': its best engine {a} is the engine "
                                          rf"of version 1, and version 2 \({b}\) was released since: shipping it "
                                          rf"would roll back \(set select.rollback: allow"):
        release_of(tmp_path, overflow["engines"], shared, select=old_config)
    result = released(tmp_path, overflow["engines"], shared, select={**old_config, "rollback": "allow"})
    report = json.loads(result.outputs["report"].read_text())
    target = report["targets"][0]
    assert (target["chosen"]["name"], target["version"], target["rolls_back_to"]) == (a, 3, 1)
    assert f"native: version 3 rolls back to version 1's engine {a} (version 2 was the latest)" in result.warnings
    assert "**Rollback**: version 3 ships again the engine of version 1; version 2 was the latest before it." in \
        (result.outputs["card"] / "model-card.md").read_text()
    (event,) = versions.announce(StageRan(tmp_path / "pipeline.yaml", "release", "k", tmp_path, result.metrics))
    assert event.version == 3 and event.payload["rolls_back_to"] == 1 and "rolling back to version 1" in event.say
    assert versions.outdated(result.metrics, shared) is None
    made = result.metrics["versions"]
    older = {"versions": {**made, "released": [{**made["released"][0], "version": 2}]}}
    assert versions.outdated(older, shared) == "version 3 of 'cls' for target 'native' was released since this " \
                                               "result (version 2)"


def test_a_claimed_version_is_never_given_to_a_second_engine(tmp_path):
    """The store's exclusive create: the first claim of a version wins; the same engine claiming it again is
    the same release; another engine is told who holds it."""
    from trtflow.stages.release.triton import versions
    store = LocalStore(tmp_path)
    mine, other = versions.claim("m", "native", 3, "a" * 64, "x"), versions.claim("m", "native", 3, "b" * 64, "y")
    assert claim_all(store, [mine]) is None
    assert claim_all(store, [versions.claim("m", "native", 3, "a" * 64, "x")]) is None
    assert claim_all(store, [other]) == "shared/releases/m/native/3.json was created by another run meanwhile"
    assert json.loads((tmp_path / "shared" / mine.path).read_text())["owner"] == "a" * 64


def test_bad_release_settings_are_refused_before_anything_runs(tmp_path):
    from trtflow.errors import SpecError
    from trtflow.pipelines.graph import build_graph
    from trtflow.pipelines.loader import load_pipeline

    def check(stages: str) -> str:
        (tmp_path / "m.onnx").write_bytes(SQUEEZENET.read_bytes())
        (tmp_path / "p.yaml").write_text(f"version: 1\nname: t\nmodel: m.onnx\nstages:\n{stages}")
        with pytest.raises(SpecError) as err:
            build_graph(load_pipeline(tmp_path / "p.yaml"))
        return str(err.value)

    build_stage = "  build: {kind: build}\n"
    assert "no validate stage feeds this stage" in check(build_stage + "  release: {kind: release}\n")
    assert "needs a benchmark stage" in check(build_stage + "  release: {kind: release, select: {require: built}}\n")
    assert "select.variants names fp61, not a model variant" in check(
        "  fp16: {kind: precision}\n" + build_stage + "  release: {kind: release, select: {require: built, prefer: "
        "size, variants: [fp61]}}\n")
    assert "no earlier stage produces the 'engines'" in check("  prepare: {kind: prepare}\n  release: {kind: "
                                                               "release, select: {require: built, prefer: size}}\n")
    assert "optional names fp61, not a precision or calibrate stage this stage checks (name some of: fp16)" in check(
        "  fp16: {kind: precision}\n" + build_stage + "  validate: {kind: validate, optional: [fp61], metrics: {}}\n")


EVENT_PIPELINE = """
version: 1
name: ocr-cls
model: models/cls.onnx
stages:
  prepare: {kind: prepare, target_opset: 17, input_shapes: {x: [1, 3, 48, 192]}}
  build:
    kind: build
    profiles: {lines: {x: {min: [1, 3, 48, 48], opt: [8, 3, 48, 192], max: [32, 3, 48, 640]}}}
  release: {kind: release, select: {require: built, prefer: size}}
"""


@pytest.mark.slow
def test_each_new_release_is_an_event_a_deployment_can_act_on(workdir, prefect_api, tensorrt_backend):
    """`trtflow run` through the test run's Prefect server: a release emits trtflow.release.created with its
    version; an engine changed by a new profile is released as version 2 with the batch limit that follows; a run
    that changes nothing releases nothing."""
    import time

    import httpx

    from tests.assets import trtflow
    (workdir / "pipeline.yaml").write_text(EVENT_PIPELINE)
    first = trtflow("run", "pipeline.yaml", cwd=workdir)
    assert first.returncode == 0, first.stdout + first.stderr
    smaller = "stages.build.profiles.lines.x.max=[16, 3, 48, 640]"
    refused = trtflow("run", "pipeline.yaml", "--set", smaller, cwd=workdir)  # clients sending 32 would break
    assert refused.returncode == 1, refused.stdout + refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "would change its serving contract: input 'x' shapes [1, 3, 48, 48]..[32, 3, 48, " \
        "640] -> [1, 3, 48, 48]..[16, 3, 48, 640]; max_batch_size 32 -> 16" in errors[0], refused.stderr
    smaller = [smaller, "--set", "stages.release.select.contract=allow_change"]
    second = trtflow("run", "pipeline.yaml", "--set", *smaller, cwd=workdir)
    assert second.returncode == 0 and "ran release" in second.stdout, second.stdout + second.stderr
    assert "the serving contract changed since version 1: input 'x' shapes" in second.stdout + second.stderr
    third = trtflow("run", "pipeline.yaml", "--set", *smaller, cwd=workdir)
    assert third.returncode == 0 and "reused release" in third.stdout, third.stdout

    released = json.loads((workdir / ".trtflow" / "release" / "last.json").read_text())
    directory = workdir / ".trtflow" / "release" / released["key"]
    assert parse((directory / "triton/native/ocr-cls/config.pbtxt").read_text()).max_batch_size == 16
    assert (directory / "triton/native/ocr-cls/2/model.plan").is_file()

    where = trtflow("output", "pipeline.yaml", "release", "triton", "--set", *smaller, cwd=workdir)
    assert where.returncode == 0 and Path(where.stdout.strip()) == directory / "triton", where.stdout + where.stderr
    assert where.stderr.strip() == "ocr-cls version 2 for target native: the latest released", where.stderr
    outside = trtflow("output", "pipeline.yaml", "release", "../../etc", "--set", *smaller, cwd=workdir)
    said = [line for line in outside.stderr.splitlines() if line.strip()]  # issue #67: the error alone, no decisions
    assert outside.returncode == 2 and outside.stdout == "" and len(said) == 1, outside.stderr
    assert "has no output '../../etc'" in said[0], said
    # the first configuration's release is still in the store under its own key, but presents version 1: issue #50
    # (deploying it was a silent rollback)
    stale = trtflow("output", "pipeline.yaml", "release", cwd=workdir)
    assert stale.returncode == 2 and stale.stdout == "", stale.stdout
    assert "version 2 of 'ocr-cls' for target 'native' was released since this result (version 1)" in stale.stderr
    resource = f"trtflow.release.{workdir.name}.release.native"
    deadline, seen = time.monotonic() + 30, []
    while time.monotonic() < deadline:
        answer = httpx.post(f"{prefect_api}/events/filter", timeout=10, json={
            "filter": {"event": {"name": ["trtflow.release.created"]},
                       "resource": {"id": [resource]}}, "limit": 50})
        answer.raise_for_status()
        seen = sorted(e["payload"]["version"] for e in answer.json()["events"])
        if len(seen) >= 2:
            break
        time.sleep(0.5)
    assert seen == [1, 2], seen
    latest = max(answer.json()["events"], key=lambda e: e["payload"]["version"])
    assert latest["resource"]["trtflow.model"] == "ocr-cls"
    assert Path(latest["payload"]["repository"]) == directory / "triton" / "native"

    # the first configuration run again (issue #50): its release, published under the same key, is not reused as
    # if current; run again, it is refused (version 1's engine keeps none of version 2's contract), and the failed
    # verdict replaces the old result (it used to be adopted as "published first", exit 0)
    old = trtflow("run", "pipeline.yaml", cwd=workdir)
    assert old.returncode == 1, old.stdout + old.stderr
    assert "reused build" in old.stdout, old.stdout
    errors = [line for line in old.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "no engine for target 'native' keeps the serving contract of 'ocr-cls' version 2: " \
        "prepare.lines.native would change its serving contract" in errors[0], old.stderr
    record = json.loads((workdir / ".trtflow" / "release" / "last.json").read_text())
    stored = json.loads((workdir / ".trtflow" / "release" / record["key"] / "manifest.json").read_text())
    assert record["status"] == "failed" and stored["status"] == "failed", "the old result was replaced, not kept"


FORCED = """
version: 1
name: forced
model: models/cls.onnx
stages:
  prepare: {kind: prepare, preflight: "off", input_shapes: {x: [1, 3, 48, 192]}}
  build:
    kind: build
    profiles: {lines: {x: {min: [1, 3, 48, 48], opt: [2, 3, 48, 192], max: [4, 3, 48, 192]}}}
  release: {kind: release, select: {require: built, prefer: size}}
"""


@pytest.mark.slow
def test_a_forced_release_keeps_the_provenance_chain(write_yaml, workdir, tensorrt_backend):
    """Issue #39: `--force release` wrote a card with no provenance: the runner rebuilt a forced stage's inputs
    without their lineage. The forced release's report and card name the same chain as the first run's."""
    from tests.test_runner import run_all

    path = write_yaml(FORCED)
    assert run_all(path) == dict.fromkeys(("prepare", "build", "release"), "ran")
    store = workdir / ".trtflow"

    def released() -> tuple[list[dict], str]:
        key = json.loads((store / "release" / "last.json").read_text())["key"]
        return (json.loads((store / "release" / key / "report.json").read_text())["lineage"],
                (store / "release" / key / "card" / "model-card.md").read_text())

    first, first_card = released()
    keys = {stage: json.loads((store / stage / "last.json").read_text())["key"] for stage in ("prepare", "build")}
    assert [(p["stage"], p["key"]) for p in first] == [("source", ""), ("prepare", keys["prepare"]),
                                                       ("build", keys["build"])]
    assert run_all(path, force=["release"]) == {"prepare": "reused", "build": "reused", "release": "ran"}
    forced, forced_card = released()
    assert forced == first
    provenance = forced_card.split("## Provenance", 1)[1]
    assert provenance == first_card.split("## Provenance", 1)[1]
    assert all(f"`{k}`" in provenance for k in keys.values()), provenance


def test_the_card_states_parity_s_verdict_as_its_report_holds_it(tmp_path):
    """The release reads parity's report through its model: the verdict, the images checked, the classifier's top-1
    agreement (None without a classifier) and the tolerances, and the release report stores them typed."""
    from trtflow.stages.parity.report import ParityReport
    from trtflow.stages.release.report import ReleaseReport

    row = {"shape_ok": True, "shape": [3, 8, 8], "max_abs": 0.0, "mean_abs": 0.0, "psnr": float("inf"), "image": "a"}
    for model, top1 in (({"ran": True, "runtime": "onnxruntime", "max_abs_diff": 0.0, "top1": 1.0, "top5": 1.0}, 1.0),
                        (None, None)):
        path = tmp_path / "parity.json"
        path.write_text(ParityReport(verdict="pass", preprocess_digest="ab", steps=[], runtimes={}, tolerances={},
                                     images=[row, row], model=model, diagnosis=None,
                                     worst_image="a").model_dump_json())
        summary = release._parity(Inputs({"parity": Artifact(path, "json", "parity")}))
        assert (summary.verdict, summary.images, summary.top1, summary.tolerances.max_abs) == ("pass", 2, top1, 0.02)
        stored = ReleaseReport(model_name="m", rule={}, targets=[], lineage=[], parity=summary).model_dump_json()
        assert ReleaseReport.model_validate_json(stored).parity == summary
