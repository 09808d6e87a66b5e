"""Why deploy and training preprocessing differ: try the usual single causes and keep the one that agrees.

Each candidate is one change to the declared deploy steps (swap R/B, another interpolation, x255 or /255,
mean/std on the other scale, layout, crop/resize order, antialiasing). The fix is shown as the YAML to paste.
"""
from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any, Iterator

import numpy as np
import yaml

from trtflow.stages.image.preprocess import INTERP

Steps = list[dict[str, Any]]


def align(deploy: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop leading batch dimensions of size 1 so the two can be compared."""
    while deploy.ndim > train.ndim and deploy.shape[0] == 1:
        deploy = deploy[0]
    while train.ndim > deploy.ndim and train.shape[0] == 1:
        train = train[0]
    return deploy, train


def pixel_metrics(deploy: np.ndarray, train: np.ndarray) -> dict[str, Any]:
    d, t = align(np.asarray(deploy, np.float64), np.asarray(train, np.float64))
    if d.shape != t.shape:
        return {"shape_ok": False, "deploy_shape": list(d.shape), "training_shape": list(t.shape),
                "max_abs": float("inf"), "mean_abs": float("inf"), "psnr": 0.0}
    diff = np.abs(d - t)
    mse = float(np.mean(diff ** 2))
    data_range = float(t.max() - t.min()) or 1.0
    psnr = float("inf") if mse == 0 else 10 * np.log10(data_range ** 2 / mse)
    return {"shape_ok": True, "shape": list(d.shape), "max_abs": float(diff.max()),
            "mean_abs": float(diff.mean()), "psnr": psnr}


def passes(m: dict[str, Any], tol: dict[str, Any]) -> bool:
    """Whether one image's metrics are within the tolerances (as `ParityTolerances.model_dump()`)."""
    if not m["shape_ok"]:
        return False
    ok = m["max_abs"] <= tol["max_abs"] and m["mean_abs"] <= tol["mean_abs"]
    if tol.get("min_psnr") is not None:
        ok &= m["psnr"] >= tol["min_psnr"]
    return ok


def _replace(steps: Steps, i: int, step: dict[str, Any]) -> Steps:
    out = copy.deepcopy(steps)
    out[i] = step
    return out


def candidates(steps: Steps) -> Iterator[tuple[str, str, Steps]]:
    """(cause, fix, changed steps) for every single change worth trying."""
    names = [next(iter(s)) for s in steps]
    for i, step in enumerate(steps):
        (name, val), = step.items()
        if name == "read" and val["color"] in ("rgb", "bgr"):
            other = "bgr" if val["color"] == "rgb" else "rgb"
            yield ("R and B swapped", f"read: {other}", _replace(steps, i, {"read": {**val, "color": other}}))
        if name in ("resize", "letterbox"):
            for interp in INTERP:
                if interp != val.get("interp", "linear"):
                    yield (f"{name} interpolation differs", f"{name} with interp: {interp}",
                           _replace(steps, i, {name: {**val, "interp": interp}}))
        if name == "resize":
            aa = bool(val.get("antialias"))
            yield ("antialiasing differs", f"resize with antialias: {str(not aa).lower()}",
                   _replace(steps, i, {"resize": {**val, "antialias": not aa}}))
        if name == "scale":
            yield ("pixel scale differs (x255)", f"scale: {_num(val * 255)}", _replace(steps, i, {"scale": val * 255}))
            yield ("pixel scale differs (/255)", f"scale: {_num(val / 255)}", _replace(steps, i, {"scale": val / 255}))
            yield ("pixel scale differs", "remove the scale step", steps[:i] + steps[i + 1:])
        if name == "normalize":
            for factor, label in ((255.0, "x255"), (1 / 255.0, "/255")):
                fixed = {"mean": [m * factor for m in val["mean"]], "std": [s * factor for s in val["std"]]}
                yield (f"mean/std on the other scale ({label})",
                       f"normalize: {{mean: {_short(fixed['mean'])}, std: {_short(fixed['std'])}}}",
                       _replace(steps, i, {"normalize": fixed}))
        if name == "layout":
            other = "hwc" if val == "chw" else "chw"
            yield ("layout differs", f"layout: {other}", _replace(steps, i, {"layout": other}))
        if i + 1 < len(steps) and name in ("resize", "center_crop", "crop") \
                and names[i + 1] in ("resize", "center_crop", "crop") and names[i + 1] != name:
            swapped = copy.deepcopy(steps)
            swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
            yield ("crop and resize in the other order", f"{names[i + 1]} before {name}", swapped)
    if "scale" not in names:
        at = names.index("normalize") if "normalize" in names else len(steps)
        yield ("pixels not scaled to 0..1", "add scale: 1/255", steps[:at] + [{"scale": 1 / 255}] + steps[at:])
    if "layout" not in names:
        at = names.index("batch") if "batch" in names else len(steps)
        yield ("layout differs", "add layout: chw", steps[:at] + [{"layout": "chw"}] + steps[at:])


def diagnose(steps: Steps, samples: list[tuple[Any, np.ndarray]], tol: dict[str, Any]) -> dict[str, Any]:
    """Try every candidate on the worst samples; the best one that passes is the diagnosis."""
    from trtflow.errors import StageError
    from trtflow.stages.image.preprocess import Preprocessor

    tried = []
    for cause, fix, changed in candidates(steps):
        try:
            pre = Preprocessor(changed)
            metrics = [pixel_metrics(pre(path), train) for path, train in samples]
        except StageError as exc:  # e.g. a crop larger than the image after the change
            tried.append({"cause": cause, "fix": fix, "ok": False, "error": str(exc)})
            continue
        worst = max(metrics, key=lambda m: m["mean_abs"])
        tried.append({"cause": cause, "fix": fix, "ok": all(passes(m, tol) for m in metrics),
                      "mean_abs": worst["mean_abs"], "max_abs": worst["max_abs"], "steps": changed,
                      "conventional": _conventional(changed)})
    # Scaling pixels by 1/255 and scaling mean/std by 255 can be equally exact fixes: prefer the one that
    # leaves the usual convention (pixels in 0..1, mean/std on that scale), which is what training code does.
    tried.sort(key=lambda t: (not t["ok"], round(t.get("mean_abs", float("inf")), 6), not t.get("conventional")))
    best = tried[0] if tried and tried[0]["ok"] else None
    result: dict[str, Any] = {"tried": [{k: v for k, v in t.items() if k not in ("steps", "conventional")}
                                        for t in tried]}
    if best:
        result.update({"cause": best["cause"], "fix": best["fix"], "yaml": to_yaml(best["steps"])})
    return result


def _conventional(steps: Steps) -> bool:
    scale = next((s["scale"] for s in steps if "scale" in s), None)
    norm = next((s["normalize"] for s in steps if "normalize" in s), None)
    scaled = scale is not None and abs(scale - 1 / 255) < 1e-9
    return scaled and (norm is None or all(0 <= m <= 1 for m in norm["mean"]))


def _num(x: float) -> str:
    f = Fraction(x).limit_denominator(1000)
    if abs(float(f) - x) < 1e-9 and f.denominator != 1:
        return f"{f.numerator}/{f.denominator}"
    return f"{x:g}"


def _short(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def friendly(steps: Steps) -> list[dict[str, Any]]:
    """Canonical steps back in the form people write them."""
    out = []
    for step in steps:
        (name, val), = step.items()
        if name == "read" and val.get("depth", 8) == 8:
            val = val["color"]
        elif name == "scale":
            val = _num(val)
        elif name == "center_crop" and isinstance(val, list) and val[0] == val[1]:
            val = val[0]
        elif name == "normalize":
            val = {k: [round(v, 6) for v in vs] for k, vs in val.items()}
        elif isinstance(val, dict):
            val = {k: v for k, v in val.items() if not (k == "antialias" and v is False)}
        out.append({name: val})
    return out


def to_yaml(steps: Steps) -> str:
    return yaml.safe_dump({"deploy": friendly(steps)}, default_flow_style=None, sort_keys=False, width=120)
