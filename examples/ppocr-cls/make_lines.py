"""Makes the example's text-line images from real photos: lines of printed text cut from scikit-image's `page`
(a scanned page of printed text), printed in coloured ink over crops of scikit-image's colour photos (so that R and B
matter), half of them turned by 180 degrees (what the classifier tells apart). Deterministic; the PNGs it writes are
checked in (nothing is downloaded; running it needs scikit-image).

    python examples/ppocr-cls/make_lines.py
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from skimage import data

OUT = Path(__file__).resolve().parent / "data"

# (name, rows, columns of `page`, background photo, its top-left, ink colour in BGR, turned by 180 degrees)
LINES = [
    ("region-based", (6, 38), (0, 140), "coffee", (20, 40), (140, 40, 20), False),
    ("segmentation", (6, 38), (140, 300), "chelsea", (10, 10), (20, 20, 150), True),
    ("based", (6, 38), (80, 140), "astronaut", (20, 300), (20, 20, 20), True),
    ("determine-markers", (46, 68), (105, 300), "rocket", (20, 300), (120, 20, 110), True),
    ("of-the", (46, 68), (200, 280), "astronaut", (300, 20), (30, 110, 20), False),
    ("unambiguously", (85, 105), (0, 180), "chelsea", (200, 250), (150, 60, 20), True),
    ("object", (84, 106), (175, 260), "coffee", (20, 300), (20, 60, 140), False),
    ("grey", (120, 143), (90, 160), "rocket", (300, 100), (110, 40, 40), False),
]


def line_image(rows, cols, photo: str, at, ink, turned: bool) -> np.ndarray:
    gray = data.page()[rows[0]:rows[1], cols[0]:cols[1]].astype(np.float32)
    paper, dark = np.percentile(gray, 90), np.percentile(gray, 3)
    alpha = np.clip((paper - gray) / max(paper - dark, 1.0), 0.0, 1.0)[:, :, None]
    h, w = gray.shape
    rgb = getattr(data, photo)()
    bg = cv2.cvtColor(rgb[at[0]:at[0] + h, at[1]:at[1] + w], cv2.COLOR_RGB2BGR).astype(np.float32)
    bg = 0.45 * bg + 0.55 * 255.0  # a pale print of the photo, so the ink stays readable
    out = bg * (1.0 - alpha) + np.asarray(ink, np.float32) * alpha
    out = np.clip(np.round(out), 0, 255).astype(np.uint8)
    return cv2.rotate(out, cv2.ROTATE_180) if turned else out


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for i, (name, rows, cols, photo, at, ink, turned) in enumerate(LINES, 1):
        path = OUT / f"{i:02d}-{name}-{180 if turned else 0}.png"
        cv2.imwrite(str(path), line_image(rows, cols, photo, at, ink, turned))
        print(path.name)


if __name__ == "__main__":
    main()
