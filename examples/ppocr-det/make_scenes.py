"""Makes scenes for the PP-OCRv4 text detector: 256x256 crops of the squeezenet example's real photos with two to
four of the ppocr-rec example's real printed text lines pasted on (some scaled), so the detector has real text to
find on real backgrounds. Deterministic; the JPEGs it writes are checked in.

    python examples/ppocr-det/make_scenes.py
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
PHOTOS = sorted((HERE.parent / "squeezenet-cls" / "data").glob("*.[pj][np]g"))
LINES = sorted((HERE.parent / "ppocr-rec" / "data").glob("*.png"))
OUT = HERE / "data"
SIZE = 256


def scene(rng: np.random.Generator) -> np.ndarray:
    photo = cv2.imread(str(PHOTOS[rng.integers(len(PHOTOS))]))
    h, w = photo.shape[:2]
    y, x = rng.integers(0, h - SIZE + 1), rng.integers(0, w - SIZE + 1)
    img = photo[y:y + SIZE, x:x + SIZE].copy()
    for _ in range(rng.integers(2, 5)):
        line = cv2.imread(str(LINES[rng.integers(len(LINES))]))
        scale = rng.uniform(0.7, 1.4)
        line = cv2.resize(line, (max(8, int(line.shape[1] * scale)), max(8, int(line.shape[0] * scale))))
        lh, lw = min(line.shape[0], SIZE), min(line.shape[1], SIZE)
        ty, tx = rng.integers(0, SIZE - lh + 1), rng.integers(0, SIZE - lw + 1)
        img[ty:ty + lh, tx:tx + lw] = line[:lh, :lw]
    return img


def main() -> None:
    OUT.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(16):
        cv2.imwrite(str(OUT / f"scene-{i:02d}.jpg"), scene(rng), [cv2.IMWRITE_JPEG_QUALITY, 92])
    print(f"16 scenes in {OUT}")


if __name__ == "__main__":
    main()
