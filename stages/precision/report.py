"""Stage `precision`'s report: which nodes stay in FP32 and why, and the FP16 variant's CPU accuracy pre-flight."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from trtflow import markdown as md
from trtflow.stages.compare.records import Accuracy
from trtflow.stages.onnx.records import Composition
from trtflow.stages.trt.records import VariantTrial


class PrecisionReport(BaseModel):
    to: str
    nodes: int
    fp16_nodes: int
    kept_fp32: dict[str, str]  # node -> why it stays FP32
    island: Any  # the FP32 island ONNX Runtime's probe needed
    data: str
    calibration_samples: int
    holdout_samples: int
    fallback: dict[str, Any]
    accuracy: Accuracy
    trial_build: VariantTrial = VariantTrial()  # TensorRT's trial build of the variant
    warnings: list[str]
    composition: Composition | None = None  # the variant's compute by precision, at the held-out samples' shapes

    def summary(self) -> str:
        kept = self.kept_fp32
        lines = [f"### precision · FP16 · {len(kept)} of {self.nodes} nodes kept in FP32", "",
                 f"sample data: {md.text(self.data)} · {self.calibration_samples} for the fallback analysis, "
                 f"{self.holdout_samples} held out for the accuracy check", ""]
        if self.composition:
            lines += [self.composition.markdown(), ""]
        lines += [f"**CPU accuracy pre-flight** ({md.text(self.accuracy.runtime)}, not a TensorRT number), "
                  f"FP16 variant vs FP32 reference:", ""] + self.accuracy.table()
        trial = self.trial_build
        if trial.ran:
            shapes = f"{trial.min_shapes or trial.shapes} .. {trial.shapes}"
            lines += ["", f"**trial build** ({md.text(trial.runtime)}, profile {md.text(shapes)}): "
                          + ("builds" if trial.ok else f"fails: {md.text(trial.error)}")]
        lines += [f"\n**warning**: {md.text(w)}" for w in self.warnings]
        if kept:
            lines += ["", "| node kept in FP32 | why |", "|---|---|"]
            lines += [f"| {md.code(n, cell=True)} | {md.text(why)} |" for n, why in list(kept.items())[:40]]
            if len(kept) > 40:
                lines.append(f"| ... | and {len(kept) - 40} more (report.json) |")
        return "\n".join(lines) + "\n"

