"""Build one engine (one cell of the build matrix) in its own process (`trtflow.child`'s convention:
`python -m trtflow.stages.trt.build_worker spec.json build.json`).

A crash inside the TensorRT library ends this process only; the build stage reports that cell as failed.
Reads the cell's `spec.json` (`records.Cell`), or where the pipeline declares plugins a `BuildRequest` beside it;
writes `engine.plan`, `build.log` and `build.json` (`records.Built`) beside it.
"""
from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

from trtflow import files
from trtflow.child import serve
from trtflow.stages.trt import plugins as trt_plugins
from trtflow.stages.trt.engines import PLAN
from trtflow.stages.trt.log_errors import first_error, shorten
from trtflow.stages.trt.records import Built, BuiltOn, Cell, Validity

SEVERITY = {"error": "ERROR", "warning": "WARNING", "info": "INFO", "verbose": "VERBOSE"}
REQUEST = ".request.json"  # a BuildRequest, in the cell's folder while its worker runs (spec.json stays the Cell)


class BuildRequest(Cell):
    """A cell and the plugins its worker loads before the parse."""
    plugins: list[trt_plugins.PluginLoad] = []


def build(spec: BuildRequest, cell: Path) -> Built:
    from trtflow.pipelines.schema import BuilderOptions
    from trtflow.stages.trt import config as trt_config
    from trtflow.stages.trt import parse as trt_parse

    be = spec.backend
    t0 = time.perf_counter()
    trt_plugins.load(spec.plugins, be.module)
    model = spec.model_file(cell.parent)
    parsed = trt_parse.parse(be, model, SEVERITY[spec.log_severity])
    trt, builder, network, log_lines = parsed.trt, parsed.builder, parsed.network, parsed.log
    warnings: list[str] = []
    try:
        if not parsed.ok:
            found = trt_parse.failures(parsed.parser, model)
            raise BuildError("parse failed: " + "; ".join(f"{f.node} ({f.op_type}): {f.reason}" for f in found[:5]),
                             failures=found)
        options = BuilderOptions.model_validate(spec.options)  # typed again on this side of the process
        trt_config.check(options, trt, be, [spec.target])
        config = builder.create_builder_config()
        applied = trt_config.apply(options, trt, config, spec.target)
        cache = None
        if spec.timing_cache:
            known, warning = timing_cache(Path(spec.timing_cache))
            if warning:
                warnings.append(warning)
                log_lines.append(f"[trtflow] {warning}")
            cache = config.create_timing_cache(known)
            config.set_timing_cache(cache, ignore_mismatch=False)
        for prof in spec.profiles:
            p = builder.create_optimization_profile()
            for name, (lo, opt, hi) in prof.shapes.items():
                p.set_shape(name, lo, opt, hi)
            config.add_optimization_profile(p)
        engine = builder.build_serialized_network(network, config)
        if engine is None:
            raise BuildError("the builder returned no engine: "
                             + first_error(log_lines, shorten(log_lines[-1]) if log_lines else "no log"))
        data = bytes(engine)
        seconds = time.perf_counter() - t0
        with open(cell / PLAN, "xb") as out:  # a new file: an engine is never written into one that may be linked
            out.write(data)
        if cache is not None:
            files.write_atomic(spec.timing_cache, bytes(config.get_timing_cache().serialize()))
        from trtflow.stages.trt.env import gpus
        from trtflow.stages.trt.records import TensorRT
        return Built(status="ok", runtime=f"{spec.backend.flavour} {spec.backend.version}", seconds=round(seconds, 3),
                     engine_bytes=len(data), engine_sha256=files.sha256(cell / PLAN),
                     layers=network.num_layers, options=applied, warnings=warnings,
                     validity=validity(trt, parsed.logger, data, log_lines),
                     environment=BuiltOn(tensorrt=TensorRT(flavour=spec.backend.flavour, version=spec.backend.version),
                                         gpu=gpus() or None),
                     **dict(trt_parse.io_tensors(network)))
    finally:
        (cell / "build.log").write_text("\n".join(log_lines) + "\n")


def timing_cache(path: Path) -> tuple[bytes, str | None]:
    """The shared timing cache's bytes (none yet: empty), and why it was ignored where it cannot be read: a FIFO
    would block this process until its time limit, a device never ends."""
    try:
        return files.read_bounded(path, files.TIMING_CACHE_BYTES, follow=False), None
    except FileNotFoundError:
        return b"", None
    except OSError as exc:
        why = exc.strerror if isinstance(exc, files.NotAFile) else f"{path}: {exc.strerror or exc}"
        return b"", f"the timing cache was not read ({why}): built without it; this build's replaces it"


class BuildError(Exception):
    def __init__(self, message: str, failures: list | None = None):
        super().__init__(message)
        self.failures = failures or []


def validity(trt: Any, logger: Any, data: bytes, log_lines: list[str]) -> Validity:
    """Whether this machine could run the engine (TensorRT-RTX answers without a GPU); None where unknown."""
    runtime = trt.Runtime(logger)
    if not hasattr(runtime, "get_engine_validity"):
        return Validity(checked=False, reason="this TensorRT has no Runtime.get_engine_validity")
    state, diagnostics = runtime.get_engine_validity(data)
    from trtflow.stages.trt.runtime import diagnostic_names

    names = diagnostic_names(trt, diagnostics)
    result = Validity(checked=True, validity=str(state).split(".")[-1], diagnostics=names)
    if str(state).endswith("INVALID") and not names:  # e.g. no GPU or driver at all: the log says which
        result.reason = next((ln for ln in reversed(log_lines) if "GPU" in ln or "CUDA" in ln), None)
    return result


def handle(spec: BuildRequest, cell: Path) -> Built:
    try:
        built = build(spec, cell)
    except BuildError as exc:
        built = Built(status="failed", error=str(exc), failures=exc.failures)
    except trt_plugins.PluginError as exc:
        built = Built(status="failed", error=str(exc))
    except Exception as exc:  # noqa: BLE001 - reported in build.json; the cell fails, not the stage process
        built = Built(status="failed", error=f"{type(exc).__name__}: {exc}")
    built.peak_host_memory_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return built


if __name__ == "__main__":
    raise SystemExit(serve(BuildRequest, handle))
