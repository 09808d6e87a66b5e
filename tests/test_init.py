"""`trtflow init`: a first pipeline from a model and its data, as a new user starts. On each example's real model
and data (copied, without its pipeline file) init writes a file that passes `trtflow validate`, whose profiles are
the ones the build stage accepts and pass TensorRT's trial build, and `trtflow run` on it with no edit ends with a
release. What init cannot infer, or TensorRT cannot build, is refused with one line naming the flag, and nothing is
written."""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import cv2
import onnx
import pytest
import yaml

from tests.assets import EXAMPLES, last_report, trtflow

EXAMPLE_MODELS = {
    "ppocr-cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "ppocr-det": "ch_PP-OCRv4_det_infer.onnx",
    "ppocr-rec": "ch_PP-OCRv4_rec_infer.onnx",
    "squeezenet-cls": "squeezenet1_1.onnx",
}
# what init reads from each model's output: the task metrics written for validate and the pre-flights
TASK_METRICS = {
    "ppocr-cls": {"save_infer_model/scale_0.tmp_1": {"topk": {"k": 1}}},  # 2 classes, from a Softmax
    "ppocr-det": {"sigmoid_0.tmp_0": {"map_iou": {"threshold": 0.5}}},  # [N, 1, H, W] from a Sigmoid
    "ppocr-rec": {"softmax_11.tmp_0": {"ctc": {"blank": 0}}},  # [N, T, 6625] from a Softmax over the last axis
    "squeezenet-cls": {"logits": {"topk": {"k": 5}}},  # [N, 1000] named logits
}
# how each project is laid out and init called there: ppocr-cls as the README shows it (model.onnx and data/ in one
# folder, pipeline.yaml written beside the model), squeezenet from models/ with -o, the OCR pair from models/ with
# pipeline.yaml written beside the model (ppocr-rec with --shape: see REC_TRAINED_HEIGHT)
COMMANDS = {"ppocr-cls": ["model.onnx", "--data", "data/*.png"],
            "ppocr-det": [f"models/{EXAMPLE_MODELS['ppocr-det']}", "--data", "data"],
            "ppocr-rec": [f"models/{EXAMPLE_MODELS['ppocr-rec']}", "--data", "data"],
            "squeezenet-cls": [f"models/{EXAMPLE_MODELS['squeezenet-cls']}", "--data", "data", "-o", "pipeline.yaml"]}
WRITTEN = {"ppocr-cls": "pipeline.yaml", "ppocr-det": "models/pipeline.yaml", "ppocr-rec": "models/pipeline.yaml",
           "squeezenet-cls": "pipeline.yaml"}
# PP-OCRv4's recognizer was trained on lines 48 high; TensorRT does not build it at the data's own heights
# (22..32: a Reshape of its neck gets an empty tensor), though ONNX Runtime runs it there
REC_TRAINED_HEIGHT = 48


def _copy(example: str, root: Path) -> Path:
    """The example's model and data, not its pipeline file, as a user's project holds them."""
    dest = root / example
    for part in ("models", "data"):
        shutil.copytree(EXAMPLES / example / part, dest / part)
    return dest


def _one_line_refusal(proc, *words: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _profiles_the_build_accepts(pipeline: Path) -> dict:
    """The written build profiles, resolved against the model the way the build stage resolves them (rank, fixed
    dimensions, every dynamic dimension covered): a StageError otherwise."""
    from trtflow.pipelines.loader import load_pipeline
    from trtflow.stages.build.stage import model_inputs, resolve_profiles

    loaded = load_pipeline(pipeline, [])
    (profile,) = resolve_profiles(loaded.spec.stages["build"], model_inputs(onnx.load(str(loaded.model_path))),
                                  "prepare")
    return {name: [list(s) for s in shapes] for name, shapes in profile.shapes.items()}


@dataclass
class Initialized:
    pipelines: dict[str, Path]  # example -> the file init wrote
    rec_refusal: str  # ppocr-rec without --shape: the one line
    rec_left: list[str]  # what its models/ folder held after that refusal
    rec_shape: str  # the --shape given then: the profile the refusal proposed, at the height it was trained at


@pytest.fixture(scope="module")
def initialized(tmp_path_factory) -> Initialized:
    """`trtflow init` on each example's model and data, in a copy laid out as COMMANDS says; ppocr-rec refused
    first, then given the --shape its refusal proposes with the trained height."""
    root = tmp_path_factory.mktemp("init")
    pipelines = {}
    for example, command in COMMANDS.items():
        project = _copy(example, root)
        if example == "ppocr-cls":
            (project / "models" / EXAMPLE_MODELS[example]).rename(project / "model.onnx")
        proc = trtflow("init", *command, cwd=project)
        if example == "ppocr-rec":
            refusal, left = proc.stderr.strip(), sorted(p.name for p in (project / "models").iterdir())
            flag = re.search(r"--shape x=(\S+)\)$", refusal)
            assert proc.returncode == 2 and flag, proc.stdout + proc.stderr
            dims = flag.group(1).split("x")
            dims[2] = str(REC_TRAINED_HEIGHT)
            shape = "x=" + "x".join(dims)
            proc = trtflow("init", *command, "--shape", shape, cwd=project)
        assert proc.returncode == 0, proc.stderr
        assert f"wrote {Path(WRITTEN[example])}" in proc.stdout
        pipelines[example] = project / WRITTEN[example]
    return Initialized(pipelines, refusal, left, shape)


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(EXAMPLE_MODELS))
def test_init_on_each_example_writes_a_pipeline_validate_accepts(example, initialized, tensorrt_backend):
    pipeline = initialized.pipelines[example]
    proc = trtflow("validate", pipeline.name, cwd=pipeline.parent)
    assert proc.returncode == 0, proc.stderr
    assert f"{pipeline.name} is valid" in proc.stdout

    text = pipeline.read_text()
    spec = yaml.safe_load(text)
    stages = spec["stages"]
    model = Path(COMMANDS[example][0])
    assert spec["model"] == (model.name if pipeline.parent.name == model.parent.name else model.as_posix())
    assert spec["name"] == model.stem
    assert list(stages) == ["prepare", "parity", "fp16", "int8", "build", "validate", "benchmark", "release"]
    assert stages["parity"]["images"] == stages["validate"]["data"]["images"]
    data = "../data/*." if pipeline.parent.name == "models" else "data/*."
    assert stages["parity"]["images"].startswith(data)
    assert stages["validate"]["metrics"] == stages["fp16"]["metrics"] == stages["int8"]["metrics"] \
        == TASK_METRICS[example]
    # opset 11 / 12 (PaddlePaddle's exports) converted for INT8's per-channel Q/DQ; squeezenet's 17 left alone
    assert stages["prepare"].get("target_opset") == (None if example == "squeezenet-cls" else 17)
    (profile,) = stages["build"]["profiles"].values()
    (name, ranges), = profile.items()
    assert stages["prepare"]["input_shapes"] == {name: ranges["opt"]}
    assert _profiles_the_build_accepts(pipeline) == {name: [ranges["min"], ranges["opt"], ranges["max"]]}
    # every example's batch is dynamic: 1 / 8 / 32, the opt batch no larger than the data (squeezenet: 4 photos)
    assert [ranges[p][0] for p in ("min", "opt", "max")] == ([1, 4, 32] if example == "squeezenet-cls" else [1, 8, 32])
    # the preprocessing resizes to the opt height and width, and torchvision's reference does the same
    deploy = stages["parity"]["deploy"]
    assert {"resize": {"size": ranges["opt"][2:], "antialias": True}} in deploy
    assert stages["parity"]["training"]["torchvision"] == [f"Resize({ranges['opt'][2:]})", "ToTensor()"]
    # the profile was built by TensorRT, and the file says by which
    said = " ".join(line.lstrip("# ").strip() for line in text.splitlines())
    assert f"TensorRT's trial build ({tensorrt_backend.flavour} {tensorrt_backend.version}) passed at this " \
           f"profile's min / opt / max" in said


# the data's image sizes (height x width) give the dynamic H and W: smallest, median (the lower one), largest;
# ppocr-rec's are given by --shape (the data's own widths, at the height it was trained at)
SIZES = {"ppocr-cls": [[20, 22, 32], [60, 85, 195]], "ppocr-det": [[256] * 3, [256] * 3],
         "ppocr-rec": [[REC_TRAINED_HEIGHT] * 3, [124, 160, 384]]}


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(SIZES))
def test_dynamic_height_and_width_come_from_the_images(example, initialized):
    text = initialized.pipelines[example].read_text()
    (profile,) = yaml.safe_load(text)["stages"]["build"]["profiles"].values()
    x = profile["x"]
    assert [[x[p][2] for p in ("min", "opt", "max")], [x[p][3] for p in ("min", "opt", "max")]] == SIZES[example]
    if example == "ppocr-rec":
        assert initialized.rec_shape == f"x=1:8:32x3x{REC_TRAINED_HEIGHT}x124:160:384"
        assert "x: from --shape" in text
    else:
        assert "images' heights: smallest / median / largest" in text  # and the file says so


@pytest.mark.slow
def test_a_profile_tensorrt_does_not_build_is_refused_naming_the_shape_to_give(initialized, tensorrt_backend):
    """PP-OCRv4's recognizer at its data's own heights (22..32, lines cut from pages): ONNX Runtime runs it there,
    TensorRT's build does not. One line: the shape that fails, TensorRT's reason, the --shape to edit."""
    line = initialized.rec_refusal
    assert len(line.splitlines()) == 1 and line.startswith("error: ") and "Traceback" not in line
    assert f"TensorRT's trial build ({tensorrt_backend.flavour} {tensorrt_backend.version}) fails at " \
           f"x [1, 3, 22, 124], the profile's min (H, W of x from the data): " in line
    assert "IShuffleLayer p2o.Reshape.79: reshape of empty tensor to non-empty tensor" in line  # TensorRT's reason
    assert ".cpp" not in line  # without where in TensorRT's source
    assert line.endswith("(give --shape with the sizes the model was trained at: edit the profile proposed, "
                         "--shape x=1:8:32x3x22:22:32x124:160:384)")
    assert initialized.rec_left == ["README.md", EXAMPLE_MODELS["ppocr-rec"]]  # nothing written


# ppocr-cls's init then run, laid out as the README's quickstart shows it (dynamic batch, height and width sized by its
# line images, top-1), is run by tests/test_quickstart.py (to a release served by Triton, then rebuilt after a driver
# upgrade): run once, not twice. ppocr-det's (dynamic height and width sized by photos, region IoU) runs here.
# ppocr-rec's (the --shape given after init's refusal, CTC text) and squeezenet's (fixed sizes) files are checked
# above (validate, the profile the build accepts, TensorRT's trial build), and their models run to a release in
# tests/test_example_ocr.py and tests/test_example.py. The benchmark stage times each engine 3 times, without a
# warm-up (duration 0): how long it measures is not what init proposes.
@pytest.mark.slow
@pytest.mark.parametrize("example", ["ppocr-det"])
def test_init_then_run_with_no_edit_ends_with_a_release(example, initialized, tensorrt_backend):
    pipeline = initialized.pipelines[example]
    run = trtflow("run", pipeline.name, "--set", "stages.benchmark.duration=0", "--set", "stages.benchmark.warmup=0",
                  "--set", "stages.benchmark.min_iterations=3", cwd=pipeline.parent, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "8 stages (8 ran, 0 reused)" in run.stdout
    store = pipeline.parent / ".trtflow"
    # the conventional preprocessing init writes agrees with the torchvision reference it writes beside it
    assert last_report(store, "parity")["verdict"] == "pass"
    assert last_report(store, "int8")["data"].startswith("images via preprocess")
    release = last_report(store, "release")
    key = json.loads((store / "release" / "last.json").read_text())["key"]
    card = store / "release" / key / "card" / "model-card.md"
    assert card.is_file() and "**Shipped**" in card.read_text()
    name = Path(COMMANDS[example][0]).stem  # the pipeline's, after the model file
    assert (store / "release" / key / "triton" / "native" / name / "config.pbtxt").is_file(), release


def _dynamic_squeezenet(path: Path) -> Path:
    """SqueezeNet with its height and width made dynamic too (its batch already is): a global average pool takes
    any size."""
    model = onnx.load(str(EXAMPLES / "squeezenet-cls" / "models" / EXAMPLE_MODELS["squeezenet-cls"]))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"
    del model.graph.value_info[:]
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


@pytest.mark.slow
def test_dynamic_batch_and_spatial_dims_get_profiles_from_the_photos(tmp_path):
    model = _dynamic_squeezenet(tmp_path / "models" / "squeezenet-hw.onnx")
    shutil.copytree(EXAMPLES / "squeezenet-cls" / "data", tmp_path / "photos")
    proc = trtflow("init", str(model), "--data", "photos", "-o", "pipeline.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert trtflow("validate", "pipeline.yaml", cwd=tmp_path).returncode == 0
    # 4 photos: 512x512, 300x451, 400x600, 427x640 -> batch 1 / 4 / 32, H 300 / 400 / 512, W 451 / 512 / 640
    assert _profiles_the_build_accepts(tmp_path / "pipeline.yaml") == {
        "input": [[1, 3, 300, 451], [4, 3, 400, 512], [32, 3, 512, 640]]}
    text = (tmp_path / "pipeline.yaml").read_text()
    assert "input: dimension 0 (batch), the batch: 1 / 4 / 32 (opt: the data's 4 samples)" in text
    assert yaml.safe_load(text)["stages"]["parity"]["images"] == "photos/*.[jp][np]g"  # the photos, not the README


@pytest.mark.slow
def test_a_detector_fed_odd_sizes_gets_them_rounded_to_what_it_runs_at(tmp_path):
    """PP-OCRv4's detector runs only at multiples of 32 (its feature pyramid adds maps of halved sizes): scenes of
    odd sizes are rounded up to the smallest multiple at which ONNX Runtime runs it at min, opt and max."""
    project = _copy("ppocr-det", tmp_path)
    scenes = sorted((project / "data").glob("*.jpg"))[:3]
    for scene, (h, w) in zip(scenes, [(250, 200), (230, 256), (181, 247)]):
        cv2.imwrite(str(scene), cv2.imread(str(scene))[:h, :w])
    proc = trtflow("init", f"models/{EXAMPLE_MODELS['ppocr-det']}", "--data", "data", "-o", "p.yaml", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert _profiles_the_build_accepts(project / "p.yaml") == {
        "x": [[1, 3, 160, 192], [8, 3, 256, 256], [32, 3, 256, 256]]}
    assert "sizes rounded to multiples of 32: ONNX Runtime runs the model at min, opt and max (not at smaller" \
        in " ".join(line.lstrip("# ").strip() for line in (project / "p.yaml").read_text().splitlines())


@pytest.mark.slow
def test_refused_an_existing_file(tmp_path):
    project = _copy("ppocr-cls", tmp_path)
    (project / "pipeline.yaml").write_text("# mine\n")
    proc = trtflow("init", f"models/{EXAMPLE_MODELS['ppocr-cls']}", "--data", "data", "-o", "pipeline.yaml",
                   cwd=project)
    _one_line_refusal(proc, "pipeline.yaml exists", "-o")
    assert (project / "pipeline.yaml").read_text() == "# mine\n"


@pytest.mark.slow
def test_refused_an_ambiguous_task(tmp_path):
    """SqueezeNet's [N, 1000] output under a name that says nothing: class logits or an embedding."""
    model = onnx.load(str(EXAMPLES / "squeezenet-cls" / "models" / EXAMPLE_MODELS["squeezenet-cls"]))
    producer = next(n for n in model.graph.node if "logits" in n.output)
    producer.output[list(producer.output).index("logits")] = "output"
    model.graph.output[0].name = "output"
    onnx.save(model, str(tmp_path / "net.onnx"))
    proc = trtflow("init", "net.onnx", cwd=tmp_path)
    line = _one_line_refusal(proc, "'output'", "--task classify", "--task embed")
    assert "class logits or an embedding" in line
    assert not (tmp_path / "pipeline.yaml").exists()
    proc = trtflow("init", "net.onnx", "--task", "embed", cwd=tmp_path)  # the flag it names decides it
    assert proc.returncode == 0, proc.stderr
    stages = yaml.safe_load((tmp_path / "pipeline.yaml").read_text())["stages"]
    assert stages["validate"]["metrics"] == {"output": {"embedding": {}}}
    assert "int8" not in stages and "parity" not in stages  # no data: nothing to calibrate on, nothing to preprocess
    assert trtflow("validate", "pipeline.yaml", cwd=tmp_path).returncode == 0


@pytest.mark.slow
def test_a_build_failure_no_size_of_inits_explains_is_written_down_not_refused(tmp_path, tensorrt_backend,
                                                                               monkeypatch):
    """A model whose only dynamic dimension is the batch, with a Reshape that bakes batch 1 in: TensorRT's trial
    build fails at the profile, but no --shape of init's would mend it. The file is written, saying so (prepare
    stops on it, with its hints), and init exits 1 saying why in one line; without TensorRT, the file says the
    profile was not checked."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "baked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "baked.onnx"))
    proc = trtflow("init", "baked.onnx", "--task", "other", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = " ".join(line.lstrip("# ").strip() for line in (tmp_path / "pipeline.yaml").read_text().splitlines())
    assert f"TensorRT's trial build ({tensorrt_backend.flavour} {tensorrt_backend.version}) FAILS at this " \
           f"profile: " in said and "the prepare stage will stop on it" in said
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: wrote pipeline.yaml, but it does not run: ") and "FAILS at this profile" in line
    assert trtflow("validate", "pipeline.yaml", cwd=tmp_path).returncode == 0

    from trtflow.flows.cli.init import trial_build
    from trtflow.pipelines.init.propose import propose
    from trtflow.stages.trt import env

    monkeypatch.setattr(env, "find_tensorrt", lambda only=None: None)
    trial = trial_build(propose(tmp_path / "baked.onnx", out=tmp_path / "p.yaml", command="", task="other"))
    assert trial.said().startswith("not checked by TensorRT's trial build: no TensorRT flavour is installed")


def _relu_then(path: Path, op: str, domain: str = "", **attrs) -> Path:
    """x -> Relu -> `op` (named after it, in lower case) -> y, float [batch, 4]."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node(op, ["r"], ["y"], name=op.lower(), domain=domain, **attrs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


@pytest.mark.slow
def test_init_exits_1_when_the_file_it_wrote_does_not_run_and_no_fix_is_proposed(tmp_path, tensorrt_backend):
    """Issue #69 item 7: init exited 0 after writing a file whose trial build it said fails, and a script checking
    the exit code ran into the failure at prepare. An op of a domain of its own (no rule rewrites it, and ONNX
    Runtime, which offload would run it on, does not define it) is exit 1: the file written, the reason in one
    line naming the node and the op. A model that builds, and one whose refused op offload runs, are exit 0."""
    alien = tmp_path / "alien"
    alien.mkdir()
    _relu_then(alien / "m.onnx", "Mystery", "com.example")
    proc = trtflow("init", "m.onnx", "--task", "other", cwd=alien)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: wrote pipeline.yaml, but it does not run: TensorRT's trial build "
                           f"({tensorrt_backend.flavour} {tensorrt_backend.version}) FAILS at this profile: "), line
    assert "will stop on mystery (Mystery: no rule rewrites it, and ONNX Runtime, which offload would run it on, " \
           "does not define com.example)" in line and "plugins:" in line, line
    written = (alien / "pipeline.yaml").read_text()
    assert "offload" not in yaml.safe_load(written)["stages"]["prepare"]
    assert "FAILS at this profile" in written
    assert trtflow("validate", "pipeline.yaml", cwd=alien).returncode == 0

    builds = tmp_path / "builds"
    builds.mkdir()
    _relu_then(builds / "m.onnx", "Neg")
    proc = trtflow("init", "m.onnx", "--task", "other", cwd=builds)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed at this profile's min / opt / max" in proc.stdout and proc.stderr.strip() == ""

    offloaded = tmp_path / "offloaded"
    offloaded.mkdir()
    _relu_then(offloaded / "m.onnx", "Binarizer", "ai.onnx.ml", threshold=0.5)  # ONNX Runtime runs it; no rule
    proc = trtflow("init", "m.onnx", "--task", "other", cwd=offloaded)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no rule rewrites binarizer (Binarizer)" in proc.stdout and "FAILS" not in proc.stdout
    assert yaml.safe_load((offloaded / "pipeline.yaml").read_text())["stages"]["prepare"]["offload"] == "onnxruntime"


@pytest.mark.slow
def test_refused_dynamic_spatial_dims_without_data_or_shape(tmp_path):
    project = _copy("ppocr-cls", tmp_path)
    model = f"models/{EXAMPLE_MODELS['ppocr-cls']}"
    proc = trtflow("init", model, cwd=project)
    _one_line_refusal(proc, "input 'x' dimension 2", "--shape 'x=1:8:32x3x<H>x<W>'", "--data")
    assert not (project / "models" / "pipeline.yaml").exists()
    # the flag it names: the shapes given, no data (random inputs, no INT8)
    proc = trtflow("init", model, "--shape", "x=1:8:32x3x48x48:192:640", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert _profiles_the_build_accepts(project / "models" / "pipeline.yaml") == {
        "x": [[1, 3, 48, 48], [8, 3, 48, 192], [32, 3, 48, 640]]}
    assert trtflow("validate", "pipeline.yaml", cwd=project / "models").returncode == 0


@pytest.mark.slow
def test_saved_tensors_size_the_profile_and_feed_every_stage(tmp_path):
    """--data of .npy tensors: the model takes them as they are (no parity stage), their shapes give the dynamic
    dimensions."""
    import numpy as np

    project = _copy("ppocr-cls", tmp_path)
    (project / "tensors").mkdir()
    for i, width in enumerate([100, 320, 160]):
        np.save(project / "tensors" / f"line{i}.npy", np.zeros((1, 3, 48, width), np.float32))
    proc = trtflow("init", f"models/{EXAMPLE_MODELS['ppocr-cls']}", "--data", "tensors", "-o", "p.yaml", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert _profiles_the_build_accepts(project / "p.yaml") == {
        "x": [[1, 3, 48, 100], [3, 3, 48, 160], [32, 3, 48, 320]]}
    stages = yaml.safe_load((project / "p.yaml").read_text())["stages"]
    assert "parity" not in stages
    assert stages["int8"]["data"] == stages["validate"]["data"] == {"tensors": "tensors/*.npy", "samples": 3}


# the other heads init knows, from their shapes and the op making them (facts as read_model gives them)
HEADS = [
    # (dims, producer, softmax axis, normalized, --task, --layout) -> metrics written, or the flag a refusal names
    (("batch", 84, 8400), "Concat", None, False, None, None, {"detections": {"layout": "yolov8"}}),  # YOLOv8/11
    (("batch", 25200, 85), "Concat", None, False, None, None, "--layout yolov5 or --layout yolov8"),  # YOLOv5?
    (("batch", 25200, 85), "Concat", None, False, None, "yolov5", {"detections": {"layout": "yolov5"}}),
    (("batch", 300, 6), "Concat", None, False, "detect", None, "--layout end2end or --layout yolov5"),
    (("batch", 21, "h", "w"), "Softmax", 1, False, None, None, {"map_iou": {"classes": list(range(1, 21)), "axis": 1}}),
    (("batch", 21, "h", "w"), "Conv", None, False, None, None, "--task segment or --task other"),
    (("batch", 512), "Div", None, True, None, None, {"embedding": {}}),  # divided by its L2 norm
    (("batch", "seq", 384), "Add", None, False, "embed", None, {"embedding": {"pool": "mean"}}),
    (("batch", "seq", 384), "Add", None, False, None, None, "--task ocr-rec or --task detect or --task embed or "
                                                             "--task other"),
    (("batch", 1, "h", "w"), "Sigmoid", None, False, "ocr-det", None, {"map_iou": {"threshold": 0.3}}),
    # issue #51: an image from an image (waifu2x's super-resolution): judged as pixels
    (("batch", 3, "h2", "w2"), "Conv", None, False, None, None, {"image": {"layout": "nchw"}}),
    (("batch", 1, "h", "w"), "Conv", None, False, "image", None, {"image": {"layout": "nchw"}}),
    (("batch", 1, "h", "w"), "Conv", None, False, None, None, "--task segment or --task ocr-det or --task image or "
                                                                "--task other"),
]


@pytest.mark.parametrize("dims, producer, axis, normalized, task, layout, expected", HEADS)
def test_the_task_metrics_of_other_heads(dims, producer, axis, normalized, task, layout, expected):
    from trtflow.errors import SpecError
    from trtflow.pipelines.init.model import ModelFacts, Tensor
    from trtflow.pipelines.init.task import guess

    out = Tensor("out", "float32", dims, producer, axis, normalized)
    model = ModelFacts(Path("m.onnx"), 17, (Tensor("x", "float32", ("batch", 3, 640, 640)),), (out,))
    if isinstance(expected, str):
        with pytest.raises(SpecError, match=expected):
            guess(model, task, layout)
        return
    (metric,) = guess(model, task, layout).metrics().values()
    assert metric.model_dump(mode="json", exclude_unset=True) == expected


@pytest.mark.slow
def test_tensor_names_are_yaml_values_never_yaml(tmp_path):
    """A model's tensor names are anyone's text: a line break, ': ', '#', quotes and an anchor stay inside their value
    (the written file reads back with the name exactly, and no key the name spells), and validate accepts it."""
    from onnx import TensorProto as TP
    from onnx import helper

    name = "x\nstages: {evil: 1} # &a 'q\" *a"
    node = helper.make_node("Softmax", [name], ["prob"], axis=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(name, TP.FLOAT, ["batch", 10])],
                              [helper.make_tensor_value_info("prob", TP.FLOAT, ["batch", 10])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    proc = trtflow("init", "m.onnx", "--shape", f"{name}=1:4:8x10", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spec = yaml.safe_load((tmp_path / "pipeline.yaml").read_text())
    assert "evil" not in spec["stages"]
    assert list(spec["stages"]["prepare"]["input_shapes"]) == [name]
    assert trtflow("validate", "pipeline.yaml", cwd=tmp_path).returncode == 0


def test_one_refusal_names_every_flag_it_needs_and_the_ways_out():
    """Issue #51: init asked for one flag per try (--task, then --layout); a refusal listed the tasks but not
    `other`; `--task detect` on a head of no YOLO layout did not point to detections.decode."""
    from trtflow.errors import SpecError
    from trtflow.pipelines.init.model import ModelFacts, Tensor
    from trtflow.pipelines.init.task import guess

    x = Tensor("x", "float32", ("batch", 3, 640, 640))
    both = ModelFacts(Path("m.onnx"), 17, (x,), (Tensor("out", "float32", ("batch", 1000), "Gemm"),
                                                 Tensor("head", "float32", ("batch", 25200, 85), "Concat")))
    with pytest.raises(SpecError) as err:
        guess(both, None, None)
    said = f"{err.value} {err.value.hint}"
    assert "output 'out'" in said and "output 'head'" in said
    assert "--task classify or --task embed or --task other, and --layout yolov5 or --layout yolov8" in said, said
    assert "detections.decode" in said
    centerface = ModelFacts(Path("m.onnx"), 17, (x,), (Tensor("heatmap", "float32", ("batch", 1, "h", "w"), "Sigmoid"),
                                                       Tensor("scale", "float32", ("batch", 2, "h", "w"), "Conv")))
    with pytest.raises(SpecError) as err:
        guess(centerface, "detect", None)
    assert "metrics.<output>.detections.decode: package.module:function" in str(err.value.hint), err.value.hint


@pytest.mark.slow
def test_a_model_pinned_to_a_batch_above_one_is_refused_with_images(tmp_path):
    """Issue #51: CenterFace as shipped takes [10, 3, 32, 32]; init wrote a batch-10 profile and a preprocessing
    that makes a batch of 1 from each photo (exit 0, no warning), and the run failed at parity. Now one line says
    why and what to do; nothing is written. With tensors of the pinned shape it proposes a runnable pipeline."""
    import numpy as np
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.full((4, 3, 3, 3), 0.1, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["input.1", "w"], ["heatmap"], pads=[1, 1, 1, 1])], "cf",
                              [helper.make_tensor_value_info("input.1", TP.FLOAT, [10, 3, 32, 32])],
                              [helper.make_tensor_value_info("heatmap", TP.FLOAT, [10, 4, 32, 32])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "centerface.onnx")
    (tmp_path / "data").mkdir()
    shutil.copy(EXAMPLES / "squeezenet-cls" / "data" / "astronaut.png", tmp_path / "data" / "a.png")
    proc = trtflow("init", "centerface.onnx", "--data", "data/*.png", "--task", "other", cwd=tmp_path)
    _one_line_refusal(proc, "input 'input.1' float32 [10, 3, 32, 32] is pinned to a batch of 10",
                      "dynamic_axes", "tensors of shape [10, 3, 32, 32]")
    assert not (tmp_path / "pipeline.yaml").exists()
    np.save(tmp_path / "data" / "t.npy", np.random.default_rng(0).uniform(0, 1, (10, 3, 32, 32)).astype(np.float32))
    proc = trtflow("init", "centerface.onnx", "--data", "data/*.npy", "--task", "other", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert trtflow("validate", "pipeline.yaml", cwd=tmp_path).returncode == 0
