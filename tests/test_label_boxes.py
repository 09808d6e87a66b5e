"""Ground truth as boxes and masks (issue #51): PP-OCRv4's text detector on real photos with words rendered at
known places, scored against COCO-format boxes (pycocotools' mAP) and per-pixel masks (mIoU) through a
preprocessing that moves the image (a letterbox), for FP32 and an FP16 variant alike."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from trtflow.errors import StageError
from trtflow.pipelines.params.validate import LabelsSpec, ValidateStage
from trtflow.stages.compare.label_boxes import coco_map, read_coco
from trtflow.stages.image import preprocess
from trtflow.stages.image.steps import Frame

ROOT = Path(__file__).resolve().parents[1]
DET = ROOT / "examples" / "ppocr-det" / "models" / "ch_PP-OCRv4_det_infer.onnx"
PHOTOS = sorted((ROOT / "examples" / "squeezenet-cls" / "data").glob("*.[pj][np]g"))
WORDS = ["engine", "Triton", "calibrate", "release", "profile", "model card", "FP16", "INT8", "validate",
         "benchmark", "parity", "shapes"]


def rendered_scenes(out: Path, n: int = 6) -> tuple[list[Path], Path, Path]:
    """`n` 360x480 crops of real photos, three words each drawn at known places (DejaVu Sans, 30-40 px, on a
    plain band so they read), their COCO instances file (category 1, "text") and a mask per scene (1 on every
    word's box, 0 elsewhere)."""
    import matplotlib
    from PIL import Image, ImageDraw, ImageFont

    fonts = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    rng = np.random.default_rng(7)
    images, boxes = [], []
    (out / "masks").mkdir(parents=True)
    for i in range(n):
        photo = Image.open(PHOTOS[i % len(PHOTOS)]).convert("RGB")
        left = int(rng.integers(0, max(1, photo.width - 480)))
        top = int(rng.integers(0, max(1, photo.height - 360)))
        img = photo.crop((left, top, left + 480, top + 360))
        draw = ImageDraw.Draw(img)
        mask = np.zeros((360, 480), np.uint8)
        for j in range(3):
            font = ImageFont.truetype(str(fonts), int(rng.integers(30, 41)))
            word = WORDS[int(rng.integers(len(WORDS)))]
            x, y = int(rng.integers(10, 200)), 20 + 110 * j + int(rng.integers(0, 30))
            x1, y1, x2, y2 = draw.textbbox((x, y), word, font=font)
            draw.rectangle((x1 - 8, y1 - 8, x2 + 8, y2 + 8), fill=(245, 245, 235))
            draw.text((x, y), word, font=font, fill=(20, 20, 20))
            boxes.append({"image_id": i + 1, "category_id": 1, "bbox": [x1, y1, x2 - x1, y2 - y1]})
            mask[y1:y2, x1:x2] = 1
        images.append(out / f"scene{i:02d}.png")
        img.save(images[-1])
        cv2.imwrite(str(out / "masks" / f"scene{i:02d}.png"), mask)
    coco = {"images": [{"id": i + 1, "file_name": p.name, "width": 480, "height": 360} for i, p in enumerate(images)],
            "annotations": boxes, "categories": [{"id": 1, "name": "text"}]}
    (out / "instances.json").write_text(json.dumps(coco))
    return images, out / "instances.json", out / "masks"


def test_a_frame_takes_boxes_and_maps_back_through_the_steps():
    """A marked rectangle through letterbox, resize+centre crop, resize+pad and crop+resize: the frame says where
    it lands (boxes back to the image within a pixel), and its matrix warps the image as the steps do."""
    img = np.zeros((480, 640, 3), np.uint8)
    img[100:200, 150:400] = 255
    for steps in ([{"letterbox": {"size": [416, 416], "pad": 0}}],
                  [{"resize": {"shorter": 256}}, {"center_crop": 224}],
                  [{"resize": {"height": 48, "max_width": 320}}, {"pad": {"size": [48, 320], "place": "center"}}],
                  [{"crop": {"top": 10, "left": 20, "height": 300, "width": 400}}, {"resize": {"size": [150, 200]}}]):
        pre = preprocess.Preprocessor(preprocess.canonical([{"read": "rgb"}, *steps]))
        out = pre.run(img)
        frame = Frame.of(pre.steps[1:], 480, 640)
        assert (frame.height, frame.width, frame.image) == (*out.shape[:2], (480, 640))
        ys, xs = np.nonzero(out[:, :, 0] > 127)
        back = frame.back(np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], float))[0]
        assert np.abs(back - [150, 100, 400, 200]).max() <= 1.5 / min(frame.sx, frame.sy), (steps, back)
        warped = cv2.warpAffine(img, frame.matrix(), (frame.width, frame.height), flags=cv2.INTER_NEAREST)
        assert np.mean(np.abs(warped.astype(int) - out.astype(int)) > 127) < 0.01, steps


def test_coco_labels_are_read_strictly_and_scored_by_pycocotools(tmp_path):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png"}, {"id": 2, "file_name": "b.png"}],
                                "annotations": [{"image_id": 1, "category_id": 3, "bbox": [10, 10, 20, 20]},
                                                {"image_id": 2, "category_id": 3, "bbox": [0, 0, 50, 40]}],
                                "categories": [{"id": 3, "name": "cat"}]}))
    coco = read_coco(path, "validate: labels.file")
    exact = [{"image_id": 1, "category_id": 3, "bbox": [10, 10, 20, 20], "score": 0.9},
             {"image_id": 2, "category_id": 3, "bbox": [0, 0, 50, 40], "score": 0.8}]
    assert coco_map(coco, exact, [1, 2]) == {"map": pytest.approx(1.0), "map50": pytest.approx(1.0)}
    # one box found half off (IoU 1/3) and a false positive ranked first: half the boxes at every threshold
    off = [dict(exact[0], bbox=[20, 10, 20, 20]), exact[1], dict(exact[1], image_id=1, score=0.95)]
    got = coco_map(coco, off, [1, 2])
    assert got["map50"] < 0.6 and got["map"] < got["map50"] + 1e-9, got
    assert coco_map(coco, [], [1, 2]) == {"map": 0.0, "map50": 0.0}
    path.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png"}],
                                "annotations": [{"image_id": 1, "category_id": 3, "bbox": [10, 10, 20]}],
                                "categories": [{"id": 3}]}))
    with pytest.raises(StageError, match=r"validate: labels.file: instances.json: annotations.0.bbox: \[10.0, 10.0, "
                                         r"20.0\] is not \[x, y, width, height\]: .*\(a COCO instances file"):
        read_coco(path, "validate: labels.file")
    path.write_text(json.dumps({"images": [], "annotations": [{"image_id": 1, "category_id": 4, "bbox": [0, 0, 1, 1]}],
                                "categories": [{"id": 3}]}))
    with pytest.raises(StageError, match="has category_id 4, which categories does not list"):
        read_coco(path, "validate: labels.file")


def test_labels_take_one_kind():
    with pytest.raises(ValueError, match="give one of text, boxes or masks, not boxes and masks"):
        LabelsSpec.model_validate({"file": "x", "output": "y", "boxes": {}, "masks": {}})
    with pytest.raises(ValueError, match="classes and k are for class labels, not with boxes"):
        LabelsSpec.model_validate({"file": "x", "output": "y", "boxes": {}, "k": 3})
    spec = ValidateStage.model_validate({"kind": "validate", "data": {"images": "*.png"}, "labels": {
        "file": "i.json", "output": "y", "boxes": {"decode": "mypkg.heads:boxes"}}})
    assert "mypkg.heads:boxes (a function of yours)" in spec.executes()


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    return rendered_scenes(tmp_path_factory.mktemp("scenes"))


def _validate(tmp_path: Path, scenes, labels: dict, name: str):
    from tests.test_labels import fp16_beside
    from tests.test_validate_stage import run_stage
    from trtflow.artifact import Artifact
    from trtflow.stages.validate import stage as validate

    images, instances, masks = scenes
    # the scenes are 360x480; the detector is fed 320x320 letterboxed (pad 0 after normalizing: black)
    steps = [{"read": "bgr"}, {"letterbox": {"size": [320, 320], "pad": 0}}, {"scale": "1/255"},
             {"normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}, {"layout": "chw"},
             {"batch": True}]
    regions = {"sigmoid_0.tmp_0": {"map_iou": {"threshold": 0.3}}}
    inputs, reference, half = fp16_beside(tmp_path, DET, images, steps, regions)
    files = [Artifact(m, "file", m.name) for m in sorted(masks.glob("*.png"))] if "masks" in labels else \
        [Artifact(instances, "file", "labels")]
    result = run_stage(validate, ValidateStage, tmp_path / name,
                       {"reference": reference, "models": [half], "labels": files, **inputs},
                       data={"images": "*.png"}, metrics=regions, labels={"output": "sigmoid_0.tmp_0", **labels})
    return json.loads(result.outputs["report"].read_text()), result


@pytest.mark.slow
def test_a_text_detector_is_scored_against_its_boxes(tmp_path, scenes):
    """FP32's boxes (db_boxes, taken back through the letterbox) find every rendered word at IoU 0.5 (mAP@0.5:0.95
    is lower: DB's grown regions are not the font's boxes), and the FP16 variant's within 5 points of it."""
    report, result = _validate(tmp_path, scenes, {"file": "instances.json",
                                                  "boxes": {"decode": "trtflow.stages.image.paddleocr:db_boxes"}},
                               "boxes")
    fp32 = report["labelled"]
    assert fp32["samples"] == 6 and fp32["main"] == "map", fp32
    assert fp32["values"]["map50"] >= 0.9 and fp32["values"]["map"] >= 0.35, fp32
    half = report["candidates"][0]["labelled"]["values"]
    assert abs(half["map50"] - fp32["values"]["map50"]) <= 0.05, (half, fp32)
    assert "against the labels" in result.summary and "map50" in result.summary


@pytest.mark.slow
def test_a_text_detector_is_scored_against_its_masks(tmp_path, scenes):
    """The probability map above PaddleOCR's 0.3, taken back through the letterbox onto each scene's mask: the
    text class's IoU well above chance and FP16's within 2 points of FP32's."""
    report, _ = _validate(tmp_path, scenes, {"file": "masks/*.png", "masks": {"threshold": 0.3}}, "masks")
    fp32 = report["labelled"]
    assert fp32["samples"] == 6 and fp32["main"] == "miou", fp32
    assert fp32["values"]["miou"] >= 0.6 and fp32["values"]["pixel_accuracy"] >= 0.9, fp32
    half = report["candidates"][0]["labelled"]["values"]
    assert abs(half["miou"] - fp32["values"]["miou"]) <= 0.02, (half, fp32)


def test_boxes_are_scored_where_the_labels_drew_them(scenes):
    """The same detections scored with the preprocessing's frame and without it (left in the letterboxed tensor's
    pixels): only the first finds the words."""
    from trtflow.metrics.builtin.detections import BoxDecoder
    from trtflow.stages.compare.label_boxes import BoxTally
    from trtflow.stages.compare.labels import Scored
    from trtflow.stages.image.paddleocr import db_boxes
    from trtflow.stages.ort.runner import run, session

    images, instances, _ = scenes
    pre = preprocess.Preprocessor(preprocess.canonical([
        {"read": "bgr"}, {"letterbox": {"size": [320, 320], "pad": 0}}, {"scale": "1/255"},
        {"normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}, {"layout": "chw"},
        {"batch": True}]))
    sess = session(DET)
    coco = read_coco(instances, "labels")
    decoder = BoxDecoder(decoder=db_boxes, decoder_ref="db_boxes", score_threshold=0.001, nms_iou=0.6,
                         max_detections=100)
    tallies = {placed: BoxTally("sigmoid_0.tmp_0", coco, decoder, [], "labels") for placed in (True, False)}
    for path in images:
        feed = {"x": pre(path)}
        outputs = run(sess, feed)
        for placed, tally in tallies.items():
            tally.add(Scored(outputs, feed, [path], pre if placed else None))
    assert tallies[True].result().values["map50"] >= 0.9
    assert tallies[False].result().values["map50"] <= 0.2, tallies[False].result()


def test_masks_that_cannot_be_scored_are_refused_by_name(tmp_path):
    from trtflow.stages.compare.label_masks import MaskTally, mask_files
    from trtflow.stages.compare.labels import Scored

    (tmp_path / "a.png").write_bytes(b"")
    cv2.imwrite(str(tmp_path / "a-mask.png"), np.zeros((4, 4), np.uint8))
    with pytest.raises(StageError, match=r"labels.file: 1 sample file\(s\) have no mask of their name \(a.png\)"):
        mask_files([tmp_path / "a-mask.png"], ["a.png"], "labels.file")
    masks = tmp_path / "masks"
    masks.mkdir()
    logits = np.zeros((1, 3, 4, 4), np.float32)
    logits[:, 2, :2] = 1  # class 2 on the top half, class 0 below
    for mask, error in ((np.full((4, 4), 2, np.uint8), None), (np.zeros((4, 4, 3), np.uint8), "has 3 channels"),
                        (np.full((4, 4), 7, np.uint8), "holds class 7; the output has 3 classes"),
                        (np.zeros((5, 4), np.uint8), "a.png is 5x4, the output's map 4x4")):
        cv2.imwrite(str(masks / "a.png"), mask)
        tally = MaskTally("y", {"a.png": masks / "a.png"}, 1, None, 255, "validate: labels.masks")
        if error is None:
            tally.add(Scored({"y": logits}, {}, [tmp_path / "a.png"]))
            assert tally.result().values == {"miou": 0.25, "pixel_accuracy": 0.5}  # class 2: 8 of 16; class 0: 0
            continue
        with pytest.raises(StageError, match=error):
            tally.add(Scored({"y": logits}, {}, [tmp_path / "a.png"]))
