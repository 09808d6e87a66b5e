"""Where a variant first drifts from the reference: every intermediate tensor of both, on the same inputs, compared
in the reference's topological order (Polygraphy's "compare layerwise", on ONNX Runtime).

One sample at a time and only per-tensor statistics are kept, so memory does not grow with the number of samples.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np
import onnx

from trtflow.stages.ort.ranges import expose_all
from trtflow.stages.ort.runner import session

FP16_MAX = 65504.0


class TensorStats:
    __slots__ = ("max_abs", "ref_max", "dot", "ref_sq", "got_sq", "bad", "ref_bad", "over_fp16", "clipped",
                 "elements")

    def __init__(self) -> None:
        self.max_abs = self.ref_max = self.dot = self.ref_sq = self.got_sq = 0.0
        self.bad = self.ref_bad = self.over_fp16 = self.clipped = self.elements = 0

    def add(self, r: np.ndarray, g: np.ndarray, qrange: tuple[float, float] | None) -> None:
        r, g = r.ravel().astype(np.float64), g.ravel().astype(np.float64)
        rf, gf = np.isfinite(r), np.isfinite(g)
        self.ref_bad += int((~rf).sum())
        self.bad += int((rf & ~gf).sum())  # non-finite where the reference is finite
        ok = rf & gf
        r, g = r[ok], g[ok]
        if r.size:
            self.max_abs = max(self.max_abs, float(np.abs(r - g).max()))
            self.ref_max = max(self.ref_max, float(np.abs(r).max()))
        self.dot += float(r @ g)
        self.ref_sq += float(r @ r)
        self.got_sq += float(g @ g)
        self.over_fp16 += int((np.abs(r) > FP16_MAX).sum())
        if qrange is not None:
            self.clipped += int(((r < qrange[0]) | (r > qrange[1])).sum())
        self.elements += int(ok.sum())

    @property
    def cosine(self) -> float:
        if self.ref_sq == 0 and self.got_sq == 0:
            return 1.0
        return self.dot / np.sqrt(self.ref_sq * self.got_sq) if self.ref_sq and self.got_sq else 0.0

    @property
    def drift(self) -> float:
        """1 - cosine; 1 where the candidate turned a finite value non-finite."""
        return 1.0 if self.bad else max(0.0, 1.0 - self.cosine)


def compare(reference: onnx.ModelProto, candidate: onnx.ModelProto, feeds: Iterable[dict[str, np.ndarray]],
            work: Path, bound: float, qranges: dict[str, tuple[float, float]] | None = None,
            worst: int = 10) -> dict[str, Any]:
    """Per tensor shared by both models (in the reference's order): cosine, max abs error relative to the
    reference's magnitude, non-finite values, FP16 overflow in the reference, and clipping by the candidate's
    quantized range. `first_bad` is the first node whose output's cosine falls below `bound` (or turns
    non-finite); `worst` ranks nodes by the drift they add over their inputs."""
    ref_names = expose_all(reference, work / "layerwise_ref.onnx")
    cand_names = set(expose_all(candidate, work / "layerwise_cand.onnx"))
    common = [n for n in ref_names if n in cand_names]
    ref, cand = session(work / "layerwise_ref.onnx"), session(work / "layerwise_cand.onnx")
    qranges = qranges or {}
    stats = {n: TensorStats() for n in common}
    samples = 0
    for feed in feeds:
        got = dict(zip(common, cand.run(common, feed)))
        for name, r in zip(common, ref.run(common, feed)):
            stats[name].add(r, got[name], qranges.get(name))
        del got
        samples += 1
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
