"""The declared preprocessing executor and the PIL-exact antialiased resize."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.assets import EXAMPLES, PHOTOS
from trtflow.errors import StageError
from trtflow.pipelines.params.parity import ParityStage
from trtflow.stages.image import preprocess, resample
from trtflow.stages.image.steps import CenterCrop, Pad, Read, Resize, apply, dump, parse


@pytest.mark.slow
@pytest.mark.parametrize("interp,pil", [("linear", Image.BILINEAR), ("cubic", Image.BICUBIC),
                                        ("lanczos", Image.LANCZOS), ("area", Image.BOX)])
def test_antialiased_resize_is_pils_pixel_for_pixel(interp, pil):
    """PIL's fixed point (weights x 2^22, rounded half away from zero; sums from 2^21, shifted, clamped after each
    pass): bit-exact on real photos for the resizes pipelines declare — the shorter side to 256/224/160/32 as
    torchvision's Resize(n) does, downscales and upscales of one axis, and a square crop size. The float32
    weights used before were 1-2 levels off on 4802 values of one photo."""
    for photo in PHOTOS:
        im = Image.open(photo).convert("RGB")
        h, w = im.height, im.width
        sizes = [(s, round(w * s / h)) if h <= w else (round(h * s / w), s) for s in (256, 224, 160, 32)]
        sizes += [(h, w // 3), (h // 5, w), (h, w * 2 + 1), (224, 224)]
        for size in sizes:
            ref = np.asarray(im.resize((size[1], size[0]), pil))
            got = resample.resize(np.asarray(im), size[0], size[1], interp)
            assert got.dtype == np.uint8 and np.array_equal(ref, got), (photo.name, size, interp)


def test_a_resize_pillow_runs_vertical_first_is_within_a_level():
    """Pillow 13 runs some resizes that shrink one axis far more than the other with its vertical pass first (a
    512x512 photo to 37x500 with BILINEAR); trtflow always runs the horizontal pass first, as Pillow's
    Resample.c reads. The rounding between the passes then differs by at most one level."""
    im = Image.open(next(p for p in PHOTOS if p.name == "astronaut.png")).convert("RGB")
    ref = np.asarray(im.resize((500, 37), Image.BILINEAR)).astype(int)
    diff = np.abs(ref - resample.resize(np.asarray(im), 37, 500, "linear"))
    assert diff.max() <= 1


def _steps(deploy):
    return preprocess.canonical(ParityStage.model_validate(
        {"kind": "parity", "images": "*", "deploy": deploy, "training": {"tensors": "*"}}).deploy)


def test_canonical_form_and_digest():
    a = _steps([{"resize": {"shorter": 256}}, {"center_crop": 224}, {"scale": "1/255"}])
    b = _steps([{"read": "rgb"}, {"resize": {"shorter": 256, "interp": "linear"}}, {"center_crop": [224, 224]},
                {"scale": 1 / 255}])
    assert a == b and preprocess.digest(a) == preprocess.digest(b)
    assert a[:3] == [Read("rgb", 8), Resize(shorter=256, interp="linear"), CenterCrop((224, 224))]
    assert dump(a)[:2] == [{"read": {"color": "rgb", "depth": 8}},
                           {"resize": {"shorter": 256, "interp": "linear", "antialias": False}}]
    c = _steps([{"read": "bgr"}, {"resize": {"shorter": 256}}])
    assert preprocess.digest(c) != preprocess.digest(a)


def test_letterbox_gray_and_layouts():
    pre = preprocess.Preprocessor(_steps([{"read": "gray"}, {"letterbox": {"size": [320, 320], "pad": 0}},
                                          {"dtype": "float32"}, {"layout": "chw"}, {"batch": True}]))
    chelsea = next(p for p in PHOTOS if p.name == "chelsea.png")  # 451 x 300: padded above and below
    x = pre(chelsea)
    assert x.shape == (1, 1, 320, 320) and x.dtype == np.float32
    assert x[0, 0, 0, :].max() == 0 and x[0, 0, 160, :].max() > 0


@pytest.mark.parametrize("deploy,message", [
    ([{"center_crop": 4000}], "center_crop 4000x4000 is larger than the image"),
    ([{"resize": {"shorter": 64}}, {"read": "rgb"}], "'read' must be the first preprocessing step"),
    ([{"normalize": {"mean": [0.5, 0.5], "std": [0.5, 0.5]}}], "normalize has 2 means / 2 stds for an image with 3"),
    ([{"layout": "chw"}, {"resize": {"shorter": 64}}], "'resize' must come before 'layout: chw'"),
])
def test_step_errors(deploy, message):
    with pytest.raises(StageError, match=message):
        preprocess.Preprocessor(_steps(deploy))(PHOTOS[0])


def test_unreadable_image(tmp_path):
    bad = tmp_path / "x.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    with pytest.raises(StageError, match="cannot read image .*x.png"):
        preprocess.read_image(bad)


def test_text_line_resize_and_pad(tmp_path):
    """PaddleOCR's classifier input: height 48, width ceil(48 * w / h) up to 192, padded on the right."""
    import cv2
    line = tmp_path / "line.png"
    cv2.imwrite(str(line), cv2.imread(str(PHOTOS[0]))[100:122, 50:135])  # 22 x 85: 48 * 85 / 22 = 185.45
    widths = {}
    for mode in ("floor", "round", "ceil"):
        x = preprocess.Preprocessor(_steps([{"resize": {"height": 48, "round": mode}}]))(line)
        widths[mode] = x.shape[1]
    assert widths == {"floor": 185, "round": 185, "ceil": 186}
    wide = preprocess.Preprocessor(_steps([{"resize": {"height": 48, "max_width": 120}}]))(line)
    assert wide.shape == (48, 120, 3)  # squeezed, as PaddleOCR does
    for layout in ("hwc", "chw"):
        x = preprocess.Preprocessor(_steps([{"resize": {"height": 48, "max_width": 192, "round": "ceil"}},
                                            {"scale": "1/255"}, {"layout": layout},
                                            {"pad": {"size": [48, 192], "value": [-1, 0, 1]}}]))(line)
        x = x if layout == "chw" else x.transpose(2, 0, 1)
        assert x.shape == (3, 48, 192) and (x[:, :, 186:].reshape(3, -1) == [[-1], [0], [1]]).all()
        assert x[:, :, :186].min() >= 0
    with pytest.raises(StageError, match=r"pad: the image is 48x186 at that step, larger than size \[48, 160\]"):
        preprocess.Preprocessor(_steps([{"resize": {"height": 48, "round": "ceil"}},
                                        {"pad": {"size": [48, 160]}}]))(line)


def test_center_crop_rounding_and_canonical_defaults(tmp_path):
    assert _steps([{"center_crop": {"size": 56}}]) == _steps([{"center_crop": 56}])
    assert _steps([{"resize": {"shorter": 64, "round": "floor"}}]) == _steps([{"resize": {"shorter": 64}}])
    img = np.zeros((5, 9, 3), np.uint8)
    img[:, :, 0] = np.arange(45).reshape(5, 9)  # each pixel's position, in blue
    import cv2
    path = tmp_path / "small.png"
    cv2.imwrite(str(path), img)
    first = {}
    for mode in ("round", "floor", "ceil"):  # margins 1.5 and 2.5: Python rounds half to even, as torchvision
        out = preprocess.Preprocessor(_steps([{"read": "bgr"}, {"center_crop": {"size": [2, 4], "round": mode}}]))
        first[mode] = tuple(int(v) for v in np.argwhere(img[:, :, 0] == out(path)[0, 0, 0])[0])
    assert first == {"round": (2, 2), "floor": (1, 2), "ceil": (2, 3)}


@pytest.mark.parametrize("resize,message", [
    ({"height": 48, "shorter": 32}, "give exactly one of 'size', 'shorter' or 'height'"),
    ({"shorter": 32, "max_width": 100}, "'max_width' goes with 'height'"),
    ({"size": [48, 192], "round": "ceil"}, "'round' applies to 'shorter' or 'height'"),
])
def test_resize_spec_errors(resize, message):
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match=message):
        _steps([{"resize": resize}])


def test_every_declared_step_has_one_class_and_every_class_a_declaration():
    """A step is a field of PreprocessStep (its parameters) and a class in the registry (its code, its causes)."""
    from trtflow.pipelines.params.parity import PreprocessStep
    from trtflow.stages.image.steps import STEPS

    assert set(PreprocessStep.model_fields) == set(STEPS)
    with pytest.raises(StageError, match="unknown preprocessing step 'sharpen'"):
        preprocess.Preprocessor.from_json([{"read": {"color": "rgb", "depth": 8}}, {"sharpen": 1}])


def test_pad_places_the_image_where_declared():
    """NudeNet pads right and bottom to a square; letterbox-style detectors pad on every side."""
    img = np.arange(2 * 4 * 3, dtype=np.uint8).reshape(2, 4, 3) + 1
    steps = _steps([{"pad": {"size": "square", "value": 0}}])
    assert steps[1] == Pad("square", 0.0, "top_left")
    assert dump(steps)[1] == {"pad": {"size": "square", "value": 0.0}}, "the default placement is not in the digest"
    out = _run(steps[1:], img)
    assert out.shape == (4, 4, 3) and (out[:2] == img).all() and (out[2:] == 0).all()
    centred = _run(_steps([{"pad": {"size": [5, 6], "value": 7, "place": "center"}}])[1:], img)
    assert (centred[1:3, 1:5] == img).all() and (centred[0] == 7).all() and (centred[3:] == 7).all()
    corner = _run(_steps([{"pad": {"size": [3, 5], "place": "bottom_right"}}])[1:], img)
    assert (corner[1:, 1:] == img).all() and (corner[0] == 0).all()


def _run(steps, img):
    layout = "hwc"
    for step in steps:
        img, layout = apply(img, step, layout)
    return img


# the canonical steps' digests of the examples' parity stages: they key the results of every later stage that runs
# the preprocessing, so a change of the canonical form (a default filled in, a key left out) must not move them
EXAMPLE_DIGESTS = {"ppocr-cls": "50336c82d79876c9a0819d65f0852f6b808a886f6c99e0d9f76b25b338df70ff",
                   "ppocr-det": "c978dd0db33e00c909a0948913d31981884d64a354e4e2f53cf17aeeecb68632",
                   "ppocr-rec": "9da64c5b4863af4bb20fe3079afab7bd430e68a8a72d71f6e9fee9a1e2c6a14e",
                   "squeezenet-cls": "d9c431219e26c8f5a11c6d996293f866ab5bf52a207c997452c96447e7617dde"}


@pytest.mark.parametrize("example", sorted(EXAMPLE_DIGESTS))
def test_the_examples_canonical_steps_keep_their_digest_and_read_back_typed(example, tmp_path):
    import yaml

    deploy = yaml.safe_load((EXAMPLES / example / "pipeline.yaml").read_text())["stages"]["parity"]["deploy"]
    steps = _steps(deploy)
    assert preprocess.digest(steps) == EXAMPLE_DIGESTS[example]
    assert parse(dump(steps)) == steps and hash(tuple(steps)) == hash(tuple(parse(dump(steps))))
    loaded = preprocess.load(preprocess.save(steps, tmp_path / "preprocess.json"))
    assert loaded.steps == steps and loaded.digest == EXAMPLE_DIGESTS[example]


def test_the_vendored_preprocessing_imports_numpy_opencv_and_scipy_only(tmp_path):
    """The copy a Triton Python-backend model runs (stages/release/triton/preprocess.py): its server has numpy, OpenCV and
    scipy, neither trtflow nor pydantic. Imported with every other top-level module refused, it runs ImageNet-style
    steps (the antialiased resize's scipy included) from their JSON and gives the tensor trtflow gives."""
    import json
    import subprocess
    import sys

    from trtflow.stages.release.triton.preprocess import PACKAGE, vendored_sources

    (tmp_path / PACKAGE).mkdir()
    for name, source in vendored_sources().items():
        (tmp_path / PACKAGE / name).write_text(source)
    steps = _steps([{"resize": {"shorter": 64, "antialias": True}}, {"center_crop": 56}, {"scale": "1/255"},
                    {"normalize": {"mean": [0.5], "std": [0.25]}}, {"layout": "chw"}, {"batch": True}])
    (tmp_path / "steps.json").write_text(json.dumps(dump(steps)))
    script = f"""
import importlib.abc, json, sys
import numpy as np
ALLOWED = set(sys.stdlib_module_names) | {{"numpy", "cv2", "scipy", "{PACKAGE}"}}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in ALLOWED and not name.startswith("_"):  # private: the stdlib's own
            raise ImportError("refused: " + name)
sys.meta_path.insert(0, Refuse())
sys.path.insert(0, {str(tmp_path)!r})
from {PACKAGE}.preprocess import Preprocessor
assert not [m for m in sys.modules if m.split(".")[0] in ("trtflow", "pydantic")]
x = Preprocessor.from_json(json.loads(open({str(tmp_path / "steps.json")!r}).read()))({str(PHOTOS[0])!r})
np.save({str(tmp_path / "x.npy")!r}, x)
"""
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert np.array_equal(np.load(tmp_path / "x.npy"), preprocess.Preprocessor(steps)(PHOTOS[0]))
