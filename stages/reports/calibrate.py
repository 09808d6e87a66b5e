"""Stage `calibrate`'s report: how the INT8 ranges were chosen, what was quantized, and the INT8 variant's CPU
accuracy pre-flight."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from trtflow import markdown as md
from trtflow.stages.compare.accuracy import Accuracy


class RangeCheck(BaseModel):
    """Each candidate set of ranges — the chosen rule's, the other histogram rule's, the full ranges (MinMax) —
    quantized and run on (some of) the calibration samples, never the held-out ones: the one whose outputs stay
    closest to FP32 is kept: by the declared task metrics (`metrics:`), the chosen rule on a tie; without them, by
    the mean relative L2 error per sample and output."""
    samples: int
    errors: dict[str, float]  # candidate ("entropy", "percentile", "full_range") -> mean relative error
    task: dict[str, dict[str, float]] = {}  # candidate -> declared task metric ("output/metric") -> value, signed
    # so that higher is better: where declared, these decide (in declaration order), the rule on a tie
    used: str
    rule: str


class CalibrateReport(BaseModel):
    method: str
    percentile: float | None
    data: str
    calibration_samples: int
    holdout_samples: int
    full_range_tensors: list[str]
    range_check: RangeCheck | None
    excluded_nodes: list[str]
    quantize_ops: list[str]
    quantize_outputs: bool = False
    # every node of quantize_ops that reads no DequantizeLinear in the written model -> why it stayed in float
    left_in_float: dict[str, str] = {}
    quantize_linear_nodes: int
    accuracy: dict[str, Any]  # Accuracy.to_json()
    warnings: list[str]

    def summary(self) -> str:
        where = "inputs and outputs" if self.quantize_outputs else "inputs only"
        ops = ", ".join(md.text(op) for op in self.quantize_ops)
        lines = [f"### calibrate · INT8 Q/DQ · {md.text(self.method)} · {self.calibration_samples} samples", "",
                 (f"data: {md.text(self.data)} · {self.quantize_linear_nodes} QuantizeLinear nodes · quantized ops: "
                  f"{ops} ({where}) · symmetric, per-channel weights, bias in float"), ""]
        if self.left_in_float:
            reasons: dict[str, list[str]] = {}
            for node, why in self.left_in_float.items():
                reasons.setdefault(why, []).append(node)
            lines.append(f"left in float: {len(self.left_in_float)} node(s) of {ops}: " +
                         "; ".join(f"{len(ns)} {md.text(why)} ({', '.join(md.code(n) for n in ns[:4])}"
                                   f"{', …' if len(ns) > 4 else ''})" for why, ns in reasons.items()) + "\n")
        if self.range_check:
            c = self.range_check
            lines.append(f"ranges: {md.text(c.used.replace('_', ' '))} (mean relative error on {c.samples} "
                         "calibration samples: " + ", ".join(f"{md.text(k.replace('_', ' '))} {v:.4g}"
                                                             for k, v in c.errors.items()) + ")\n")
        if self.holdout_samples:
            lines += [(f"**CPU accuracy pre-flight** ({md.text(self.accuracy['runtime'])}, not a TensorRT number), "
                       f"INT8 variant vs FP32 reference on {self.holdout_samples} held-out samples:"), ""]
            lines += Accuracy.from_json(self.accuracy).table()
        for w in self.warnings:
            lines.append(f"\n- warning: {md.text(w)}")
        return "\n".join(lines) + "\n"
