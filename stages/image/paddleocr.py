"""PaddleOCR's own preprocessing of its text-direction classifier and text recognizer, as parity training
references: `training: {callable: trtflow.stages.image.paddleocr:cls_resize_norm_img}` (or `rec_resize_norm_img`,
`det_norm_img`); and the text detector's box post-processing, as a detections decoder (`db_boxes`).

A line-for-line re-implementation (PaddleOCR is not a dependency) of `resize_norm_img` as PaddleOCR runs it for
the classifier, in training (`ppocr/data/imaug/rec_img_aug.py`: `ClsResizeImg` calls `resize_norm_img(img,
image_shape)` with padding) and at inference (`tools/infer/predict_cls.py`: `TextClassifier.resize_norm_img`), and as
RapidOCR 1.4.4 ships it (`rapidocr_onnxruntime/ch_ppocr_cls/text_cls.py`, the wheel the example's model comes from;
tests/test_parity_ppocr.py compares the two where that package is installed). Image shape [3, 48, 192]; images are
read as PaddleOCR reads them, `cv2.imread` (BGR).
"""
from __future__ import annotations

import math

import cv2
import numpy as np

CLS_IMAGE_SHAPE = (3, 48, 192)
REC_IMAGE_SHAPE = (3, 48, 320)  # the recognizer's training shape (PP-OCRv4 rec: RecResizeImg, image_shape [3, 48, 320])


def resize_norm_img(img: np.ndarray, image_shape: tuple[int, int, int] = CLS_IMAGE_SHAPE) -> np.ndarray:
    """HxWxC uint8 (BGR) -> CxHxW float32: height to imgH, width ceil(imgH * w / h) up to imgW (wider lines are
    squeezed), /255, -0.5, /0.5, then zeros on the right up to imgW."""
    img_c, img_h, img_w = image_shape
    h, w = img.shape[:2]
    ratio = w / float(h)
    if math.ceil(img_h * ratio) > img_w:
        resized_w = img_w
    else:
        resized_w = int(math.ceil(img_h * ratio))
    resized_image = cv2.resize(img, (resized_w, img_h))
    resized_image = resized_image.astype("float32")
    if img_c == 1:
        resized_image = resized_image / 255
        resized_image = resized_image[np.newaxis, :]
    else:
        resized_image = resized_image.transpose((2, 0, 1)) / 255
    resized_image -= 0.5
    resized_image /= 0.5
    padding_im = np.zeros((img_c, img_h, img_w), dtype=np.float32)
    padding_im[:, :, 0:resized_w] = resized_image
    return padding_im


def _imread(path: str) -> np.ndarray:
    """The image as PaddleOCR reads it: `cv2.imread`, BGR."""
    img = cv2.imread(str(path))
    if img is None:
        raise ValueError(f"cv2.imread cannot read {path}")
    return img


def cls_resize_norm_img(path: str) -> np.ndarray:
    """Image file -> the classifier's input for it, as PaddleOCR computes it (training reference for parity)."""
    img = _imread(path)
    return resize_norm_img(img)


def rec_resize_norm_img(path: str) -> np.ndarray:
    """Image file -> the text recognizer's input for it at its training shape [3, 48, 320], as PaddleOCR's
    `RecResizeImg` computes it with padding (the same `resize_norm_img`)."""
    img = _imread(path)
    return resize_norm_img(img, REC_IMAGE_SHAPE)


DET_MEAN, DET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def det_norm_img(path: str) -> np.ndarray:
    """Image file -> the text detector's input for it, as PaddleOCR's `NormalizeImage` (scale 1/255, ImageNet mean
    and std, on the BGR image as read) and `ToCHWImage` compute it. `DetResizeForTest` is left out: it only rounds
    the sides to multiples of 32 for images already that size (the ppocr-det example's scenes are 256x256)."""
    img = _imread(path)
    if img.shape[0] % 32 or img.shape[1] % 32:
        raise ValueError(f"{path}: {img.shape[1]}x{img.shape[0]} is not a multiple of 32 (DetResizeForTest would "
                         f"resize it; this reference does not)")
    x = (img.astype(np.float32) / 255.0 - np.array(DET_MEAN, np.float32)) / np.array(DET_STD, np.float32)
    return x.transpose(2, 0, 1)


def db_boxes(outputs: dict[str, np.ndarray], feed: dict[str, np.ndarray], thresh: float = 0.3,
             box_thresh: float = 0.6, unclip_ratio: float = 1.5) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A detections decoder (`decode: trtflow.stages.image.paddleocr:db_boxes`) for PaddleOCR's DB text detector:
    its probability map [N, 1, H, W] into text boxes as `DBPostProcess` makes them (pixels above `thresh`, each
    region scored by its mean probability and kept above `box_thresh`, grown by area x `unclip_ratio` /
    perimeter), axis-aligned and in the input's pixels; one class (0)."""
    prob = next(iter(outputs.values()))  # the detector's one output
    x = next(iter(feed.values()))
    out = []
    for image in prob.reshape(prob.shape[0], prob.shape[-2], prob.shape[-1]):
        image = np.nan_to_num(image.astype(np.float32))
        fy, fx = x.shape[-2] / image.shape[0], x.shape[-1] / image.shape[1]
        contours, _ = cv2.findContours((image > thresh).astype(np.uint8), cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
        boxes, scores = [], []
        for contour in contours:
            left, top, w, h = cv2.boundingRect(contour)
            if min(w, h) < 3:  # PaddleOCR's min_size
                continue
            region = np.zeros((h, w), np.uint8)
            cv2.fillPoly(region, [contour - [left, top]], 1)
            score = float(cv2.mean(image[top:top + h, left:left + w], region)[0])
            if score < box_thresh:
                continue
            area, length = cv2.contourArea(contour), cv2.arcLength(contour, True)
            grow = area * unclip_ratio / length if length else 0.0
            boxes.append([(left - grow) * fx, (top - grow) * fy, (left + w + grow) * fx, (top + h + grow) * fy])
            scores.append(score)
        out.append((np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(scores), np.zeros(len(scores))))
    return out
