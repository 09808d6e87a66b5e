"""Paths of the real models and photos the tests use (all in the repository; nothing is downloaded)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
PPOCR = EXAMPLES / "ppocr-cls" / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"  # PP-OCR's direction classifier
SQUEEZENET = EXAMPLES / "squeezenet-cls" / "models" / "squeezenet1_1.onnx"  # torchvision, ImageNet weights
PHOTOS = sorted(p for p in (EXAMPLES / "squeezenet-cls" / "data").iterdir() if p.suffix in (".png", ".jpg"))

# the usual ImageNet preprocessing, normalized as preprocess.save takes it (what the squeezenet example declares)
IMAGENET = [{"read": {"color": "rgb", "depth": 8}}, {"resize": {"shorter": 256, "antialias": True}},
            {"center_crop": [224, 224]}, {"scale": 1 / 255},
            {"normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}, {"layout": "chw"},
            {"batch": True}]
