"""PaddleOCR's own preprocessing of its text-direction classifier, as a parity training reference:
`training: {callable: trtflow.stages.image.paddleocr:cls_resize_norm_img}`.

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


def cls_resize_norm_img(path: str) -> np.ndarray:
    """Image file -> the classifier's input for it, as PaddleOCR computes it (training reference for parity)."""
    img = cv2.imread(str(path))
    if img is None:
        raise ValueError(f"cv2.imread cannot read {path}")
    return resize_norm_img(img)
