"""Rewrites of nodes TensorRT's ONNX parser refuses into nodes it takes (issue #68): the contract (`rule.py`), the
built-in rules (one module per op family), the library `RULES`, and `apply` (one rule on one node of a model)."""
from __future__ import annotations

from trtflow.stages.onnx.rewrites.audio import MelWeightMatrixAsConstant
from trtflow.stages.onnx.rewrites.deformconv import DeformConvGridSample
from trtflow.stages.onnx.rewrites.dft import DftMatMul
from trtflow.stages.onnx.rewrites.elementwise import DropoutWithoutRatio, ModFloorOnFloats
from trtflow.stages.onnx.rewrites.geometry import AffineGridAsMatMul, CenterCropPadAsSlicePad, Col2ImAsConvTranspose
from trtflow.stages.onnx.rewrites.integer import ConvIntegerAsConv, DynamicQuantizeLinearAsFloat, MatMulIntegerAsMatMul
from trtflow.stages.onnx.rewrites.linalg import DetByCofactors
from trtflow.stages.onnx.rewrites.microsoft import (
    BiasGeluAsGelu,
    FastGeluAsGelu,
    FusedMatMulAsMatMul,
    QuickGeluAsSigmoid,
    SkipLayerNormalizationAsLayerNorm,
)
from trtflow.stages.onnx.rewrites.ml import NormalizerAsReduceDiv, ScalerAsSubMul
from trtflow.stages.onnx.rewrites.pooling import LpPoolAsConv
from trtflow.stages.onnx.rewrites.resize import ResizeMatMul
from trtflow.stages.onnx.rewrites.rule import OpKey, Rewrite
from trtflow.stages.onnx.rewrites.scatter import ScatterElementsReduction, ScatterNDReduction
from trtflow.stages.onnx.rewrites.selection import CompressAsGather, MaxUnpoolAsScatter

# every built-in rule, in the order they are tried for a node
RULES: tuple[Rewrite, ...] = (
    DeformConvGridSample(), ScatterElementsReduction(), ScatterNDReduction(), ResizeMatMul(), DftMatMul(),
    ModFloorOnFloats(), DropoutWithoutRatio(), LpPoolAsConv(), CenterCropPadAsSlicePad(), AffineGridAsMatMul(),
    Col2ImAsConvTranspose(), DetByCofactors(), MelWeightMatrixAsConstant(), SkipLayerNormalizationAsLayerNorm(),
    FusedMatMulAsMatMul(), BiasGeluAsGelu(), FastGeluAsGelu(), QuickGeluAsSigmoid(), ScalerAsSubMul(),
    NormalizerAsReduceDiv(), CompressAsGather(), MaxUnpoolAsScatter(), DynamicQuantizeLinearAsFloat(),
    ConvIntegerAsConv(), MatMulIntegerAsMatMul(),
)


def rules_for(op_type: str, domain: str = "") -> list[Rewrite]:
    """The built-in rules keyed by this op (none: no rewrite for it)."""
    key = OpKey(op_type, "" if domain in ("", "ai.onnx") else domain)
    return [r for r in RULES if r.op == key]


__all__ = ["RULES", "OpKey", "Rewrite", "rules_for"]
