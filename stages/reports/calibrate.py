"""Stage `calibrate`'s report: how the INT8 ranges were chosen, what was quantized, and the INT8 variant's CPU
accuracy pre-flight."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from trtflow.stages.compare.accuracy import Accuracy


class EntropyCheck(BaseModel):
    """The clipped ranges (entropy's or percentile's: `rule`) against the full ranges on (some of) the calibration
    samples: the better is kept."""
    samples: int
    entropy: float  # the worst output cosine with the clipped ranges (the name predates percentile's check)
    full_range: float  # ... with the full ranges
    used: str  # the rule ("entropy", "percentile") or "full_range"
    rule: str = "entropy"


class CalibrateReport(BaseModel):
    method: str
    percentile: float | None
    data: str
    calibration_samples: int
    holdout_samples: int
    full_range_tensors: list[str]
    entropy_check: EntropyCheck | None
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
        lines = [f"### calibrate · INT8 Q/DQ · {self.method} · {self.calibration_samples} samples", "",
                 (f"data: {self.data} · {self.quantize_linear_nodes} QuantizeLinear nodes · quantized ops: "
                  f"{', '.join(self.quantize_ops)} ({where}) · symmetric, per-channel weights, bias in float"), ""]
        if self.left_in_float:
            reasons: dict[str, list[str]] = {}
            for node, why in self.left_in_float.items():
                reasons.setdefault(why, []).append(node)
            lines.append(f"left in float: {len(self.left_in_float)} node(s) of {', '.join(self.quantize_ops)}: " +
                         "; ".join(f"{len(ns)} {why} ({', '.join(f'`{n}`' for n in ns[:4])}"
                                   f"{', …' if len(ns) > 4 else ''})" for why, ns in reasons.items()) + "\n")
        if self.holdout_samples:
            lines += [(f"**CPU accuracy pre-flight** ({self.accuracy['runtime']}, not a TensorRT number), "
                       f"INT8 variant vs FP32 reference on {self.holdout_samples} held-out samples:"), ""]
            lines += Accuracy.from_json(self.accuracy).table()
        for w in self.warnings:
            lines.append(f"\n- warning: {w}")
        return "\n".join(lines) + "\n"
