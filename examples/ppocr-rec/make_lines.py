"""Makes text-line images for the PP-OCRv4 recognizer from real printed text: pieces of the lines of scikit-image's
`page` (a scanned page), printed in coloured ink over crops of its colour photos, as the ppocr-cls example does
(its `line_image`), upright. Deterministic; the PNGs it writes are checked in (running it needs scikit-image).

    python examples/ppocr-rec/make_lines.py
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import cv2

HERE = Path(__file__).resolve().parent
OUT = HERE / "data"
_spec = importlib.util.spec_from_file_location("cls_lines", HERE.parent / "ppocr-cls" / "make_lines.py")
cls_lines = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cls_lines)

ROWS = [(6, 38), (46, 68), (84, 106), (120, 143)]  # the page's printed lines
PIECES = [(0, 150), (90, 260), (200, 384), (0, 384), (140, 300), (40, 200), (260, 384), (60, 330)]
PHOTOS = ["coffee", "chelsea", "astronaut", "rocket"]
INKS = [(140, 40, 20), (20, 20, 150), (20, 20, 20), (120, 20, 110), (30, 110, 20), (150, 60, 20)]


def main() -> None:
    OUT.mkdir(exist_ok=True)
    n = 0
    for r, rows in enumerate(ROWS):
        for p, cols in enumerate(PIECES):
            n += 1
            photo, ink = PHOTOS[(r + p) % len(PHOTOS)], INKS[(r * 3 + p) % len(INKS)]
            img = cls_lines.line_image(rows, cols, photo, (10 + 7 * p, 10 + 11 * r), ink, False)
            cv2.imwrite(str(OUT / f"{n:02d}-row{r}-{cols[0]}-{cols[1]}.png"), img)
    print(f"{n} lines in {OUT}")


if __name__ == "__main__":
    main()
