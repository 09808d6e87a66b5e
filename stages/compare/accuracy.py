"""Comparing a model variant's outputs with a reference over many samples (the comparators, apart from the
runners), and the one result every comparison gives: `Accuracy` (per output metrics, the bounds missed, true when
none was). `Comparison` accumulates per output max/mean absolute error, max relative error, cosine similarity,
NaN/Inf counts in the candidate and in the reference, top-1 and top-5 agreement for classifier scores; validate,
the precision and calibrate pre-flights and parity's model check use it; prepare's elementwise check
(`ort.runner.compare_models`) gives an `Accuracy` too."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

REL_FLOOR = 1e-3  # max_rel ignores reference elements below this share of the output's largest |value|


class OutputStats:
    def __init__(self) -> None:
        self.max_abs = 0.0
        self.sum_abs = 0.0
        self.count = 0
        self.dot = self.ref_sq = self.got_sq = 0.0
        self.max_rel = 0.0
        self.nan = self.inf = self.ref_nan = self.ref_inf = 0
        self.top1_agree = self.top5_agree = self.top_total = 0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
        self.nan += int(np.isnan(g).sum())
        self.inf += int(np.isinf(g).sum())
        self.ref_nan += int(np.isnan(r).sum())
        self.ref_inf += int(np.isinf(r).sum())
        ok = np.isfinite(g) & np.isfinite(r)
        d = np.abs(r[ok] - g[ok])
        if d.size:
            self.max_abs = max(self.max_abs, float(d.max()))
            # relative to each reference element, over elements of at least REL_FLOOR of the output's largest
            # magnitude: near-zero elements make any relative error meaningless
            mag = np.abs(r[ok])
            big = mag >= REL_FLOOR * float(mag.max())
            if big.any() and mag.max() > 0:
                self.max_rel = max(self.max_rel, float((d[big] / mag[big]).max()))
        self.sum_abs += float(d.sum())
        self.count += int(ok.sum())
        self.dot += float(np.dot(r[ok], g[ok]))
        self.ref_sq += float(np.dot(r[ok], r[ok]))
        self.got_sq += float(np.dot(g[ok], g[ok]))
        if ref.ndim == 2 and ref.shape[1] > 1:  # (batch, classes): a classifier's scores
            want = ref.argmax(1)
            scores = np.nan_to_num(got.astype(np.float64))
            self.top1_agree += int((want == scores.argmax(1)).sum())
            k = min(5, ref.shape[1])
            top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            self.top5_agree += int((top == want[:, None]).any(1).sum())
            self.top_total += ref.shape[0]

    def result(self) -> dict[str, Any]:
        if self.ref_sq and self.got_sq:
            cosine = self.dot / np.sqrt(self.ref_sq * self.got_sq)
        else:  # all zeros on both sides is agreement (as in TensorStats); on one side only, none
            cosine = 1.0 if not self.ref_sq and not self.got_sq and self.count else 0.0
        out = {"max_abs": self.max_abs, "mean_abs": self.sum_abs / max(self.count, 1), "max_rel": self.max_rel,
               "cosine": float(cosine), "nan": self.nan, "inf": self.inf,
               "reference_nan": self.ref_nan, "reference_inf": self.ref_inf}
        if self.top_total:
            out["top1"] = self.top1_agree / self.top_total
            out["top5"] = self.top5_agree / self.top_total
        return out


def added_nonfinite(metrics: dict[str, Any]) -> int:
    """NaN/Inf values in one output of the candidate beyond those its reference has itself."""
    return int(metrics["nan"] + metrics["inf"] - metrics.get("reference_nan", 0) - metrics.get("reference_inf", 0))


@dataclass
class Accuracy:
    """What comparing a candidate with its reference found: metrics per output over `samples`, measured on
    `runtime`, and the bounds it missed (one line each). True when it missed none."""

    runtime: str
    samples: int
    outputs: dict[str, dict[str, Any]]  # output -> metric -> value
    violations: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)  # what else the comparator reports (its bounds, shapes)

    def __bool__(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {**self.details, "runtime": self.runtime, "samples": self.samples, "outputs": self.outputs}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Accuracy":
        return cls(data["runtime"], data["samples"], data["outputs"])

    def total(self, metric: str) -> float:
        return sum(o.get(metric, 0) for o in self.outputs.values())

    def table(self) -> list[str]:
        lines = ["| output | max abs | mean abs | cosine | NaN/Inf | top-1 agree |", "|---|---|---|---|---|---|"]
        for name, r in self.outputs.items():
            top1 = f"{r['top1']:.1%}" if "top1" in r else "-"
            lines.append(f"| `{name}` | {r['max_abs']:.4g} | {r['mean_abs']:.4g} | {r['cosine']:.6f} | "
                         f"{r['nan']}/{r['inf']} | {top1} |")
        return lines

    def warnings(self, min_cosine: float, what: str) -> list[str]:
        """What a pre-flight should not pass quietly: NaN/Inf, and outputs below the cosine bar."""
        found = []
        nan_inf = int(self.total("nan") + self.total("inf"))
        if nan_inf:
            found.append(f"{what} produces {nan_inf} NaN/Inf values on held-out samples")
        for name, o in self.outputs.items():
            if self.samples and o["cosine"] < min_cosine:
                found.append(f"{what}: output '{name}' has cosine {o['cosine']:.4f} < {min_cosine} against FP32 "
                             f"(max abs error {o['max_abs']:.4g}) on {self.samples} held-out samples "
                             f"({self.runtime})")
        return found


class Comparison:
    def __init__(self) -> None:
        self.outputs: dict[str, OutputStats] = {}
        self.samples = 0

    def add(self, ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
        self.samples += 1
        for name, r in ref.items():
            self.outputs.setdefault(name, OutputStats()).add(r, got[name])

    def result(self, runtime: str) -> Accuracy:
        return Accuracy(runtime, self.samples, {n: s.result() for n, s in self.outputs.items()})
