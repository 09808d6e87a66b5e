"""Builder options, typed once (`BuilderOptions` in the schema), checked against the installed TensorRT and
applied to an `IBuilderConfig` here and nowhere else, as Polygraphy's `CreateConfig` does.

`check` refuses what the installed flavour lacks (rather than ignoring it): the build stage calls it before any
cell starts, and each build worker calls it again on the options it was handed, after validating them anew.
"""
from __future__ import annotations

from typing import Any

from trtflow.errors import StageError
from trtflow.pipelines.schema import BuilderOptions
from trtflow.stages.trt.records import AppliedOptions, Backend
from trtflow.text import did_you_mean

# option -> the IBuilderConfig attribute it sets
ATTRIBUTES = {"optimization_level": "builder_optimization_level", "aux_streams": "max_aux_streams",
              "hardware_compatibility": "hardware_compatibility_level"}
# option -> the BuilderFlag it sets
FLAGS = {"version_compatible": "VERSION_COMPATIBLE", "strip_plan": "STRIP_PLAN", "weight_streaming": "WEIGHT_STREAMING"}
HARDWARE_LEVELS = {"none": "NONE", "ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}
NATIVE = "native"


def known_targets(trt: Any) -> list[str]:
    """Compute capabilities a TensorRT-RTX build can target (sm75, sm80, ...); none for full TensorRT."""
    enum = getattr(trt, "ComputeCapability", None)
    return sorted(m.lower() for m in (enum.__members__ if enum else ()) if m.startswith("SM"))


def check(options: BuilderOptions, trt: Any, backend: Backend, targets: list[str]) -> None:
    """Refuse every option (and target) the installed TensorRT flavour cannot honour, with the reason."""
    name = f"{backend.flavour} {backend.version}"
    rtx = backend.flavour == "tensorrt-rtx"
    if options.legacy_precision and (rtx or backend.major >= 11):
        raise StageError(f"build: legacy_precision ({', '.join(options.legacy_precision)}) needs TensorRT 10's "
                         f"builder flags, which {name} does not have: precision comes from the ONNX (use the "
                         f"precision/calibrate stages' models)")
    if rtx and options.hardware_compatibility is not None:
        # the attribute exists, but TensorRT-RTX ignores it ("setHardwareCompatibilityLevel() is unsupported")
        raise StageError(f"build: hardware_compatibility is not supported by {name} (it ignores the setting); "
                         f"TensorRT-RTX chooses GPUs with targets: [sm80, sm86, ...]")
    for flag in options.legacy_precision:
        if not hasattr(trt.BuilderFlag, flag.upper()):
            raise StageError(f"build: legacy_precision {flag}: {name} has no BuilderFlag.{flag.upper()}")
    for option, attribute in ATTRIBUTES.items():
        if getattr(options, option) is not None and not hasattr(trt.IBuilderConfig, attribute):
            raise StageError(f"build: {option} is not available in {name} (no IBuilderConfig.{attribute})")
    for option, flag in FLAGS.items():
        if getattr(options, option) and not hasattr(trt.BuilderFlag, flag):
            raise StageError(f"build: {option} is not available in {name} (no BuilderFlag.{flag})")
    chosen = [t for t in targets if t != NATIVE]
    if chosen and not rtx:
        raise StageError(f"build: targets {chosen}: choosing compute capabilities needs TensorRT-RTX; "
                         f"TensorRT builds for the GPU it runs on (use targets: [native])")
    known = known_targets(trt)
    for t in chosen:
        if t.lower() not in known:
            raise StageError(f"build: unknown target '{t}' for {name}; known: {', '.join(known)}"
                             f"{did_you_mean(t.lower(), known)}")


def apply(options: BuilderOptions, trt: Any, config: Any, target: str) -> AppliedOptions:
    """Set the checked options on `config`; returns what was set (recorded in each cell's build.json)."""
    applied = AppliedOptions()
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level
        applied.optimization_level = options.optimization_level
    if options.workspace is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace)
        applied.workspace = options.workspace
    if options.aux_streams is not None:
        config.max_aux_streams = options.aux_streams
        applied.aux_streams = options.aux_streams
    if options.hardware_compatibility is not None:
        level = HARDWARE_LEVELS[options.hardware_compatibility]
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, level)
        applied.hardware_compatibility = options.hardware_compatibility
    for option, flag in FLAGS.items():
        if getattr(options, option):
            config.set_flag(getattr(trt.BuilderFlag, flag))
            setattr(applied, option, True)
    for flag in options.legacy_precision:  # TensorRT 10 only; refused by check() elsewhere
        config.set_flag(getattr(trt.BuilderFlag, flag.upper()))
    if options.legacy_precision:
        applied.legacy_precision = list(options.legacy_precision)
    if target != NATIVE:
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, target.upper()), 0)
        applied.compute_capability = target
    return applied
