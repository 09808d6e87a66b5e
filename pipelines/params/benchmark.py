"""Stage `benchmark`: latency and throughput per engine (trtexec or the built-in harness), gated."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from trtflow.pipelines.row import MODEL_MAKERS, PREPROCESS_SLOT, TENSORRT_AND_GPU, Kind, SharedArea, Slot
from trtflow.pipelines.schema import SampleData, StageBase
from trtflow.pipelines.units import Duration, Fraction
from trtflow.strict import Strict


class GateSpec(Strict):
    """Fail the stage when an engine is slower than its baseline by more than these shares (a baseline measured in
    another environment is skipped, with the reason)."""
    baseline: str = Field("previous", description="'previous' (the last accepted run of the same engines) or a path "
                                                  "to a report.json")
    p99_regression: Fraction | None = Field(None, description="largest rise of the p99 latency", examples=["50%"])
    mean_regression: Fraction | None = Field(None, description="largest rise of the mean latency")
    throughput_regression: Fraction | None = Field(None, description="largest fall of the throughput",
                                                   examples=["10%"])


class BenchmarkStage(StageBase):
    kind: Literal["benchmark"] = Field(description="this section's kind")
    tool: Literal["auto", "trtexec", "builtin"] = Field(
        "auto", description="auto: trtexec where found, else the built-in harness (the engine on a GPU that can "
                            "run it, else its ONNX variant on ONNX Runtime, labelled as such)")
    trtexec: str | None = Field(None, description="path of trtexec (default: PATH, TENSORRT_ROOT, usual places)")
    shapes: list[Literal["min", "opt", "max"]] = Field(
        default_factory=lambda: ["opt"], min_length=1, description="which shapes of each profile to measure")
    warmup: Duration = Field(0.2, description="untimed runs first, for this long")
    duration: Duration = Field(3.0, description="timed runs for this long (unless iterations)", examples=["1s", "10s"])
    iterations: int | None = Field(None, ge=1, le=10_000_000, description="timed runs: this many instead of a "
                                                                          "duration")
    min_iterations: int = Field(20, ge=1, le=1_000_000, description="timed iterations at least, whatever the "
                                                                     "duration: a p99 needs samples")
    data: SampleData = Field(default_factory=lambda: SampleData(random=True, samples=1), description=(
        "the inputs the built-in harness feeds (its first sample): random by default, within `ranges` "
        "(integer inputs indexing a table stay within it), or saved tensors"))
    trtexec_args: list[str] = Field(default_factory=list, description="more trtexec options; one the detected "
                                                                      "version lacks is refused",
                                    examples=[["--useCudaGraph"]])
    gate: GateSpec | None = Field(None, examples=[{"baseline": "previous", "throughput_regression": "10%",
                                                   "p99_regression": "20%"}])

    def executes(self) -> list[str]:
        if self.tool == "builtin":
            return []
        where = self.trtexec or "the first found on PATH, under TENSORRT_ROOT or in the usual places"
        return [f"trtexec: {where} (a program)"]

    def data_globs(self) -> dict[str, tuple[str, tuple]]:
        globs = super().data_globs()
        if self.gate is not None and self.gate.baseline != "previous":
            globs["baseline"] = (self.gate.baseline, ("gate", "baseline"))
        return globs


HISTORY = SharedArea("benchmark/", 16 * 2**20)  # the accepted runs the gate compares with, on every machine

KIND = Kind("benchmark", BenchmarkStage,
            slots={"engines": Slot("engines", required=False, prefer=("build",)),
                   "models": Slot("onnx", many=True, required=False, prefer=MODEL_MAKERS),
                   # validate's verdict: only the candidates that passed are measured; and its repaired engines
                   "validation": Slot("json", required=False, prefer=("validate",)),
                   "repaired": Slot("engines", required=False, prefer=("validate",)),
                   "preprocess": PREPROCESS_SLOT},
            outputs={"report": "json", "plots": "plots"},  # plots: the latency distributions
            libraries=("onnx", "onnxruntime", "opencv-python-headless"),
            preload=("onnxruntime", "cv2", "matplotlib.pyplot"),
            env=lambda p: TENSORRT_AND_GPU,
            gpu=lambda p: True,
            gpu_alone=True,  # a build or validate beside it on the same GPU would be in its numbers
            # the accepted results a `baseline: previous` gate compares with, and each engine's measurements on
            # each machine (the noise across runs the release weighs): outside the key, like timing caches
            shared_caches=lambda p: ("baselines",),
            shared=(HISTORY,))
