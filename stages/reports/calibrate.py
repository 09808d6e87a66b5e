"""Stage `calibrate`'s report: how the INT8 ranges were chosen, what was quantized, and the INT8 variant's CPU
accuracy pre-flight."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from trtflow.stages.compare.accuracy import Accuracy


class EntropyCheck(BaseModel):
    """Entropy's ranges against the full ranges on (some of) the calibration samples: the better is kept."""
    samples: int
    entropy: float  # the worst output cosine with the entropy ranges
    full_range: float  # ... with the full ranges
    used: str  # "entropy" or "full_range"


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
    quantize_linear_nodes: int
    accuracy: dict[str, Any]  # Accuracy.to_json()
    warnings: list[str]

    def summary(self) -> str:
        lines = [f"### calibrate · INT8 Q/DQ · {self.method} · {self.calibration_samples} samples", "",
                 f"data: {self.data} · {self.quantize_linear_nodes} QuantizeLinear nodes · quantized ops: "
                 f"{', '.join(self.quantize_ops)} · symmetric, per-channel weights, bias in float", ""]
        if self.excluded_nodes:
            lines.append(f"excluded: {', '.join(f'`{n}`' for n in self.excluded_nodes[:20])}\n")
        if self.holdout_samples:
            lines += [f"**CPU accuracy pre-flight** ({self.accuracy['runtime']}, not a TensorRT number), "
                      f"INT8 variant vs FP32 reference on {self.holdout_samples} held-out samples:", ""]
            lines += Accuracy.from_json(self.accuracy).table()
        for w in self.warnings:
            lines.append(f"\n- warning: {w}")
        return "\n".join(lines) + "\n"
