"""Where a variant first drifts from the reference: every intermediate tensor of both, on the same inputs, compared
in the reference's topological order (Polygraphy's "compare layerwise", on ONNX Runtime).

One sample at a time and only per-tensor statistics are kept, so memory does not grow with the number of samples.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import onnx
from onnx import helper

from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.graph import subgraphs
from trtflow.stages.ort.ranges import expose_all, float_outputs
from trtflow.stages.ort.runner import session

FP16_MAX = 65504.0


class TensorStats:
    """Per-tensor error statistics accumulated over samples. Finite tensors take a fast float32 path (BLAS dot
    products, min/max): 1 - cosine comes from the squared difference, so it stays exact near 1 where a cosine
    from float32 dot products would not; a tensor holding inf/NaN (or overflowing the float32 sums) is counted
    element by element in float64."""
    __slots__ = ("max_abs", "ref_max", "diff_sq", "ref_sq", "got_sq", "bad", "ref_bad", "over_fp16", "clipped",
                 "elements")

    def __init__(self) -> None:
        self.max_abs = self.ref_max = self.diff_sq = self.ref_sq = self.got_sq = 0.0
        self.bad = self.ref_bad = self.over_fp16 = self.clipped = self.elements = 0

    def add(self, r: np.ndarray, g: np.ndarray, qrange: tuple[float, float] | None) -> None:
        r, g = np.asarray(r, np.float32).ravel(), np.asarray(g, np.float32).ravel()
        rr, gg = float(np.dot(r, r)), float(np.dot(g, g))
        if not (np.isfinite(rr) and np.isfinite(gg)):  # inf/NaN somewhere, or float32 sums overflowing
            rf, gf = np.isfinite(r), np.isfinite(g)
            self.ref_bad += int(r.size - rf.sum())
            self.bad += int((rf & ~gf).sum())  # non-finite where the reference is finite
            ok = rf & gf
            r, g = (r, g) if ok.all() else (r[ok], g[ok])
            rr, gg = float(np.dot(r, r)), float(np.dot(g, g))
            if not (np.isfinite(rr) and np.isfinite(gg)):  # finite values whose float32 sums overflow
                r, g = r.astype(np.float64), g.astype(np.float64)
                rr, gg = float(r @ r), float(g @ g)
        if not r.size:
            return
        d = r - g
        self.diff_sq += float(np.dot(d, d))
        self.ref_sq += rr
        self.got_sq += gg
        self.max_abs = max(self.max_abs, float(d.max()), -float(d.min()))
        lo, hi = float(r.min()), float(r.max())
        self.ref_max = max(self.ref_max, hi, -lo)
        if max(hi, -lo) > FP16_MAX:
            self.over_fp16 += int((np.abs(r) > FP16_MAX).sum())
        if qrange is not None and (lo < qrange[0] or hi > qrange[1]):
            self.clipped += int(((r < qrange[0]) | (r > qrange[1])).sum())
        self.elements += r.size

    @property
    def cosine(self) -> float:
        if self.ref_sq == 0 and self.got_sq == 0:
            return 1.0
        if not (self.ref_sq and self.got_sq):
            return 0.0
        # |r - g|^2 = |r|^2 + |g|^2 - 2 r.g, so 1 - cos = (|r - g|^2 - (|r| - |g|)^2) / (2 |r| |g|)
        nr, ng = np.sqrt(self.ref_sq), np.sqrt(self.got_sq)
        return float(1.0 - max(0.0, self.diff_sq - (nr - ng) ** 2) / (2 * nr * ng))

    @property
    def drift(self) -> float:
        """1 - cosine; 1 where the candidate turned a finite value non-finite."""
        return 1.0 if self.bad else max(0.0, 1.0 - self.cosine)


CANDIDATE = "candidate::"


def _paired(reference: onnx.ModelProto, candidate: onnx.ModelProto, names: list[str], work: Path,
            tensors: tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]],
            ) -> Callable[[dict[str, np.ndarray]], tuple[list[np.ndarray], list[np.ndarray]]]:
    """feed -> (reference's values, candidate's values) of `names`. Both models in one ONNX Runtime session where
    they read the same inputs under the same opsets (the candidate's names prefixed): one run; otherwise each
    model with its float tensors (`tensors`) exposed, run one after the other."""
    same_inputs = [(i.name, i.type) for i in reference.graph.input] == [(i.name, i.type) for i in candidate.graph.input]
    same_opsets = {(o.domain, o.version) for o in reference.opset_import} == \
        {(o.domain, o.version) for o in candidate.opset_import}
    if not (same_inputs and same_opsets):
        expose_all(reference, work / "layerwise_ref.onnx", tensors[0])
        expose_all(candidate, work / "layerwise_cand.onnx", tensors[1])
        ref, cand = session(work / "layerwise_ref.onnx"), session(work / "layerwise_cand.onnx")
        return lambda feed: (_run(ref, names, feed), _run(cand, names, feed))
    inputs = {i.name for i in candidate.graph.input}

    def renamed(t: str) -> str:
        return t if not t or t in inputs else CANDIDATE + t

    pair = onnx.ModelProto()
    pair.CopyFrom(reference)
    cand = onnx.ModelProto()
    cand.CopyFrom(candidate)
    for node in cand.graph.node:
        node.name = CANDIDATE + node.name
        node.input[:] = [renamed(t) for t in node.input]
        node.output[:] = [renamed(t) for t in node.output]
        for graph in subgraphs(node):
            _rename_outer_refs(graph, renamed)
    for init in cand.graph.initializer:
        init.name = renamed(init.name)
    pair.graph.node.extend(cand.graph.node)
    pair.graph.initializer.extend(cand.graph.initializer)
    del pair.graph.value_info[:]
    del pair.graph.output[:]
    pair.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in names + [renamed(t) for t in names])
    path = work / "layerwise_pair.onnx"
    model_io.save(pair, path)
    sess = session(path)
    fetch = names + [renamed(t) for t in names]

    def run(feed: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        values = _run(sess, fetch, feed)
        return values[:len(names)], values[len(names):]
    return run


def _run(sess: Any, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """`sess.run` without copying every output: OrtValue.numpy() is a view that keeps the tensor alive."""
    from onnxruntime import OrtValue

    values = sess.run_with_ort_values(names, {k: OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v))
                                              for k, v in feed.items()})
    return [v.numpy() for v in values]


def _rename_outer_refs(graph: onnx.GraphProto, renamed: Callable[[str], str]) -> None:
    """Inside an If/Loop body, names defined outside it (not by the body itself) follow the renaming."""
    local = {i.name for i in graph.input} | {i.name for i in graph.initializer} | \
        {t for n in graph.node for t in n.output}
    for node in graph.node:
        node.input[:] = [t if t in local else renamed(t) for t in node.input]
        for sub in subgraphs(node):
            _rename_outer_refs(sub, lambda t, local=local: t if t in local else renamed(t))


def compare(reference: onnx.ModelProto, candidate: onnx.ModelProto, feeds: Iterable[dict[str, np.ndarray]],
            work: Path, bound: float, qranges: dict[str, tuple[float, float]] | None = None,
            worst: int = 10) -> dict[str, Any]:
    """Per tensor shared by both models (in the reference's order): cosine, max abs error relative to the
    reference's magnitude, non-finite values, FP16 overflow in the reference, and clipping by the candidate's
    quantized range. `first_bad` is the first node whose output's cosine falls below `bound` (or turns
    non-finite); `worst` ranks nodes by the drift they add over their inputs."""
    ref_tensors, cand_tensors = float_outputs(reference), float_outputs(candidate)
    cand_names = {vi.name for vi in cand_tensors}
    common = [vi.name for vi in ref_tensors if vi.name in cand_names]
    run = _paired(reference, candidate, common, work, (ref_tensors, cand_tensors))
    qranges = qranges or {}
    stats = {n: TensorStats() for n in common}

    def accumulate(ref_values: list[np.ndarray], cand_values: list[np.ndarray]) -> None:
        for name, r, g in zip(common, ref_values, cand_values):
            stats[name].add(r, g, qranges.get(name))

    # the statistics of one sample are taken while ONNX Runtime runs the next (both release the GIL): at most
    # two samples' tensors are held at once
    samples = 0
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for feed in feeds:
            values = run(feed)
            if pending is not None:
                pending.result()
            pending = pool.submit(accumulate, *values)
            del values
            samples += 1
        if pending is not None:
            pending.result()
    producer = {o: n for n in reference.graph.node for o in n.output}
    rows = []
    for name in common:
        s, node = stats[name], producer[name]
        before = max((stats[t].drift for t in node.input if t in stats), default=0.0)
        rows.append({"node": node.name, "op": node.op_type, "tensor": name, "cosine": s.cosine,
                     "rel_err": s.max_abs / s.ref_max if s.ref_max else float(s.max_abs > 0),
                     "max_abs": s.max_abs, "nonfinite": s.bad, "reference_nonfinite": s.ref_bad,
                     "reference_max": s.ref_max, "drift": s.drift, "added": max(0.0, s.drift - before),
                     "over_fp16": s.over_fp16,
                     **({"range": list(qranges[name]), "clipped": s.clipped / max(s.elements, 1),
                         "range_use": s.ref_max / max(abs(qranges[name][0]), abs(qranges[name][1]), 1e-30)}
                        if name in qranges else {})})
    first = next((r for r in rows if r["nonfinite"] or r["cosine"] < bound), None)
    return {"samples": samples, "tensors": len(rows), "bound": bound, "first_bad": first,
            "worst": sorted(rows, key=lambda r: -r["added"])[:worst],
            "overflow": [r for r in rows if r["over_fp16"]][:worst],
            "clipping": sorted((r for r in rows if "range" in r and (r["clipped"] > 1e-3 or r["range_use"] < 0.02)),
                               key=lambda r: (-r["clipped"], r["range_use"]))[:worst],
            "rows": rows}
