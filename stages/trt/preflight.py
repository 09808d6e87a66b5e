"""TensorRT pre-flight: parse the model with the real TensorRT ONNX parser and list every node it rejects.

The parse runs in a child process (`trtflow.child`'s convention), so a crash inside the native parser fails the
pre-flight with a message instead of taking the pipeline down. A child killed from outside, or at the time limit,
gave no answer: that is a crash of the stage (retried), never a report. The report and its trial builds
(`PreflightReport`, `TrialBuild`, `VariantTrial`) are records of `records.py`.
"""
from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trtflow import child, phases
from trtflow.errors import TransientStageError
from trtflow.stages.trt import plugins as trt_plugins
from trtflow.stages.trt.env import INSTALL_HINT, find_tensorrt
from trtflow.stages.trt.log_errors import first_error, shorten
from trtflow.stages.trt.parse import PLUGIN_LOOKUP
from trtflow.stages.trt.records import Backend, ParseFailure, PreflightReport, TrialBuild

TIMEOUT_S = 900

def hint_for(failure: ParseFailure) -> str:
    """Why the parser refused the node, from its own fields (the error's code, the function that raised it, and
    whether it has an importer for the op), and what can be done (prepare says which rewrite of its applies)."""
    return f"{cause_of(failure)}; {no_rewrite(failure)}"


def no_rewrite(f: ParseFailure) -> str:
    return (f"declare a TensorRT plugin named '{f.op_type}' under the pipeline's plugins: (a library, or a Python "
            f"module of yours; docs/guides/unsupported-ops.md#plugins), move it out of the model (run it on the "
            f"host), or give prepare.rewrites a function of yours that replaces it")


def cause_of(f: ParseFailure) -> str:
    op, reason = f.op_type, f.reason
    if "DequantizeLinear" in op and "INT32" in reason.upper():
        return "a quantized bias (TensorRT refuses INT32 DequantizeLinear): quantize with QuantizeBias=False"
    if "opset" in reason.lower():
        return f"the model's opset may be newer than this parser takes ({reason}): set prepare.target_opset lower"
    if PLUGIN_LOOKUP in f.where:  # the reason names the plugin it looked up (parse.plugin_wanted)
        return f"the parser has no importer for '{op}' ({f.domain or 'ai.onnx'}), and {reason}"
    if f.domain not in ("", "ai.onnx"):
        return (f"the parser has no importer for '{op}' ({f.domain}) and found no plugin named '{op}' to stand in "
                f"for it")
    if "plugin" in reason.lower():
        return f"this TensorRT implements '{op}' with a plugin it cannot create here ({reason})"
    if f.code == "UNSUPPORTED_NODE_ATTR":
        return f"the parser takes '{op}', but not with this attribute ({reason})"
    if "importInput" in f.where or "INPUT" in f.code:
        return f"the parser cannot take this input's type ({reason})"
    if f.importer is False:
        return f"the parser has no importer for '{op}'"
    return f"the parser refuses this '{op}' node ({reason})"


# what a failed trial build's log says -> what the user can do about it
BUILD_HINTS = (
    (("graphScope", "ScopeType::kUNDEFINED"),
     "TensorRT cannot build this model's control flow (If/Loop); seen with an LSTM/GRU/RNN inside an If branch "
     "whose Y output is unused (a torch LSTMCell): read Y in the branch (Y_h = Y[-1]), resolve the branch at "
     "export (one model per sample rate), or run that part outside the engine"),
    (("violate shape constraints", "reshape changes volume"),
     "the trial shapes contradict the model's own shape constraints (a shape baked into a Reshape?): set "
     "prepare.input_shapes to the shapes it runs with, or re-export with dynamic axes"),
    (("Could not find any implementation", "no implementation"),
     "TensorRT has no kernel for a layer at these shapes and types: see the log; try another precision variant"),
)
NEEDS_GPU = ("CUDA_SUCCESS", "cudaError", "CUDA driver version is insufficient")


def build_hint(error: str) -> str:
    return next((hint for keys, hint in BUILD_HINTS if any(k in error for k in keys)),
                "see the builder's log in the report")


class PreflightRequest(BaseModel):
    model: str
    plugins: list[trt_plugins.PluginLoad] = []  # loaded before the parse
    shapes: dict[str, list[int]] | None = None  # build a trial engine at these shapes
    min_shapes: dict[str, list[int]] | None = None  # ... with a profile from these up to `shapes` (dynamic dims)
    opt_shapes: dict[str, list[int]] | None = None  # ... and this opt (default: `shapes`)


class PreflightAnswer(BaseModel):
    """The pre-flight child's answer: its report, or why a declared plugin did not load (then nothing was parsed)."""
    report: PreflightReport | None = None
    plugin_error: str | None = None


def run_preflight(model: Path, shapes: dict[str, list[int]] | None = None,
                  timeout: float = TIMEOUT_S, min_shapes: dict[str, list[int]] | None = None,
                  opt_shapes: dict[str, list[int]] | None = None,
                  plugins: Sequence[trt_plugins.PluginLoad] | None = None) -> PreflightReport:
    """Parse in a child process and, with `shapes` (input -> concrete shape), build a trial engine at those
    shapes (with `min_shapes`, at a profile from them up to `shapes`, its opt `opt_shapes` or `shapes`: some
    builds fail only with dynamic dimensions). Returns a report; `ran` says whether a parser was actually used. A
    pre-flight that gave no answer because it was killed (from outside, or at `timeout`) raises
    TransientStageError: a report saying it did not run would be published, and reused, as if it had. `plugins`
    (default: the pipeline's, `declared`) are loaded first; one that does not load raises its PluginError."""
    trt = find_tensorrt()
    if trt is None:
        return PreflightReport(ran=False, reason=f"no TensorRT flavour is installed ({INSTALL_HINT})")
    loads = trt_plugins.declared() if plugins is None else list(plugins)
    request = PreflightRequest(model=str(model), shapes=shapes, min_shapes=min_shapes, opt_shapes=opt_shapes,
                               plugins=loads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trtflow-preflight-") as folder:
        outcome = child.call("trtflow.stages.trt.preflight", request, PreflightAnswer, Path(folder), timeout,
                             what="the TensorRT pre-flight", env=trt_plugins.child_env(trt, loads))
    if isinstance(outcome, child.TimedOut):  # killed at the limit: no answer, so no result either
        raise TransientStageError(f"the TensorRT pre-flight {outcome.text()}: no answer; run again, or set "
                                  f"preflight: off")
    if isinstance(outcome, child.Crashed):  # the parser crashed on the model (killed from outside: `call` raised)
        return PreflightReport(ran=False, runtime=_label(trt), reason=f"the TensorRT parser process "
                               f"{outcome.text()}")
    if outcome.response.report is None:
        raise trt_plugins.PluginError(outcome.response.plugin_error or "the TensorRT pre-flight gave no report")
    answer = outcome.response.report
    builder = answer.trial_build.seconds if answer.trial_build and answer.trial_build.seconds else 0.0
    phases.add("the TensorRT pre-flight's process beyond its trial build (start-up, parsing)",
               time.perf_counter() - started - builder)
    for f in answer.failures:
        f.hint = hint_for(f)
    trial = answer.failed_build()
    if trial is not None:
        trial.hint = "the build needs a GPU at build time here, not a model problem" if trial.needs_gpu \
            else build_hint(trial.detail or trial.error or "")
    return answer


def _label(trt: Backend) -> str:
    return f"{trt.flavour} {trt.version} parser"


def _parse(request: PreflightRequest, folder: Path) -> PreflightAnswer:
    from trtflow.stages.trt import parse as trt_parse

    model, shapes = Path(request.model), request.shapes
    trt_info = find_tensorrt()
    assert trt_info is not None
    try:
        trt_plugins.load(request.plugins, trt_info.module)
    except trt_plugins.PluginError as exc:
        return PreflightAnswer(plugin_error=str(exc))
    parsed = trt_parse.parse(trt_info, model)
    report = PreflightReport(ran=True, runtime=_label(trt_info), parsed=parsed.ok,
                             failures=trt_parse.failures(parsed.parser, model), log=parsed.log[-50:])
    if parsed.ok:
        report.layers = parsed.network.num_layers
        io = trt_parse.io_tensors(parsed.network)
        report.inputs, report.outputs = io.inputs, io.outputs
        if shapes is not None:
            report.trial_build = _trial_build(parsed, shapes, request.min_shapes or {}, request.opt_shapes or {})
    return PreflightAnswer(report=report)


def _trial_build(parsed: Any, shapes: dict[str, list[int]], min_shapes: dict[str, list[int]],
                 opt_shapes: dict[str, list[int]]) -> TrialBuild:
    """Build an engine at fixed shapes, or from `min_shapes` (through `opt_shapes`) up to them: parsing is not building (TensorRT-RTX can
    parse control flow it then cannot build)."""
    import time

    net, builder = parsed.network, parsed.builder
    fixed = {}
    for i in range(net.num_inputs):
        t = net.get_input(i)
        fixed[t.name] = [d if d >= 0 else s for d, s in zip(t.shape, shapes.get(t.name, list(t.shape)))]
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name, shape in fixed.items():
        if any(d < 0 for d in shape):
            return TrialBuild(ok=False, shapes=fixed, error=f"no concrete shape for input '{name}' {shape}")
        low, opt = min_shapes.get(name, shape), opt_shapes.get(name, shape)
        profile.set_shape(name, low if len(low) == len(shape) else shape, opt if len(opt) == len(shape) else shape,
                          shape)
    config.add_optimization_profile(profile)
    before = len(parsed.log)
    t0 = time.perf_counter()
    engine = builder.build_serialized_network(net, config)
    seconds = round(time.perf_counter() - t0, 3)
    if engine is None:
        errors = [ln for ln in parsed.log[before:] if ln.startswith("[ERROR]") or "Error" in ln]
        real = [e for e in errors if not any(k in e for k in NEEDS_GPU)]  # no GPU: CUDA errors are noise
        first = (real or errors or ["the builder returned no engine"])[0]
        return TrialBuild(ok=False, shapes=fixed, min_shapes=min_shapes or None, opt_shapes=opt_shapes or None,
                          seconds=seconds, needs_gpu=bool(errors) and not real,
                          error=first_error([first], shorten(first)),
                          detail=first[:2000], log=parsed.log[before:][-20:])
    return TrialBuild(ok=True, shapes=fixed, seconds=seconds, engine_bytes=len(bytes(engine)),
                      min_shapes=min_shapes or None, opt_shapes=opt_shapes or None)


if __name__ == "__main__":
    raise SystemExit(child.serve(PreflightRequest, _parse))
