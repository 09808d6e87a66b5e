"""Two usual causes at once: every pair of the causes that apply, planted in three real pipelines (ImageNet with
torchvision's transforms, a YOLO-style letterbox, PP-OCR's classifier with PaddleOCR's own function) on real
images, is diagnosed with the right combined fix, and the suggested YAML passes parity."""
from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import cv2
import pytest
import yaml

from tests.assets import EXAMPLES, PHOTOS
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageFailed
from trtflow.pipelines.params.parity import ParityStage
from trtflow.stages.image import preprocess
from trtflow.stages.parity import stage as parity

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
IMAGENET = {
    "deploy": [{"read": "rgb"}, {"resize": {"shorter": 64, "antialias": True}}, {"center_crop": 56},
               {"scale": "1/255"}, {"normalize": {"mean": MEAN, "std": STD}}, {"layout": "chw"}, {"batch": True}],
    "training": {"torchvision": ["Resize(64)", "CenterCrop(56)", "ToTensor()", f"Normalize(mean={MEAN}, std={STD})"]},
    "tolerances": {"max_abs": 0.02, "mean_abs": 0.001},
}
PPOCR = yaml.safe_load((EXAMPLES / "ppocr-cls" / "pipeline.yaml").read_text())["stages"]["parity"]
LINES = EXAMPLES / "ppocr-cls" / "data"


def _set(i: int, key: str, value):
    def change(steps):
        (name, spec), = steps[i].items()
        steps[i] = {name: {**spec, key: value}}
    return change


def _swap(i: int):
    def change(steps):
        steps[i], steps[i + 1] = steps[i + 1], steps[i]
    return change


# name: (order of application, change). Changes of a field come first, then
# changes of the step order, then inserted steps, so that the indices hold.
IMAGENET_CAUSES = {
    "bgr": (0, lambda s: s.__setitem__(0, {"read": "bgr"})),
    "interp": (0, _set(1, "interp", "nearest")),
    "antialias": (0, _set(1, "antialias", False)),
    "rounding": (0, _set(1, "round", "round")),
    "crop offset": (0, lambda s: s.__setitem__(2, {"center_crop": {"size": 56, "round": "floor"}})),
    "x255": (0, lambda s: s.__setitem__(3, {"scale": 1})),
    "mean/std scale": (0, lambda s: s.__setitem__(4, {"normalize": {"mean": [m * 255 for m in MEAN],
                                                                     "std": [x * 255 for x in STD]}})),
    "layout": (0, lambda s: s.__setitem__(5, {"layout": "hwc"})),
    "crop/resize order": (1, _swap(1)),
    "uint8 rounding": (2, lambda s: s.insert(1, {"dtype": "float32"})),
}
PPOCR_CAUSES = {
    "rgb": (0, lambda s: s.__setitem__(0, {"read": "rgb"})),
    "gray": (0, lambda s: s.__setitem__(0, {"read": "gray"})),
    "rounding": (0, _set(1, "round", "floor")),
    "plain resize": (1, lambda s: s.__setitem__(1, {"resize": {"size": [48, 192], **{
        k: v for k, v in s[1]["resize"].items() if k in ("interp", "antialias")}}})),
    "interp": (0, _set(1, "interp", "cubic")),
    "antialias": (0, _set(1, "antialias", True)),
    "pad value": (0, lambda s: s.__setitem__(5, {"pad": {"size": [48, 192], "value": -1}})),
    "no scale": (2, lambda s: s.pop(2)),
    "mean/std scale": (0, lambda s: s.__setitem__(3, {"normalize": {"mean": [127.5], "std": [127.5]}})),
    "uint8 rounding": (3, lambda s: s.insert(1, {"dtype": "float32"})),
    "layout": (0, lambda s: s.__setitem__(4, {"layout": "hwc"})),
}
LETTERBOX = {
    "deploy": [{"read": "rgb"}, {"letterbox": {"size": [64, 64], "pad": 114}}, {"scale": "1/255"},
               {"layout": "chw"}, {"batch": True}],
    "training": {"callable": "tests.test_parity_combined:yolo_letterbox"},
    "tolerances": {"max_abs": 0.001, "mean_abs": 0.0001},
}
LETTERBOX_CAUSES = {
    "bgr": (0, lambda s: s.__setitem__(0, {"read": "bgr"})),
    "gray": (0, lambda s: s.__setitem__(0, {"read": "gray"})),
    "plain resize": (1, lambda s: s.__setitem__(1, {"resize": {"size": [64, 64],
                                                               "interp": s[1]["letterbox"].get("interp", "linear")}})),
    "pad value": (0, _set(1, "pad", 0)),
    "interp": (0, _set(1, "interp", "nearest")),
    "x255": (0, lambda s: s.__setitem__(2, {"scale": 1})),
    "layout": (0, lambda s: s.__setitem__(3, {"layout": "hwc"})),
    "uint8 rounding": (2, lambda s: s.insert(1, {"dtype": "float32"})),
}


def yolo_letterbox(path: str):
    """YOLO-style training preprocessing: keep the aspect ratio, pad with grey 114 around the centre, RGB, 0..1."""
    img = cv2.imread(path)
    h, w = img.shape[:2]
    r = min(64 / h, 64 / w)
    nh, nw = round(h * r), round(w * r)
    resized = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    top, left = round((64 - nh) / 2 - 0.1), round((64 - nw) / 2 - 0.1)
    out = cv2.copyMakeBorder(resized, top, 64 - nh - top, left, 64 - nw - left, cv2.BORDER_CONSTANT,
                             value=(114, 114, 114))
    return cv2.cvtColor(out, cv2.COLOR_BGR2RGB).transpose(2, 0, 1).astype("float32") / 255


# pairs that are no mistake together (0..255 pixels with mean/std x255 is the same tensor), or that set one field
CANCEL = {frozenset({"x255", "mean/std scale"}), frozenset({"no scale", "mean/std scale"})}
CONFLICT = {frozenset({"rgb", "gray"}), frozenset({"bgr", "gray"}), frozenset({"plain resize", "rounding"})}


def _pairs(causes: dict, conflict: frozenset = frozenset()) -> list:
    return [pair for pair in itertools.combinations(causes, 2) if frozenset(pair) not in CANCEL | CONFLICT | conflict]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[Path]:
    """Two real photo crops sized so that every cause shows: 133 px resizes to 87.75 (floor 87, round 88), 132 px
    to 87.1, and an 87 px wide image has an odd margin around the 56 px crop (centre rounded up or down)."""
    root = tmp_path_factory.mktemp("photos")
    out = []
    for name, (top, left, h, w) in {"chelsea.png": (60, 150, 97, 133), "coffee.png": (80, 200, 132, 97)}.items():
        img = cv2.imread(str(next(p for p in PHOTOS if p.name == name)))
        path = root / name
        cv2.imwrite(str(path), img[top:top + h, left:left + w])
        out.append(path)
    return out


def _check(spec: dict, images: list[Path], causes: dict, pair: tuple, tmp_path: Path) -> None:
    steps = copy.deepcopy(spec["deploy"])
    for name in sorted(pair, key=lambda n: causes[n][0]):
        causes[name][1](steps)
    params = ParityStage.model_validate({**spec, "kind": "parity", "images": "*", "deploy": steps})
    arts = [Artifact(p, "file", p.name) for p in images]
    (tmp_path / "planted").mkdir()
    with pytest.raises(StageFailed) as info:
        parity.run(params, Inputs({"images": arts}), tmp_path / "planted")
    report = json.loads((tmp_path / "planted" / "report.json").read_text())
    d = report["diagnosis"]
    assert d.get("fix"), f"{pair}: {info.value}"
    assert "\n" not in str(info.value) and f"— fix: {d['fix']}" in str(info.value)
    assert d["after_fix"]["passing"] == len(images) and d["search"]["rounds"] <= 3
    # the right combined fix: the corrected YAML is the declaration the mistakes were planted in
    fixed = yaml.safe_load(d["yaml"])["deploy"]
    expected = preprocess.canonical(ParityStage.model_validate({**spec, "kind": "parity", "images": "*"}).deploy)
    got = preprocess.canonical(ParityStage.model_validate({**spec, "kind": "parity", "images": "*",
                                                           "deploy": fixed}).deploy)
    assert got == expected, f"{pair}: {d['cause']} — {d['fix']}"
    (tmp_path / "fixed").mkdir()
    result = parity.run(ParityStage.model_validate({**spec, "kind": "parity", "images": "*", "deploy": fixed}),
                        Inputs({"images": arts}), tmp_path / "fixed")
    assert json.loads(result.outputs["report"].read_text())["verdict"] == "pass"


@pytest.mark.slow
@pytest.mark.parametrize("pair", _pairs(IMAGENET_CAUSES), ids=" + ".join)
def test_pair_on_imagenet_preprocessing(pair, photos, tmp_path):
    pytest.importorskip("torchvision")
    _check(IMAGENET, photos, IMAGENET_CAUSES, pair, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("pair", _pairs(PPOCR_CAUSES), ids=" + ".join)
def test_pair_on_ppocr_preprocessing(pair, tmp_path):
    # one line padded on the right (its width rounds up), one squeezed to 192: every cause shows on them
    _check(PPOCR, [LINES / "07-object-0.png", LINES / "01-region-based-0.png"], PPOCR_CAUSES, pair, tmp_path)


@pytest.mark.parametrize("pair", _pairs(LETTERBOX_CAUSES, {frozenset({"plain resize", "pad value"})}),
                         ids=" + ".join)  # a plain resize has no pad
def test_pair_on_letterbox_preprocessing(pair, photos, tmp_path):
    _check(LETTERBOX, photos, LETTERBOX_CAUSES, pair, tmp_path)


@pytest.mark.slow
def test_every_cause_shows_alone(photos, tmp_path):
    """The planted causes each fail parity on these images (else a pair would test one cause)."""
    pytest.importorskip("torchvision")
    for spec, images, causes in ((IMAGENET, photos, IMAGENET_CAUSES), (LETTERBOX, photos, LETTERBOX_CAUSES),
                                 (PPOCR, [LINES / "07-object-0.png", LINES / "01-region-based-0.png"], PPOCR_CAUSES)):
        for name, (_, change, *_) in causes.items():
            steps = copy.deepcopy(spec["deploy"])
            change(steps)
            out = tmp_path / f"{len(list(tmp_path.iterdir()))}"
            out.mkdir()
            params = ParityStage.model_validate({**spec, "kind": "parity", "images": "*", "deploy": steps})
            with pytest.raises(StageFailed):
                parity.run(params, Inputs({"images": [Artifact(p, "file", p.name) for p in images]}), out)
