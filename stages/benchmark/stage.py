"""Stage `benchmark`: every engine the build stage made, timed at its profiles' shapes — by trtexec where it is
installed, else by the built-in harness (the engine with CUDA events on a GPU that can run it; otherwise the
engine's ONNX variant on ONNX Runtime, labelled as such) — with GPU telemetry and a regression gate against a
baseline measured in the same environment."""
from __future__ import annotations

import json
import os
import platform
import tempfile
from pathlib import Path

import numpy as np
import onnx
from pydantic import TypeAdapter

from trtflow import child, files, progress
from trtflow.artifact import Inputs, StageResult
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.benchmark import BenchmarkStage
from trtflow.stage_code import StageCode
from trtflow.stages.benchmark import history, perf_gate
from trtflow.stages.benchmark.report import Baseline, BaselineReport, BenchmarkReport, Gate, MeasuredOn, Measurement
from trtflow.stages.ort import harness
from trtflow.stages.ort import runner as ort_runner
from trtflow.stages.ort.samples import SampleSource
from trtflow.stages.trt import plugins as trt_plugins
from trtflow.stages.trt.engines import Candidate, built_engines, engine_candidates
from trtflow.stages.trt.env import gpus
from trtflow.stages.trt.records import Profile
from trtflow.stages.trt.telemetry import Telemetry
from trtflow.stages.trtexec import command, exports
from trtflow.stages.trtexec.find import find_trtexec, trtexec_version
from trtflow.stages.trtexec.log import parse_summary
from trtflow.stages.trtexec.result import Layer, PerfResult
from trtflow.stages.validate.report import ValidateReport

VERSION = "5"  # 2: only what validate passed, and its repaired engines. 3: data block (ranges, tensors), each
# measurement in its own process, at least min_iterations, samples/s. 4: min_iterations overruling duration said
# (and passed to trtexec as --iterations). 5: each cell's spread across this machine's runs (history.py)
TRTEXEC_TIMEOUT_S = 1800
_BASELINES = TypeAdapter(dict[str, Baseline])  # a baseline file: cell -> what the gate compares


def run(params: BenchmarkStage, inputs: Inputs, out_dir: Path) -> StageResult:
    candidates, not_measured = _validated(inputs)
    trtexec, looked = (None, [])
    if params.tool in ("auto", "trtexec"):
        trtexec, looked = find_trtexec(params.trtexec)
        if trtexec is None and params.tool == "trtexec":
            raise StageError(f"benchmark: tool: trtexec, but no trtexec was found (looked in: {', '.join(looked)}); "
                             f"give its path as 'trtexec:' or use tool: auto for the built-in harness")
    trtexec = _without_python_plugins(trtexec, params.tool)
    version = trtexec_version(trtexec) if trtexec else None
    warnings = command.check_args(params.trtexec_args, version) if trtexec else []
    if trtexec is None and params.trtexec_args:
        warnings.append("trtexec_args are ignored: no trtexec here, the built-in harness measures instead")
    (out_dir / "logs").mkdir(exist_ok=True)
    cells = [(cand, profile, point) for cand in candidates for profile in (cand.profiles or [None])
             for point in params.shapes]
    results = []
    with Telemetry() as telemetry:
        for n, (cand, profile, point) in enumerate(cells):
            progress.report("benchmarking", n, len(cells))
            results.append(_measure(params, inputs, cand, profile, point, trtexec, version, out_dir))
    progress.report("benchmarking", len(cells), len(cells))
    tele = telemetry.summary()
    if tele.throttled:
        warnings.append(f"the GPU was throttled during the run ({', '.join(tele.throttled)}): the numbers are "
                        f"not its best")
    for cell in results:
        warnings += [f"{cell.cell}: {w}" for w in cell.result.warnings]
    _remember(inputs, candidates, results)
    gate = _gate(params, inputs, candidates, results)
    report = BenchmarkReport(tool="trtexec" if trtexec else "built-in harness",
                             trtexec=str(trtexec) if trtexec else None, trtexec_looked=looked,
                             tensorrt_version=version, cells=results, telemetry=tele, gate=gate, warnings=warnings,
                             not_measured=not_measured,
                             plots=_plot(results, out_dir))
    (out_dir / "report.json").write_text(report.model_dump_json(indent=2) + "\n")
    (out_dir / "plots").mkdir(exist_ok=True)
    result = StageResult(outputs={"report": out_dir / "report.json", "plots": out_dir / "plots"},
                         summary=report.summary(),
                         warnings=warnings + gate.skipped_lines,
                         metrics={"cells": len(results), "best_throughput_qps": max(
                             (c.result.throughput_qps or 0 for c in results), default=None)})
    failures = [c for c in results if not c.ok]
    if failures:
        first = failures[0]
        raise StageFailed(f"benchmark: {len(failures)} of {len(results)} measurement(s) failed; {first.cell}: "
                          f"{first.result.note}", result)
    if gate.violations:
        raise StageFailed(f"benchmark: {len(gate.violations)} regression(s) against {gate.baseline}: "
                          f"{gate.violations[0]}", result)
    if params.gate is not None and params.gate.baseline == "previous":
        _accept(inputs, candidates, results)
    return result


def _validated(inputs: Inputs) -> tuple[list[Candidate], dict[str, str]]:
    """The candidates to measure: every engine (or variant), and validate's repaired engines; with a validate
    stage, only those it passed (the others, with why, are not measured: they must not be deployed)."""
    candidates = engine_candidates(inputs.optional("engines"), inputs.many("models"), "benchmark")
    repaired = inputs.optional("repaired")
    if repaired is not None and built_engines(repaired.path):
        candidates += engine_candidates(repaired, [], "benchmark")
    validation = inputs.optional("validation")
    if validation is None:
        return candidates, {}
    verdict = ValidateReport.read(validation.path)
    refused = {c.name: verdict.refuses(c.name, c.variant) for c in candidates}
    not_measured = {name: why for name, why in refused.items() if why}
    kept = [c for c in candidates if not refused[c.name]]
    if not kept:
        first = next(iter(not_measured.items()))
        raise StageError(f"benchmark: no candidate passed validation ({first[0]}: {first[1]}): nothing to measure")
    return kept, not_measured


# ---------------------------------------------------------------------------------------------- one cell

def _shapes(cand: Candidate, profile: Profile | None, point: str) -> dict[str, list[int]]:
    if profile is None:
        return {}
    return profile.at(point)


def _feeds(params: BenchmarkStage, inputs: Inputs, cand: Candidate, shapes: dict[str, list[int]]
           ) -> dict[str, np.ndarray]:
    """The harness's inputs: the first sample of `data` at the cell's shapes (random within `data.ranges`, integer
    inputs that index a table within it; or saved tensors)."""
    model = onnx.load(str(cand.model), load_external_data=False)
    data = params.data.model_copy(update={"shapes": {**params.data.shapes, **shapes}, "samples": 1})
    return SampleSource(data, inputs, ort_runner.model_inputs(model), "benchmark", model).sample(0)


def _measure(params: BenchmarkStage, inputs: Inputs, cand: Candidate, profile: Profile | None, point: str,
             trtexec: Path | None, version: str | None, out_dir: Path) -> Measurement:
    name = f"{cand.name}.{point}" + (f"@{profile.name}" if profile and profile.name not in cand.name else "")
    shapes = _shapes(cand, profile, point)
    slowest: list[Layer] = []
    runnable, why = _engine_runs_here(cand)  # asked once: trtexec and the built-in harness both need it
    if trtexec is not None and not runnable and params.tool == "trtexec":
        raise StageError(f"benchmark: engine '{cand.name}' cannot run here, so trtexec cannot time it: {why}; use "
                         f"tool: auto to measure its ONNX variant with the built-in harness")
    if runnable and trtexec is not None:
        result, slowest = _trtexec(params, cand, shapes, trtexec, version, out_dir / "logs" / name)
    else:
        feeds = _feeds(params, inputs, cand, shapes)
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        result = _builtin(params, cand, profile, feeds, runnable, out_dir / "logs" / name)
        if trtexec is not None:
            result.warnings.append(f"trtexec not used: {why}")
    env = MeasuredOn(runtime=(result.runtime or "").split(",")[0], tensorrt=result.tensorrt_version,
                     gpu="; ".join(f"{g.name} driver {g.driver}" for g in gpus()) or "none")
    if result.runtime and result.runtime.startswith(harness.RUNTIME.split(" ")[0]):
        env.runtime = result.runtime  # ONNX Runtime's version is part of it
        env.host = _cpu_name()
    samples = result.samples_ms
    overruled = _overruled(params, samples, result.total_host_walltime_s)
    if overruled:
        result.warnings.append(overruled)
    result.samples_ms = None
    batch = min((s[0] for s in shapes.values() if s), default=1)
    return Measurement(cell=name, candidate=cand.name, variant=cand.variant, precision=cand.precision,
                       profile=profile.name if profile else None, point=point, shapes=shapes, environment=env,
                       result=result.record(), slowest_layers=slowest[:10], samples_ms=samples, batch=batch,
                       samples_per_s=result.throughput_qps * batch if result.throughput_qps else None)


def _trtexec(params: BenchmarkStage, cand: Candidate, shapes: dict[str, list[int]], trtexec: Path, version: str | None,
             stem: Path) -> tuple[PerfResult, list[Layer]]:
    written = exports.ExportFiles.beside(stem)
    libraries = [p.file for p in trt_plugins.declared()]  # Python plugins left trtexec out (_without_python_plugins)
    timing = command.Timing(params.warmup, params.duration, params.iterations, params.min_iterations,
                            tuple(params.trtexec_args))
    cmd = command.compose(trtexec, cand.engine, shapes, timing, written, version, libraries)
    log = stem.with_suffix(".log")
    ended = child.run(cmd, TRTEXEC_TIMEOUT_S, log=log,  # killed from outside: no measurement, no result (retried)
                      what=f"benchmark: trtexec timing {cand.name} (log: {log})")
    if isinstance(ended, child.TimedOut):
        raise StageError(f"benchmark: trtexec did not finish within {TRTEXEC_TIMEOUT_S} s on {cand.name} "
                         f"(log: {log})")
    result = parse_summary(log.read_text(errors="replace"))
    result.runtime = f"trtexec (TensorRT {result.tensorrt_version or version or 'unknown'})"
    if ended.returncode != 0 and result.status != "failed":
        result.status, result.error = "failed", result.error or f"trtexec {child.ending(ended.returncode)}"
    slowest = exports.read_profile(written.profile).layers if written.profile.exists() else result.profile or []
    if written.times.exists():
        result.samples_ms = exports.read_times(written.times).gpu_compute_ms or None
    return result, slowest


def _without_python_plugins(trtexec: Path | None, tool: str) -> Path | None:
    """trtexec, unless the engines were built with a Python plugin, which trtexec cannot load (it loads libraries):
    then the built-in harness times them (tool: auto), or the stage refuses in one line (tool: trtexec)."""
    python = [p.label for p in trt_plugins.declared() if p.python]
    if trtexec is None or not python:
        return trtexec
    if tool == "trtexec":
        raise StageError(f"benchmark: trtexec cannot load the Python plugin {python[0]} the engines were built with",
                         hint="use tool: auto (the built-in harness imports it), or declare the plugin as a library")
    return None


def _engine_runs_here(cand: Candidate) -> tuple[bool, str]:
    """Whether this machine can execute the candidate's engine (the engine's own validity verdict), and why not."""
    if cand.chain is not None:
        return False, (f"'{cand.name}' is a chain of TensorRT and ONNX Runtime pieces (prepare: offload), which "
                       f"trtflow times on ONNX Runtime only: timing its engines with trtexec is not built")
    if cand.engine is None:
        return False, f"'{cand.name}' has no engine (no build stage)"
    from trtflow.stages.trt.runtime import can_run

    return can_run(cand.module or "tensorrt", cand.engine)


def _builtin(params: BenchmarkStage, cand: Candidate, profile: Profile | None, feeds: dict[str, np.ndarray],
             engine_runs: bool, stem: Path) -> PerfResult:
    if engine_runs:  # UNVERIFIED: no engine executes on the machines this project is tested on
        from trtflow.stages.trt.runtime import EngineRunner

        eng = EngineRunner(cand.module, cand.engine)
        index = next((i for i, p in enumerate(cand.profiles) if p is profile), 0)
        samples, wall = eng.time(feeds, index, params.warmup, params.duration, params.iterations,
                                 params.min_iterations)
        return PerfResult(status="passed", throughput_qps=len(samples) / wall,
                          gpu_compute_ms=harness.latency_stats(samples), total_host_walltime_s=wall,
                          layout="built-in harness", runtime=f"{cand.module} engine, CUDA events (unverified "
                          f"path)", samples_ms=samples)
    def announce(seconds: float) -> None:  # on the status line while it runs, when it will be long
        note = _long_estimate(params, seconds)
        if note:
            progress.report(f"benchmarking {stem.name}: {note}", 0, 1)

    with tempfile.TemporaryDirectory(prefix="trtflow-harness-") as folder:
        result = harness.benchmark(cand.model, feeds, params.warmup, params.duration, params.iterations,
                                   params.min_iterations, Path(folder), stem.with_suffix(".harness.log"), announce,
                                   cand.chain)
    if result.error:
        result.error = f"variant '{cand.variant}': {result.error}"
    return result


LONG_S = 30.0  # a measurement estimated to take longer than this (and than its duration) is announced first


def _long_estimate(params: BenchmarkStage, call_s: float) -> str | None:
    """What a cell will take where min_iterations makes it long: said before the timed runs."""
    if params.iterations is not None:
        return None
    total = params.warmup + max(params.duration, call_s * params.min_iterations)
    if total <= max(LONG_S, 2 * (params.warmup + params.duration)):
        return None
    return (f"about {total:.0f} s: min_iterations {params.min_iterations} runs of ~{call_s:.3g} s each overrule "
            f"duration {params.duration:g}s")


def _overruled(params: BenchmarkStage, samples_ms: list[float] | None, wall_s: float | None) -> str | None:
    """Where min_iterations, not duration, ended the timed runs: the duration had passed before the last run."""
    if params.iterations is not None or not samples_ms or wall_s is None or len(samples_ms) > params.min_iterations:
        return None
    if wall_s - samples_ms[-1] / 1000 < params.duration:
        return None
    return (f"min_iterations {params.min_iterations} overruled duration {params.duration:g}s: {len(samples_ms)} "
            f"timed runs of ~{float(np.median(samples_ms)) / 1000:.3g} s each took {wall_s:.1f} s (a p99 needs "
            f"samples; lower min_iterations, or give iterations, to bound the time)")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


# ---------------------------------------------------------------------------------------------- the gate

def _artifact_id(cand: Candidate) -> str:
    return files.sha256(cand.engine or cand.model)[:24]


def _remember(inputs: Inputs, candidates: list[Candidate], cells: list[Measurement]) -> None:
    """Every measured cell into its engine's history on this machine, and its spread across runs into the cell."""
    shared = inputs.optional("baselines")
    if shared is None:
        return
    for cand in candidates:
        history.add(history.path(shared.path, _artifact_id(cand)), [c for c in cells if c.candidate == cand.name])


def _baseline_file(inputs: Inputs, cand: Candidate) -> Path | None:
    shared = inputs.optional("baselines")
    return None if shared is None else shared.path / "benchmark" / f"{_artifact_id(cand)}.json"


def _gate(params: BenchmarkStage, inputs: Inputs, candidates: list[Candidate], cells: list[Measurement]) -> Gate:
    out = Gate()
    if params.gate is None:
        return out
    bounds = {k: getattr(params.gate, k) for k in perf_gate.METRICS}
    baseline: dict[str, Baseline] = {}
    if params.gate.baseline == "previous":
        out.baseline = "the last accepted run of the same engines"
        for cand in candidates:
            path = _baseline_file(inputs, cand)
            if path is not None and path.is_file():
                try:
                    baseline.update(_BASELINES.validate_python(files.read_json(path, files.RECORD_BYTES,
                                                                               follow=False)))
                except (OSError, ValueError, TypeError):
                    out.skipped.append(f"{path}: unreadable baseline, ignored")
    else:
        path = inputs.many("baseline")[0].path
        out.baseline = str(path)
        try:
            data = BaselineReport.model_validate(files.read_json(path, files.RECORD_BYTES))
            baseline = {c.cell: c for c in data.cells}
        except (OSError, ValueError, TypeError):
            raise StageError(f"benchmark: gate.baseline {path} is not a benchmark report.json (written by this "
                             f"stage): give one, or baseline: previous") from None
    violations, skipped = perf_gate.check(cells, baseline, bounds)
    out.violations, out.skipped = violations, out.skipped + skipped
    out.skipped_lines = [f"gate skipped {s}" for s in out.skipped[:5]]
    return out


def _accept(inputs: Inputs, candidates: list[Candidate], cells: list[Measurement]) -> None:
    """A run that passed becomes the baseline of its engines' next runs (gate baseline: previous)."""
    for cand in candidates:
        path = _baseline_file(inputs, cand)
        if path is None:
            continue
        mine = {c.cell: c.model_dump(include=set(Baseline.model_fields)) for c in cells
                if c.candidate == cand.name}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(mine, indent=2))
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- report

def _plot(cells: list[Measurement], out_dir: Path) -> list[str]:
    """The latency distribution of every cell that has per-iteration samples (kept out of report.json)."""
    samples = {c.cell: c.samples_ms for c in cells if c.samples_ms}
    for c in cells:
        if c.cell in samples:
            c.iterations = len(samples[c.cell])
    if not samples:
        return []
    from trtflow.stages.compare.plots import latency_histograms

    (out_dir / "plots").mkdir(exist_ok=True)
    path = latency_histograms(samples, out_dir / "plots" / "latency.png", "latency per iteration")
    return [path.relative_to(out_dir).as_posix()]


CODE = StageCode(run, report=BenchmarkReport)  # what the flow reaches the kind through (trtflow/stage_code.py)
