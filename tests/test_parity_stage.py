"""Stage `parity` on real photos (scikit-image's samples) against real torchvision transforms."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.assets import PHOTOS, SQUEEZENET
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.parity import ParityStage
from trtflow.stages.image import preprocess
from trtflow.stages.parity import stage as parity

pytest.importorskip("torchvision")

MODEL = SQUEEZENET

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
DEPLOY = [{"read": "rgb"}, {"resize": {"shorter": 256, "antialias": True}}, {"center_crop": 224},
          {"scale": "1/255"}, {"normalize": {"mean": MEAN, "std": STD}}, {"layout": "chw"}, {"batch": True}]
TRAINING = {"torchvision": ["Resize(256)", "CenterCrop(224)", "ToTensor()", f"Normalize(mean={MEAN}, std={STD})"]}


def stage(deploy=None, training=None, **kw) -> ParityStage:
    return ParityStage.model_validate({"kind": "parity", "images": "*", "deploy": deploy or DEPLOY,
                                       "training": training or TRAINING, **kw})


def images(paths=PHOTOS) -> list[Artifact]:
    return [Artifact(p, "file", p.name) for p in paths]


def run(params, tmp_path: Path, model: Path | None = None, **extra):
    out = tmp_path / "out"
    out.mkdir(parents=True)
    inputs = {"images": images(), **extra}
    if model:
        inputs["model"] = Artifact(model, "onnx", "m")
    return parity.run(params, Inputs(inputs), out)


def test_declared_pipeline_matches_torchvision(tmp_path):
    result = run(stage(), tmp_path, model=MODEL)
    report = json.loads(result.outputs["report"].read_text())
    assert report["verdict"] == "pass"
    assert all(r["max_abs"] < 0.02 and r["mean_abs"] < 1e-4 for r in report["images"])
    assert report["model"]["top1"] == 1.0 and report["model"]["top5"] == 1.0
    assert report["model"]["runtime"] == "onnxruntime-cpu"
    # the resolved preprocessing is an artifact later stages run, and it reproduces the tensors
    pre = preprocess.load(result.outputs["preprocess"])
    assert pre.digest == report["preprocess_digest"]
    assert pre(PHOTOS[0]).shape == (1, 3, 224, 224)
    assert result.outputs["picture"].stat().st_size > 10_000


def _variant(change) -> list:
    steps = copy.deepcopy(DEPLOY)
    change(steps)
    return steps


CAUSES = {
    "bgr": (lambda s: s.__setitem__(0, {"read": "bgr"}), "R and B swapped", "read: rgb"),
    "interpolation": (lambda s: s.__setitem__(1, {"resize": {"shorter": 256, "antialias": True, "interp": "nearest"}}),
                      "resize interpolation differs", "resize with interp: linear"),
    "x255": (lambda s: s.__setitem__(3, {"scale": 1}), "pixel scale differs (/255)", "scale: 1/255"),
    "mean/std scale": (lambda s: s.__setitem__(4, {"normalize": {"mean": [m * 255 for m in MEAN],
                                                                 "std": [x * 255 for x in STD]}}),
                       "mean/std on the other scale (/255)", "normalize: {mean: [0.485, 0.456, 0.406]"),
    "layout": (lambda s: s.__setitem__(5, {"layout": "hwc"}), "layout differs", "layout: chw"),
    "crop/resize order": (lambda s: s.__setitem__(slice(1, 3), [{"center_crop": 224}, s[1]]),
                          "crop and resize in the other order", "resize before center_crop"),
    "antialias": (lambda s: s.__setitem__(1, {"resize": {"shorter": 256}}), "antialiasing differs",
                  "resize with antialias: true"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CAUSES))
def test_planted_difference_is_diagnosed(tmp_path, case):
    change, cause, fix = CAUSES[case]
    with pytest.raises(StageFailed) as info:
        run(stage(deploy=_variant(change)), tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and f"likely cause: {cause}" in msg and fix in msg, msg
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verdict"] == "fail" and report["diagnosis"]["cause"] == cause
    # the YAML snippet is the full fixed deploy list, and it really agrees with training
    import yaml
    fixed = yaml.safe_load(report["diagnosis"]["yaml"])["deploy"]
    (tmp_path / "fixed").mkdir()
    out = parity.run(stage(deploy=fixed), Inputs({"images": images()}), tmp_path / "fixed")
    assert json.loads(out.outputs["report"].read_text())["verdict"] == "pass"


@pytest.mark.slow
def test_mismatch_as_warning(tmp_path):
    result = run(stage(deploy=_variant(CAUSES["bgr"][0]), on_mismatch="warn"), tmp_path)
    assert result.warnings and "R and B swapped" in result.warnings[0]


@pytest.mark.slow
def test_model_predictions_reported_on_mismatch(tmp_path):
    with pytest.raises(StageFailed) as info:
        run(stage(deploy=_variant(CAUSES["bgr"][0])), tmp_path, model=MODEL)
    assert "model top-1 agreement" in str(info.value)
    model = json.loads((tmp_path / "out" / "report.json").read_text())["model"]
    # random weights predict nearly one class whatever the input, so top-1 may still agree; the logits do not
    assert model["max_abs_diff"] > 100 * 4.9e-05


def test_corrupt_image(tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(PHOTOS[0].read_bytes()[:100])
    out = tmp_path / "o"
    out.mkdir()
    with pytest.raises(StageError, match="cannot read image .*broken.jpg"):
        parity.run(stage(), Inputs({"images": images([bad])}), out)


@pytest.mark.slow
def test_grayscale_where_model_wants_three_channels(tmp_path):
    gray = _variant(lambda s: s.__setitem__(0, {"read": "gray"}))
    gray[4] = {"normalize": {"mean": [0.5], "std": [0.25]}}
    with pytest.raises(StageError, match=r"preprocessed images have 1 channel\(s\) but the model's input 'input' "
                                         r"wants 3"):
        run(stage(deploy=gray, on_mismatch="warn"), tmp_path, model=MODEL)


def test_shape_that_does_not_fit_the_model(tmp_path):
    small = _variant(lambda s: s.__setitem__(2, {"center_crop": 200}))
    training = {"torchvision": ["Resize(256)", "CenterCrop(200)", "ToTensor()", f"Normalize(mean={MEAN}, std={STD})"]}
    with pytest.raises(StageError, match=r"preprocessed shape \[1, 3, 200, 200\] does not fit the model's input "
                                         r"'input'"):
        run(stage(deploy=small, training=training), tmp_path, model=MODEL)


def _reference(path: str) -> np.ndarray:
    """A training-side callable, as users would write one."""
    from PIL import Image
    from torchvision import transforms as T
    tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
    return tf(Image.open(path).convert("RGB")).numpy()


def _broken(path: str) -> np.ndarray:
    raise ValueError("boom")


def test_callable_reference(tmp_path):
    result = run(stage(training={"callable": "tests.test_parity_stage:_reference"}), tmp_path)
    assert json.loads(result.outputs["report"].read_text())["runtimes"]["training"].startswith("callable")
    with pytest.raises(StageError, match=r"training.callable tests.test_parity_stage:_broken raised ValueError"):
        run(stage(training={"callable": "tests.test_parity_stage:_broken"}), tmp_path / "b")
    with pytest.raises(StageError, match="cannot import 'tests.nothere'"):
        run(stage(training={"callable": "tests.nothere:f"}), tmp_path / "c")


def _blob(path: str) -> np.ndarray:
    """The training side as many OpenCV pipelines write it: cv2.dnn.blobFromImage, a batched 4-D tensor."""
    import cv2
    return cv2.dnn.blobFromImage(cv2.imread(str(path)), 1 / 255, (224, 224), swapRB=True)


def test_a_batched_4d_reference_against_a_batched_deploy(tmp_path):
    """Seen before: a training reference returning cv2.dnn.blobFromImage's [1, 3, H, W] with deploy `batch: true`
    crashed the picture (OpenCV colormap.cpp:738). Both sides hold one image: they are compared and drawn."""
    deploy = [{"read": "rgb"}, {"resize": {"size": [224, 224]}}, {"scale": "1/255"}, {"layout": "chw"},
              {"batch": True}]
    result = run(stage(deploy=deploy, training={"callable": "tests.test_parity_stage:_blob"}), tmp_path)
    report = json.loads(result.outputs["report"].read_text())
    assert report["verdict"] == "pass" and all(r["shape_ok"] and r["max_abs"] < 1e-6 for r in report["images"])
    assert result.outputs["picture"].stat().st_size > 10_000


def test_saved_tensors_reference(tmp_path):
    tensors = []
    for p in PHOTOS:
        f = tmp_path / f"{p.stem}.npy"
        np.save(f, _reference(str(p)))
        tensors.append(Artifact(f, "file", f.name))
    result = run(stage(training={"tensors": "*.npy"}), tmp_path, training_tensors=tensors)
    assert json.loads(result.outputs["report"].read_text())["verdict"] == "pass"
    with pytest.raises(StageError, match=r"training.tensors: 3 tensor file\(s\) for 4 image\(s\)"):
        run(stage(training={"tensors": "*.npy"}), tmp_path / "b", training_tensors=tensors[:3])


def test_unknown_torchvision_transform(tmp_path):
    with pytest.raises(StageError, match="unknown transform 'CentreCrop' \\(did you mean 'CenterCrop'\\?\\)"):
        run(stage(training={"torchvision": ["Resize(256)", "CentreCrop(224)"]}), tmp_path)


def test_no_image_matches_the_glob(write_yaml, workdir):
    from trtflow.errors import SpecError
    from trtflow.flows.runner import Runner
    from trtflow.pipelines.loader import load_pipeline

    path = write_yaml("""
        version: 1
        name: p
        model: models/cls.onnx
        stages:
          parity:
            kind: parity
            images: photos/*.jpg
            deploy: [{read: rgb}]
            training: {torchvision: ["ToTensor()"]}
        """)
    runner = Runner(load_pipeline(path))
    with pytest.raises(SpecError, match=r"pipeline.yaml:7: stages.parity.images: no file matches 'photos/\*.jpg'"):
        runner.run_stage("parity", {})
    (workdir / "photos").mkdir()
    shutil.copy(PHOTOS[0], workdir / "photos" / "a.jpg")
    assert runner.plan()[0].action == "run"


def test_a_report_of_parity_v2_still_reads():
    """parity v2 stored each image's metrics as a dict holding only the fields of its case (`shape` where the
    shapes agree, `deploy_shape`/`training_shape` where not, Infinity for their difference): it still reads."""
    from trtflow.stages.parity.report import ParityReport

    ok = {"shape_ok": True, "shape": [3, 48, 192], "max_abs": 0.004, "mean_abs": 0.001, "psnr": 52.0,
          "image": "a.png", "channels": [{"deploy_mean": 0.1, "training_mean": 0.1, "deploy_std": 0.2,
                                          "training_std": 0.2}]}
    bad = {"shape_ok": False, "deploy_shape": [48, 192, 3], "training_shape": [3, 48, 192], "max_abs": float("inf"),
           "mean_abs": float("inf"), "psnr": 0.0, "image": "b.png", "channels": None}
    v2 = {"verdict": "fail", "preprocess_digest": "ab" * 32, "steps": [{"read": {"color": "rgb", "depth": 8}}],
          "runtimes": {"deploy": "opencv", "training": "torchvision"},
          "tolerances": {"max_abs": 0.02, "mean_abs": 0.005, "min_psnr": None, "top1": 0.99},
          "images": [ok, bad], "worst_image": "b.png",
          "model": {"ran": True, "runtime": "onnxruntime", "output": "y", "max_abs_diff": 0.3, "top1": 0.5,
                    "top5": 1.0, "ok": False, "predictions": [{"image": "a.png", "training": 1, "deploy": 0,
                                                               "training_score": 0.9, "deploy_score": 0.6}]},
          "diagnosis": {"declared": {"mean_abs": 0.2, "max_abs": 0.9},
                        "tried": [{"cause": "channel order", "fix": "read: bgr", "ok": False, "error": "too small"}],
                        "search": {"rounds": 3, "max_rounds": 3, "beam": 4, "evaluations": 40, "images": 2,
                                   "seconds": 1.5}}}
    report = ParityReport.model_validate_json(json.dumps(v2))  # Python's json writes inf as Infinity, as v2 did
    assert [x.shape_ok for x in report.images] == [True, False] and report.images[1].mean_abs == float("inf")
    assert report.tolerances.top1 == 0.99
    assert "shape [48, 192, 3] vs training [3, 48, 192]" in report.failure_line()
    assert "| a\\.png | 0.004 | 0.001 | 52.0 | yes |" in report.summary(None)
    assert report.model.predictions[0].deploy == 0 and report.diagnosis.tried[0].error == "too small"
    assert "model top-1 agreement 50%; no usual cause, alone or up to 3 combined" in report.failure_line()
    assert "| a\\.png | 1 (0.9) | 0 (0.6) **differs** |" in report.summary(None)


def test_the_worst_picture_of_a_text_line_is_not_wider_than_a_page(tmp_path):
    """A small tensor's picture is enlarged, each pixel a block, to about 256 px high; a text line (48x320, three
    panels side by side) only as far as 2048 px wide: enlarged five times it was 4880 px, 371 KB of PNG in each
    run's Prefect artifact."""
    import cv2

    from tests.assets import EXAMPLES
    from trtflow.stages.parity.picture import worst_picture

    line = cv2.imread(str(sorted((EXAMPLES / "ppocr-rec" / "data").glob("*.png"))[0]))
    train = cv2.resize(line, (320, 48)).transpose(2, 0, 1).astype(np.float32) / 255
    drawn = cv2.imread(str(worst_picture(train[::-1], train, tmp_path / "line.png", "line")))  # R and B swapped
    banner = 28
    assert drawn.shape[:2] == (banner + 48 * 2, (320 * 3 + 2 * 8) * 2), drawn.shape
    assert (tmp_path / "line.png").stat().st_size < 200_000  # small enough for the summary to show it inline
    patch = train[:, :32, :32]
    drawn = cv2.imread(str(worst_picture(patch * 0.5, patch, tmp_path / "patch.png", "patch")))
    assert drawn.shape[:2] == (banner + 32 * 8, (32 * 3 + 2 * 8) * 8), drawn.shape
