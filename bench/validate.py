"""Cost of validate's localization and of `trtflow reduce`, on EfficientNet-B1 (341 nodes after simplification,
real photos) with an FP16 overflow planted in a mid-network projection conv.

Localization (every intermediate tensor of candidate and reference compared, one sample at a time) against one
plain reference pass per sample, and against the paired run alone (both models with every tensor exposed, which
any such comparison pays before reading a tensor), in the same run, each measured in a fresh process (its peak
RSS is its own), for a growing number of samples: the issue's bound is 3x the reference per sample, with the
peak memory flat.
Then `trtflow reduce` on three planted failures: nodes before and after, checks run, seconds.

    python bench/validate.py [--samples 4 16 64]      (models made under $TRTFLOW_ZOO, ~/.cache/trtflow-zoo)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import defects  # noqa: E402
import zoo_models  # noqa: E402

EFFNET = "cnn_efficientnet_b1"
PLANT = "/features/features.4/features.4.0/block/block.3/block.3.0/Conv"
console = Console(width=150)


def prepared(name: str, work: Path) -> tuple[Path, Path]:
    """The zoo model simplified, and the model localization runs on: EfficientNet-B1 with the planted overflow,
    any other zoo model as it is (its FP16 simulation is compared all the same)."""
    from trtflow.stages.onnx.simplifier import onnxsim

    simplify = onnxsim().simplify

    raw = zoo_models.MODELS / f"{name}.onnx"
    if not raw.exists():
        zoo_models.MODELS.mkdir(parents=True, exist_ok=True)
        zoo_models.DATA.mkdir(parents=True, exist_ok=True)
        zoo_models.BUILDERS[name]()
    model, _ = simplify(onnx.load(raw))
    clean = work / f"{name}.onnx"
    onnx.save(model, clean)
    if name != EFFNET:
        return clean, clean
    planted = work / "planted.onnx"
    onnx.save(defects.scale_weights(model, PLANT, 3e4), planted)
    return clean, planted


def samples(name: str) -> list[dict[str, np.ndarray]]:
    return [dict(np.load(f)) for f in sorted((zoo_models.DATA / name).glob("*.npz"))]


def feeds(base: list[dict[str, np.ndarray]], n: int):
    for i in range(n):  # the samples, then mirrored (float inputs), then again: no two neighbours alike
        flip = (i // len(base)) % 2
        yield {k: np.ascontiguousarray(v[..., ::-1]) if flip and v.dtype.kind == "f" else v
               for k, v in base[i % len(base)].items()}


def one(kind: str, model: Path, name: str, n: int, work: Path) -> dict:
    """One measurement, in this (fresh) process."""
    from trtflow.stages.onnx import fp16
    from trtflow.stages.onnx.fp16_emulation import emulate
    from trtflow.stages.ort import layerwise
    from trtflow.stages.ort.runner import session

    base = samples(name)
    reference = onnx.load(model)
    if kind == "reference":
        sess = session(model)
        sess.run(None, next(feeds(base, 1)))  # first run's allocations, as compare's sessions have them too
        t0 = time.perf_counter()
        for f in feeds(base, n):
            sess.run(None, f)
        result = {"seconds": time.perf_counter() - t0}
    elif kind == "paired":  # what any comparison of every tensor pays before reading one: both models run
        candidate = emulate(reference, fp16.plan(reference, {}, set()).half, True)
        _, run = layerwise.paired(reference, candidate, work)
        run(next(feeds(base, 1)))
        t0 = time.perf_counter()
        for f in feeds(base, n):
            run(f)
        result = {"seconds": time.perf_counter() - t0}
    else:
        candidate = emulate(reference, fp16.plan(reference, {}, set()).half, True)
        t0 = time.perf_counter()
        loc = layerwise.compare(reference, candidate, feeds(base, n), work, 0.999)
        result = {"seconds": time.perf_counter() - t0, "tensors": loc.tensors,
                  "first_bad": loc.first_bad.node if loc.first_bad else "-"}
    result["peak_mb"] = peak_rss_mb()
    return result


def peak_rss_mb() -> float:
    """This process's own peak RSS (VmHWM: ru_maxrss would include the parent's from before exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(kind: str, model: Path, name: str, n: int, work: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--one", kind, str(model), name, str(n), str(work)],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def reduce_cases(clean: Path, planted: Path, work: Path) -> list[dict]:
    from trtflow.stages.bisect import reduce as rd
    from trtflow.stages.trt.env import find_tensorrt

    data = [dict(f) for f in feeds(samples(EFFNET), 2)]
    model = onnx.load(clean)
    cases = [("fp16 overflow (weights x3e4)", onnx.load(planted), rd.fp16_check(0.999))]
    qdq_path = work / "qdq.onnx"
    defects.quantize(clean, qdq_path, samples(EFFNET))
    bad, _ = defects.ruin_input_range(onnx.load(qdq_path), PLANT, 2000)
    cases.append(("int8 range ruined (scale x2000)", model, rd.int8_check(0.9, bad)))
    if find_tensorrt() is not None:
        cases.append(("TensorRT parser rejects (Unique)", defects.insert_op(model, PLANT, "Unique"),
                      rd.tensorrt_check(build=False)))
    rows = []
    for name, m, check in cases:
        r = rd.reduce(m, check, data, work)
        rows.append({"case": name, "before": r.nodes_before, "after": len(r.nodes), "nodes": r.nodes,
                     "checks": r.checks, "seconds": r.seconds})
    return rows


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        kind, model, name, n, work = sys.argv[2:]
        print(json.dumps(one(kind, Path(model), name, int(n), Path(work))))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--models", nargs="+", default=[EFFNET], choices=sorted(zoo_models.BUILDERS),
                    help="zoo models to localize on (EfficientNet-B1 carries the planted overflow)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.models:
            localization_table(name, args.samples, work)
        clean, planted = prepared(EFFNET, work)
        rows = reduce_cases(clean, planted, work)
        t = Table(title="trtflow reduce (2 samples)", title_justify="left")
        for col in ("planted failure", "nodes before", "nodes after", "checks", "seconds", "reduced to"):
            t.add_column(col, justify="left" if col in ("planted failure", "reduced to") else "right")
        for r in rows:
            t.add_row(r["case"], str(r["before"]), str(r["after"]), str(r["checks"]), f"{r['seconds']:.1f}",
                      ", ".join(r["nodes"])[:90])
        console.print(t)


def localization_table(name: str, counts: list[int], work: Path) -> None:
    _, model = prepared(name, work)
    nodes = len(onnx.load(model).graph.node)
    table = Table(title=f"localization vs one reference pass per sample: {name}, {nodes} nodes, onnxruntime-cpu, "
                        "FP16 simulated", title_justify="left")
    for col in ("samples", "reference s", "paired run s", "localize s", "ratio", "reference peak MB",
                "localize peak MB", "first bad node"):
        table.add_column(col, justify="right" if col != "first bad node" else "left")
    rows = [(n, measure("reference", model, name, n, work), measure("paired", model, name, n, work),
             measure("localize", model, name, n, work)) for n in counts]
    for n, ref, pair, loc in rows:
        table.add_row(str(n), f"{ref['seconds']:.2f}", f"{pair['seconds']:.2f}", f"{loc['seconds']:.2f}",
                      f"{loc['seconds'] / ref['seconds']:.2f}x", f"{ref['peak_mb']:.0f}", f"{loc['peak_mb']:.0f}",
                      "/".join(loc["first_bad"].split("/")[-2:]))
    (n0, r0, p0, l0), (n1, r1, p1, l1) = rows[0], rows[-1]
    per_ref, per_pair, per_loc = ((b["seconds"] - a["seconds"]) / (n1 - n0) for a, b in ((r0, r1), (p0, p1), (l0, l1)))
    table.caption = (f"per added sample: reference {per_ref * 1000:.0f} ms; localization {per_loc * 1000:.0f} ms "
                     f"({per_loc / per_ref:.2f}x), of which the paired run alone (both models, every tensor exposed, "
                     f"no statistics) {per_pair * 1000:.0f} ms ({per_pair / per_ref:.2f}x); localization's fixed cost "
                     f"(exposing both models, one session): {l0['seconds'] - n0 * per_loc:.2f} s")
    console.print(table)


if __name__ == "__main__":
    main()
