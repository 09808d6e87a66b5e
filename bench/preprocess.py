"""Throughput of the declared preprocessing (stages/image/preprocess.py) against hand-written OpenCV of the same steps.

Both read the example photos from disk (decode included), resize the shorter side to 256, center-crop 224,
scale, normalize, and lay out CHW with a batch dimension. Measured in the same run, alternating, best of N
rounds. Also shown: the antialiased (PIL-exact) resize the squeezenet example declares, and torchvision's own
transforms on PIL, for scale.

    python bench/preprocess.py [--rounds 5] [--passes 10]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import cv2
import numpy as np
from rich.console import Console
from rich.table import Table

from trtflow.stages.image.preprocess import Preprocessor, canonical

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = sorted(p for p in (ROOT / "examples" / "squeezenet-cls" / "data").iterdir() if p.suffix in (".png", ".jpg"))
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def declared(antialias: bool) -> Preprocessor:
    return Preprocessor(canonical([
        {"read": "rgb"}, {"resize": {"shorter": 256, "interp": "linear", "antialias": antialias}},
        {"center_crop": 224}, {"scale": 1 / 255}, {"normalize": {"mean": MEAN.tolist(), "std": STD.tolist()}},
        {"layout": "chw"}, {"batch": True}]))


def hand_written(path: Path) -> np.ndarray:
    img = cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    h, w = img.shape[:2]
    nh, nw = (256, int(256 * w / h)) if h <= w else (int(256 * h / w), 256)
    img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    top, left = int(round((nh - 224) / 2.0)), int(round((nw - 224) / 2.0))
    img = img[top:top + 224, left:left + 224]
    x = (img.astype(np.float32) * np.float32(1 / 255) - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1))[None]


def torchvision_pil():
    from PIL import Image
    from torchvision import transforms as T
    tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN.tolist(), STD.tolist())])
    return lambda p: tf(Image.open(p).convert("RGB")).numpy()[None]


def rate(fn, passes: int) -> float:
    t0 = time.perf_counter()
    for _ in range(passes):
        for p in PHOTOS:
            fn(p)
    return passes * len(PHOTOS) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=10, help="passes over the photos per round")
    args = ap.parse_args()
    cv2.setNumThreads(1)  # one image at a time on one core, both sides alike

    fns = {"hand-written OpenCV (baseline)": hand_written, "declared, same steps": declared(False),
           "declared, antialias: true (PIL-exact)": declared(True)}
    try:
        fns["torchvision on PIL (training side)"] = torchvision_pil()
    except ImportError:
        pass
    np.testing.assert_allclose(fns["declared, same steps"](PHOTOS[0]), hand_written(PHOTOS[0]), atol=1e-6)
    best = {name: 0.0 for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            best[name] = max(best[name], rate(fn, args.passes))

    base = best["hand-written OpenCV (baseline)"]
    table = Table(title=f"preprocessing throughput, {len(PHOTOS)} photos (256..512 px), best of {args.rounds} rounds",
                  title_justify="left")
    for col in ("pipeline", "images/s", "x baseline"):
        table.add_column(col, justify="left" if col == "pipeline" else "right")
    for name, r in best.items():
        table.add_row(name, f"{r:.0f}", f"{r / base:.2f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
