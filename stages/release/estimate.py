"""An engine's speed on its target GPU estimated from its variant's composition, for ranking variants of different
precisions where no GPU measured them: a CPU stand-in (ONNX Runtime) runs FP32 fastest and emulates FP16 and INT8
slower, the opposite of a GPU's tensor cores, so its numbers may rank engines of one precision, never across them.

The estimate is a sum of compute and memory time: each precision's multiply-accumulates at that class's dense
tensor-core (FP16, INT8) or CUDA-core (FP32) peak, and the bytes moved (weights as stored, the other ops' outputs
written and read once at their precision) at its memory bandwidth. Kernels reach a fraction of peak, the same for
every variant on one GPU, so the estimate orders variants; its absolute number is an upper bound on speed, never a
measurement.
"""
from __future__ import annotations

from pydantic import BaseModel

from trtflow.stages.onnx.records import Composition

MAC = 2  # floating-point operations per multiply-accumulate, as peak TFLOPS count them
_BYTES = {"int8": 1, "fp16": 2, "fp32": 4}


class GpuClass(BaseModel):
    """A compute capability's peak rates, from one GPU of it named with its source. Tensor-core FP16 with FP32
    accumulation (TensorRT's default for FP16 layers), dense (no sparsity)."""
    target: str  # "sm86"
    gpu: str  # the GPU the figures are of
    fp32_tflops: float
    fp16_tflops: float
    int8_tops: float
    bandwidth_gbs: float
    source: str

    def peak(self, precision: str) -> float:
        """Multiply-accumulates per second at `precision`."""
        rate = {"int8": self.int8_tops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops}[precision]
        return rate * 1e12 / MAC


CLASSES = {c.target: c for c in (
    GpuClass(target="sm75", gpu="GeForce RTX 2080 Ti", fp32_tflops=13.4, fp16_tflops=53.8, int8_tops=215.2,
             bandwidth_gbs=616, source="NVIDIA Turing GPU Architecture whitepaper"),
    GpuClass(target="sm80", gpu="A100 40GB", fp32_tflops=19.5, fp16_tflops=312, int8_tops=624,
             bandwidth_gbs=1555, source="NVIDIA A100 Tensor Core GPU datasheet"),
    GpuClass(target="sm86", gpu="GeForce RTX 3090", fp32_tflops=35.6, fp16_tflops=71, int8_tops=284,
             bandwidth_gbs=936, source="NVIDIA Ampere GA102 GPU Architecture whitepaper"),
    GpuClass(target="sm89", gpu="GeForce RTX 4090", fp32_tflops=82.6, fp16_tflops=165.2, int8_tops=660.6,
             bandwidth_gbs=1008, source="NVIDIA Ada GPU Architecture whitepaper"),
    GpuClass(target="sm90", gpu="H100 SXM5", fp32_tflops=67, fp16_tflops=989.4, int8_tops=1978.9,
             bandwidth_gbs=3350, source="NVIDIA H100 Tensor Core GPU datasheet"),
    GpuClass(target="sm120", gpu="GeForce RTX 5090", fp32_tflops=104.8, fp16_tflops=209.5, int8_tops=838,
             bandwidth_gbs=1792, source="NVIDIA RTX Blackwell GPU Architecture whitepaper"),
)}
# the class assumed where the target names none this table has (the oldest TensorRT-RTX builds for): the ratios
# between precisions that order variants are alike on every tensor-core GPU
ASSUMED = "sm75"


class Estimate(BaseModel):
    """One engine's estimated speed on its target's GPU class."""
    gpu: str  # "sm86 (GeForce RTX 3090 figures)", "sm75 assumed (...)"
    samples_per_s: float
    compute_ms: float  # per inference at the composition's shapes
    memory_ms: float
    batch: int

    def text(self) -> str:
        return f"~{self.samples_per_s:,.0f}/s"


def gpu_class(target: str, built_on: list[str]) -> tuple[GpuClass, str]:
    """The class of `target` ("sm86"; "native": the GPU it was built on, compute capabilities as "8.6"), and how
    it was chosen, said in the estimate."""
    named = target if target.startswith("sm") else next((f"sm{cc.replace('.', '')}" for cc in built_on), None)
    if named in CLASSES:
        c = CLASSES[named]
        return c, f"{named} ({c.gpu} figures)"
    c = CLASSES[ASSUMED]
    why = f"{named} is not in the table" if named else f"target {target} names no GPU and none was on the machine"
    return c, f"{ASSUMED} assumed ({why}; {c.gpu} figures)"


def estimate(c: Composition, gpu: GpuClass, said: str) -> Estimate:
    """`c`'s speed on `gpu`: compute and memory time of one inference at its shapes, the samples of its batch."""
    compute = sum(c.macs * getattr(c.mac_share, p) / gpu.peak(p) for p in _BYTES)
    moved = c.weight_bytes + sum(2 * c.elements * getattr(c.other_share, p) * _BYTES[p] for p in _BYTES)
    memory = moved / (gpu.bandwidth_gbs * 1e9)
    batch = min((dims[0] for dims in c.shapes.values() if dims), default=1) or 1  # as benchmark counts samples
    seconds = max(compute + memory, 1e-9)
    return Estimate(gpu=said, samples_per_s=batch / seconds, compute_ms=compute * 1e3, memory_ms=memory * 1e3,
                    batch=batch)
