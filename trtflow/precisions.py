"""The precision a model variant (and each engine built from it) computes in, as `stages.onnx.graph.precision`
tells it from the model: Q/DQ nodes make it INT8, FP16 weights or casts FP16, else FP32."""
from __future__ import annotations

from typing import Literal

Precision = Literal["fp32", "fp16", "int8"]
