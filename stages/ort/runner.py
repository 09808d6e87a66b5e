"""Run ONNX models with ONNX Runtime on CPU and compare their outputs (a runner and a comparator, kept apart)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

RUNTIME = "onnxruntime-cpu"
DEFAULT_DYNAMIC = 64  # size used for a dynamic non-batch dimension when no shape is given


def session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # compare the model as written: ORT's own graph rewrites would hide differences between two models
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
            "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
            "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def concrete_shape(name: str, shape: list[Any], given: dict[str, list[int]]) -> list[int]:
    if name in given:
        return list(given[name])
    return [d if isinstance(d, int) and d > 0 else (1 if axis == 0 else DEFAULT_DYNAMIC)
            for axis, d in enumerate(shape)]


def random_input(inp: Any, given: dict[str, list[int]], rng: np.random.Generator) -> np.ndarray:
    """Random data for one session input (normal floats, small integers, booleans)."""
    shape = concrete_shape(inp.name, list(inp.shape), given)
    dtype = NP_TYPES.get(inp.type)
    if dtype is None:
        raise ValueError(f"input '{inp.name}' has type {inp.type}, which random inputs do not cover")
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    return rng.integers(0, 8, shape).astype(dtype)


def random_feeds(sess, given: dict[str, list[int]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {inp.name: random_input(inp, given, rng) for inp in sess.get_inputs()}


def fit_to_input(x: np.ndarray, inp: Any) -> np.ndarray | None:
    """`x` with leading batch dimensions added and the input's dtype, or None if its shape cannot fit."""
    want = list(inp.shape)
    while x.ndim < len(want):
        x = x[None]
    if x.ndim != len(want) or any(isinstance(w, int) and w > 0 and w != s for w, s in zip(want, x.shape)):
        return None
    return x.astype(NP_TYPES.get(inp.type, np.float32))


def run(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def compare(ref: dict[str, np.ndarray], got: dict[str, np.ndarray], rtol: float, atol: float) -> dict[str, Any]:
    """Per output: max absolute and relative difference, and whether all elements are within atol + rtol*|ref|."""
    per_output = {}
    ok = True
    for name, r in ref.items():
        if name not in got:
            per_output[name] = {"ok": False, "error": "missing output"}
            ok = False
            continue
        g = got[name]
        if r.shape != g.shape:
            per_output[name] = {"ok": False, "error": f"shape {list(g.shape)} != {list(r.shape)}"}
            ok = False
            continue
        r64, g64 = r.astype(np.float64), g.astype(np.float64)
        diff = np.abs(r64 - g64)
        finite = np.isfinite(r64) & np.isfinite(g64)
        nan_mismatch = int(np.count_nonzero(np.isnan(r64) != np.isnan(g64)))
        rel = diff / np.maximum(np.abs(r64), 1e-12)
        within = bool(np.all(diff[finite] <= atol + rtol * np.abs(r64[finite]))) and nan_mismatch == 0
        per_output[name] = {"ok": within, "max_abs": float(diff[finite].max(initial=0.0)),
                            "max_rel": float(rel[finite].max(initial=0.0)), "nan_mismatch": nan_mismatch}
        ok &= within
    return {"ok": ok, "outputs": per_output}


def compare_models(ref_path: Path, new_path: Path, samples: int, rtol: float, atol: float, seed: int,
                   shapes: dict[str, list[int]]) -> dict[str, Any]:
    """Both models on the same random inputs; the worst difference per output over all samples."""
    ref_sess, new_sess = session(ref_path), session(new_path)
    rng = np.random.default_rng(seed)
    worst: dict[str, Any] = {"ok": True, "outputs": {}, "samples": samples, "rtol": rtol, "atol": atol,
                             "runtime": RUNTIME}
    for _ in range(samples):
        feeds = random_feeds(ref_sess, shapes, rng)
        worst["input_shapes"] = {k: list(v.shape) for k, v in feeds.items()}
        result = compare(run(ref_sess, feeds), run(new_sess, feeds), rtol, atol)
        worst["ok"] &= result["ok"]
        for name, r in result["outputs"].items():
            prev = worst["outputs"].get(name)
            if prev is None or not r["ok"] or r.get("max_abs", 0) > prev.get("max_abs", 0):
                if prev is None or prev.get("ok", True):
                    worst["outputs"][name] = r
    return worst
