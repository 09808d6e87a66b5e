"""What the pipeline init proposes will cost on this machine's CPU, said in the file before anything runs: the memory
ONNX Runtime needs at the profile's max (predicted from the graph; the CLI asks `stages/ort/memory.py`, as
pipelines/ imports no stage) against the memory the machine has, and the stages' run time extrapolated from one timed
FP32 pass. A max that needs more memory than is available is warned of: the stages run its batch in parts that fit
TRTFLOW_MEMORY_BUDGET, and refuse a single sample that does not fit.

The run time counts the ONNX Runtime passes each stage makes with the sample counts init writes, in FP32 passes at
the profile's opt shape, each scaled by its input's elements (a CNN's or a sequence model's cost grows with them),
the pass timed once warm (the first run of a session pays for its allocations):
precision measures every tensor on its calibration samples then checks its holdout on the reference and the FP16
emulation; calibrate collects every calibrated tensor, checks three sets of ranges on up to 8 samples, corrects the
bias and checks its holdout; validate runs the reference and each candidate (FP32, FP16, INT8 simulated) on its
samples made into the profile's min, opt and max. The costs per pass of the kinds of runs (EXPOSED, FP16, INT8)
and what stages spend besides (FIXED_S) are rough, from bench/memory.py's timings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from trtflow.pipelines.init.profile import ProfilePlan

# an ONNX Runtime pass of each kind in FP32 passes of the same shape
EXPOSED = 1.3  # every tensor an output (precision's magnitudes, calibration's statistics)
FP16 = 1.6  # the FP16 emulation: a Cast pair around each FP16 node
INT8 = 1.8  # Q/DQ as fake quantization, graph optimizations off
# what each stage spends besides its passes: (seconds, seconds per node of the model) for writing and checking
# variants, ONNX Runtime's quantizer, the comparisons; fitted on bench/memory.py's three models (32 to 860 nodes),
# where it is most of a stage; a large model's passes dominate instead (the speech model: INT8 403 s,
# validate 415 s)
FIXED_S = (("precision", 1.0, 0.002), ("calibrate", 2.0, 0.008), ("validate", 2.0, 0.004))
RANGE_CHECK = 8  # calibrate's range check and bias correction run on up to this many samples
RANDOM_SAMPLES = 8  # validate's data: {random: true} draws this many (SampleData's default)


def _gib(size: float) -> str:
    if size < 2**20:
        return f"{size / 2**10:.0f} KiB"
    return f"{size / 2**30:.3g} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def _time(seconds: float) -> str:
    if seconds < 1:
        return "under 1 s"
    return "~" + (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h")


@dataclass(frozen=True)
class Counts:
    """The samples each stage of the file takes, and its holdouts (what `write.py` writes)."""
    precision: int
    precision_holdout: int
    calibrate: int
    calibrate_holdout: int
    validate: int


def passes(plan: ProfilePlan, counts: Counts | None) -> dict[str, float]:
    """Per stage, its ONNX Runtime passes in FP32 passes of one row at the profile's opt shape (no data: precision
    on random samples at opt, no calibrate)."""
    rows = [_row_elements(plan, point) for point in range(3)]
    scale = [r / max(rows[1], 1) for r in rows]
    batch = [plan.point(point) for point in range(3)]
    n_v = counts.validate if counts is not None else RANDOM_SAMPLES
    candidates = 1 + 1 + FP16 + (INT8 if counts is not None else 0)  # the reference, then FP32, FP16, INT8
    validate = 0.0
    for point in range(3):
        b = _batch(plan, batch[point])
        validate += math.ceil(n_v / b) * b * scale[point] * candidates
    p, ph = (counts.precision, counts.precision_holdout) if counts is not None else (RANDOM_SAMPLES, 0)
    found = {"validate": validate, "precision": (p - ph) * EXPOSED + max(ph, 1) * (1 + FP16) + 2}
    if counts is not None:
        c, ch = counts.calibrate, counts.calibrate_holdout
        check = min(RANGE_CHECK, c - ch)
        found.update(calibrate=(c - ch) * EXPOSED + check * (1 + EXPOSED + 3 * INT8) + 2 * check * INT8
                     + ch * (1 + INT8))
    return found


def seconds(plan: ProfilePlan, counts: Counts | None, pass_s: float, nodes: int) -> dict[str, float]:
    """Per stage, its estimated seconds on this CPU: its passes at `pass_s` each (one FP32 pass of one row at the
    opt shape, timed), and what it spends besides (FIXED_S, for a model of `nodes` nodes)."""
    fixed = {k: base + per_node * nodes for k, base, per_node in FIXED_S}
    return {k: v * pass_s + fixed.get(k, 0.0) for k, v in passes(plan, counts).items()}


def _batch(plan: ProfilePlan, shapes: dict[str, list[int]]) -> int:
    """The batch at a point: dimension 0 where every input's is dynamic (as validate takes it), else 1."""
    batched = all(p.tensor.rank > 0 and not isinstance(p.tensor.dims[0], int) for p in plan.inputs)
    return max((s[0] for s in shapes.values() if s), default=1) if batched else 1


def one_row(plan: ProfilePlan, point: int) -> dict[str, list[int]]:
    """Each input's shape at a point, its batch 1 (where dimension 0 is one)."""
    shapes = plan.point(point)
    b = _batch(plan, shapes)
    return {name: [1, *s[1:]] if b > 1 and s and s[0] == b else s for name, s in shapes.items()}


def _row_elements(plan: ProfilePlan, point: int) -> int:
    """The elements of one row of every input at a point (the whole input where dimension 0 is no batch)."""
    shapes = plan.point(point)
    b = _batch(plan, shapes)
    return sum(math.prod(s) // (b if s and s[0] == b else 1) for s in shapes.values())


@dataclass(frozen=True)
class ProfileCost:
    """The cost of the profile, as the CLI measured and predicted it: the memory ONNX Runtime needs at the max
    (whole batch, and one sample) with the machine's available and total memory and what the budget lets a run
    take; one timed FP32 pass (its shape and seconds) and the stages' seconds extrapolated from it."""
    max_shape: str
    peak: int  # bytes: weights, inputs and a run at the max, whole batch
    sample_peak: int  # the same for one sample at the max
    sample_run: int  # what a run of one sample adds (what the budget is held against)
    weights: int
    available: int | None
    total: int | None
    budget: int | None  # what the memory budget lets a run take now (TRTFLOW_MEMORY_BUDGET)
    timed_shape: str = ""
    pass_s: float | None = None
    stages_s: dict[str, float] = field(default_factory=dict)

    def warning(self) -> str | None:
        """Said when the max needs more memory than the machine has available."""
        if self.available is None or self.peak <= self.available:
            return None
        said = (f"the profile's max ({self.max_shape}) needs an estimated {_gib(self.peak)} on ONNX Runtime, more "
                f"than this machine has available ({_gib(self.available)}"
                + (f" of {_gib(self.total)}" if self.total else "") + ")")
        if self.budget is not None and self.sample_run > self.budget:
            return said + (f"; one sample needs {_gib(self.sample_peak)}, over the memory budget "
                           f"({_gib(self.budget)}): validate will refuse it; give --shape with a smaller max")
        return said + (f": the stages run its batch in parts that fit the memory budget (TRTFLOW_MEMORY_BUDGET; "
                       f"one sample needs {_gib(self.sample_peak)}), or give --shape with a smaller max")

    def lines(self) -> list[str]:
        """The file's comment lines on the cost."""
        have = f"{_gib(self.available)} available" if self.available is not None else "its available memory unknown"
        said = [f"memory: ONNX Runtime at the max ({self.max_shape}) needs an estimated {_gib(self.peak)} (one sample "
                f"{_gib(self.sample_peak)}, weights {_gib(self.weights)}); this machine has {have}"
                + (f" of {_gib(self.total)}" if self.total else "")
                + (f", of which a run may take {_gib(self.budget)} (TRTFLOW_MEMORY_BUDGET)" if self.budget else "")]
        if self.pass_s is not None:
            stages = ", ".join(f"{k} {_time(v)}" for k, v in self.stages_s.items())
            said.append(f"time on this CPU: one FP32 pass at {self.timed_shape} took {self.pass_s:.3g} s; ONNX "
                        f"Runtime's passes come to roughly: {stages} ({_time(sum(self.stages_s.values()))} in all, "
                        f"TensorRT's builds apart)")
        if warning := self.warning():
            said.append("WARNING: " + warning)
        return said
