"""Throughput of the declared preprocessing (stages/image/preprocess.py) against hand-written OpenCV of the same steps.

Both read the example photos from disk (decode included), resize the shorter side to 256, center-crop 224,
scale, normalize, and lay out CHW with a batch dimension. Measured in the same run, alternating, best of N
rounds. Also shown: the antialiased (PIL-exact) resize the squeezenet example declares, and torchvision's own
transforms on PIL, for scale. Then the parity diagnosis of two planted mistakes at once (stages/parity/diagnosis.py),
timed on the PP-OCR example's text lines against PaddleOCR's own preprocessing and on the squeezenet photos
against torchvision's: what a user waits for when parity fails.

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


def diagnosis_cases() -> list[tuple[str, list, list, object, dict]]:
    """(case, planted deploy steps, images, training reference, tolerances): two mistakes in an example's
    declaration."""
    import copy

    import yaml

    from trtflow.stages.image.paddleocr import cls_resize_norm_img

    ppocr = yaml.safe_load((ROOT / "examples" / "ppocr-cls" / "pipeline.yaml").read_text())["stages"]["parity"]
    lines = sorted((ROOT / "examples" / "ppocr-cls" / "data").glob("*.png"))
    cases = []
    for name, plant in (("ppocr-cls: read: rgb + no scale: 1/255", lambda s: (s.__setitem__(0, {"read": "rgb"}),
                                                                              s.pop(2))),
                        ("ppocr-cls: plain resize [48, 192] + pad value -1",
                         lambda s: (s.__setitem__(1, {"resize": {"size": [48, 192]}}),
                                    s.__setitem__(5, {"pad": {"size": [48, 192], "value": -1}})))):
        steps = copy.deepcopy(ppocr["deploy"])
        plant(steps)
        cases.append((name, steps, lines, cls_resize_norm_img, {**ppocr["tolerances"], "min_psnr": None}))
    try:
        tv = torchvision_pil()
    except ImportError:
        return cases
    squeeze = [{"read": "bgr"}, {"resize": {"shorter": 256, "interp": "cubic"}}, {"center_crop": 224},
               {"scale": 1 / 255}, {"normalize": {"mean": MEAN.tolist(), "std": STD.tolist()}}, {"layout": "chw"},
               {"batch": True}]
    cases.append(("squeezenet-cls: read: bgr + interp: cubic, antialias: false", squeeze, PHOTOS,
                  lambda p: tv(p)[0], {"max_abs": 0.02, "mean_abs": 0.001, "min_psnr": None}))
    return cases


def diagnosis_table(rounds: int) -> Table:
    from trtflow.pipelines.params.parity import ParityTolerances, PreprocessStep
    from trtflow.stages.parity import diagnosis

    table = Table(title=f"parity diagnosis of two planted mistakes (at most {diagnosis.ROUNDS} rounds, "
                        f"{diagnosis.BEAM} kept per round; best of {rounds})", title_justify="left")
    for col in ("case", "images", "sets of steps run", "seconds", "x one check", "fix found"):
        table.add_column(col, justify="left" if col in ("case", "fix found") else "right")
    for name, steps, images, reference, tol in diagnosis_cases():
        steps = canonical([PreprocessStep.model_validate(s) for s in steps])
        pre = Preprocessor(steps)
        pairs = [(p, reference(p)) for p in images]
        worst = sorted(pairs, key=lambda pt: -diagnosis.pixel_metrics(pre(pt[0]), pt[1]).mean_abs)
        samples = worst[:4]  # as the stage: the search runs on the 4 worst images
        check = []  # baseline: one parity check of the same images (the declared steps, compared with training)
        for _ in range(rounds):
            t0 = time.perf_counter()
            for path, ref in samples:
                diagnosis.pixel_metrics(Preprocessor(steps)(path), ref)
            check.append(time.perf_counter() - t0)
        best = None
        for _ in range(rounds):
            result = diagnosis.diagnose(steps, samples, ParityTolerances.model_validate(tol))
            best = result if best is None or result.search.seconds < best.search.seconds else best
        seconds = best.search.seconds
        table.add_row(name, str(len(samples)), str(best.search.evaluations), f"{seconds:.2f}",
                      f"{seconds / min(check):.0f}", best.fix or "none")
    return table


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
    console = Console(width=160)
    console.print(table)
    console.print(diagnosis_table(min(args.rounds, 3)))


if __name__ == "__main__":
    main()
