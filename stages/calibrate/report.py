"""Stage `calibrate`'s report: how the INT8 ranges were chosen, what was quantized, and the INT8 variant's CPU
accuracy pre-flight."""
from __future__ import annotations

from pydantic import BaseModel

from trtflow import markdown as md
from trtflow.stages.compare.records import Accuracy
from trtflow.stages.onnx.records import Composition
from trtflow.text import distinct


class RangeCheck(BaseModel):
    """Each candidate set of ranges — the chosen rule's, the other histogram rule's, the full ranges (MinMax) —
    quantized (with `remainder: fp16`, its remainder in FP16, emulated per node: as the variant will run) and run
    on (some of) the calibration samples, never the held-out ones: the one whose outputs stay
    closest to FP32 is kept: by the declared task metrics (`metrics:`), the chosen rule unless another is at least as
    good on every one and better on one; without them, by the mean relative L2 error per sample and output. (The
    candidates are compared before bias correction, which the kept one then gets.)"""
    samples: int
    errors: dict[str, float]  # candidate ("entropy", "percentile", "full_range") -> mean relative error
    task: dict[str, dict[str, float]] = {}  # candidate -> declared task metric ("output/metric") -> value: where
    # declared, these decide (in declaration order, each toward its better end), the rule on a tie
    used: str
    rule: str
    decided_by: str | None = None  # the task metric that set `used` apart from the rule's ranges (None: the
    # rule's ranges are used, or no task metric was declared and the mean relative error decided)

    def warning(self) -> str | None:
        """When other ranges than the rule's are used: which, and the comparison that actually decided."""
        if self.used == self.rule:
            return None
        if self.decided_by:
            m = self.decided_by
            better, chosen = distinct(self.task[self.used][m], self.task[self.rule][m])
            metrics = list(self.task[self.rule])
            tied = metrics[:metrics.index(m)]
            why = f"declared task metric {m} {better} vs {chosen}" + (f", after a tie on {', '.join(tied)}"
                                                                       if tied else "")
        else:
            better, chosen = distinct(self.errors[self.used], self.errors[self.rule])
            why = f"mean relative error {better} < {chosen}"
        return (f"on the calibration samples the {_label(self.used)} ranges tracked FP32 better than the {self.rule} "
                f"ones ({why}) and are used; set entropy_check: false for the {self.rule} rule regardless")

    def summary(self) -> str:
        """One Markdown line: the ranges used and the numbers they were chosen by."""
        errors = ", ".join(f"{md.text(_label(k))} {v:.4g}" for k, v in self.errors.items())
        if not self.task:
            return f"ranges: {md.text(_label(self.used))} (mean relative error on {self.samples} calibration " \
                   f"samples: {errors})"
        metrics = list(next(iter(self.task.values())))
        by_metric = "; ".join(f"{md.text(m)}: " + ", ".join(f"{md.text(_label(k))} {t[m]:.4g}"
                                                            for k, t in self.task.items()) for m in metrics)
        return (f"ranges: {md.text(_label(self.used))} (by the declared task metrics on {self.samples} calibration "
                f"samples, the {md.text(self.rule)} rule on a tie: {by_metric}; mean relative error, not deciding: "
                f"{errors})")


def _label(candidate: str) -> str:
    return candidate.replace("_", " ")


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
    quantized_nodes: int = 0  # nodes that read quantized weights: what TensorRT runs in INT8 (validate counts these)
    bias_corrected: int = 0  # quantized nodes whose float bias absorbs the mean error of INT8 rounding (bias.py)
    accuracy: Accuracy
    holdout: str = ""  # which samples the pre-flight measured ("samples 13-16 of images via preprocess ...")
    warnings: list[str]
    composition: Composition | None = None  # the variant's compute by precision, at the held-out samples' shapes
    remainder: str = "fp32"  # the precision of what is not quantized (`remainder`): "fp32" or "fp16"
    remainder_fp32: dict[str, str] = {}  # with an FP16 remainder: node -> why it stays FP32 (the FP16 safeguards)

    def summary(self) -> str:
        where = "inputs and outputs" if self.quantize_outputs else "inputs only"
        ops = ", ".join(md.text(op) for op in self.quantize_ops)
        lines = [f"### calibrate · INT8 Q/DQ · {md.text(self.method)} · {self.calibration_samples} samples", "",
                 (f"data: {md.text(self.data)} · {self.quantized_nodes} quantized nodes ({self.quantize_linear_nodes} "
                  f"QuantizeLinear: one per quantized tensor, however many nodes read it) · quantized ops: "
                  f"{ops} ({where}) · symmetric, per-channel weights, bias in float"
                  + (f", corrected for the rounding's mean error on {self.bias_corrected} node(s)"
                     if self.bias_corrected else "")), ""]
        if self.left_in_float:
            reasons: dict[str, list[str]] = {}
            for node, why in self.left_in_float.items():
                reasons.setdefault(why, []).append(node)
            lines.append(f"left in float: {len(self.left_in_float)} node(s) of {ops}: " +
                         "; ".join(f"{len(ns)} {md.text(why)} ({', '.join(md.code(n) for n in ns[:4])}"
                                   f"{', …' if len(ns) > 4 else ''})" for why, ns in reasons.items()) + "\n")
        if self.remainder == "fp16":
            kept = list(self.remainder_fp32)
            lines.append("remainder (what is not quantized): FP16 at opset 19, " +
                         (f"{len(kept)} node(s) kept FP32 ({', '.join(md.code(n) for n in kept[:4])}"
                          f"{', …' if len(kept) > 4 else ''}: {md.text(self.remainder_fp32[kept[0]])}"
                          f"{' …' if len(kept) > 1 else ''})" if kept else "no node kept FP32") + "\n")
        else:
            lines.append("remainder (what is not quantized): FP32\n")
        if self.composition:
            lines.append(self.composition.markdown() + "\n")
        if self.range_check:
            lines.append(self.range_check.summary() + "\n")
        if self.holdout_samples:
            graph = f" {md.code(self.accuracy.graph)}" if self.accuracy.graph else ""
            which = f" ({md.text(self.holdout)})" if self.holdout else ""
            lines += [(f"**CPU accuracy pre-flight** ({md.text(self.accuracy.runtime)}, not a TensorRT number), "
                       f"INT8 variant{graph} vs FP32 reference on {self.accuracy.samples} held-out samples{which}, "
                       f"measured as validate measures it:"), ""]
            lines += self.accuracy.table()
        for w in self.warnings:
            lines.append(f"\n- warning: {md.text(w)}")
        return "\n".join(lines) + "\n"
