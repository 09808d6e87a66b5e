"""Stage `build`: one TensorRT engine per model variant x optimization profile x target.

Profiles are checked against each model's inputs before anything is built. Each cell builds in its own process
(`trt/build_worker.py`), at most `parallel` at a time, so a crash inside TensorRT fails that cell with a
report instead of the pipeline. Strongly typed by default: precision comes from the ONNX variants.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from trtflow import files
from trtflow.artifact import Artifact, Inputs, StageResult
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.build import TIMING_CACHES, BuildStage
from trtflow.stage_code import StageCode
from trtflow.stages.build.report import BuildEnvironment, BuildReport, CellRow
from trtflow.stages.onnx import offload
from trtflow.stages.onnx.graph import graph_inputs, precision
from trtflow.stages.onnx.records import Chain
from trtflow.stages.ort import qdq
from trtflow.stages.trt import building, config
from trtflow.stages.trt import plugins as trt_plugins
from trtflow.stages.trt.engine_cache import EngineCache, cell_key
from trtflow.stages.trt.engines import CHAIN_SUFFIX, LOG
from trtflow.stages.trt.env import INSTALL_HINT, find_tensorrt, gpus
from trtflow.stages.trt.records import SPEC, Backend, Built, Cell, Profile, piece_suffix
from trtflow.text import did_you_mean

VERSION = "2"  # 2: precision per cell, size warnings


def backend(requested: str) -> Backend:
    if requested == "auto":
        found = find_tensorrt()
        if found is None:
            raise StageError(f"build: no TensorRT flavour is installed: {INSTALL_HINT}")
        return found
    found = find_tensorrt(only={"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}[requested])
    if found is None:
        hint = "pip install tensorrt-rtx-cu13" if requested == "tensorrt-rtx" else "install TensorRT"
        raise StageError(f"build: backend: {requested} is not installed ({hint}), or use backend: auto")
    return found


def model_inputs(model: onnx.ModelProto) -> dict[str, list[Any]]:
    out = {}
    for vi in graph_inputs(model):
        out[vi.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                        for d in vi.type.tensor_type.shape.dim]
    return out


def resolve_profiles(params: BuildStage, inputs: dict[str, list[Any]], variant: str) -> list[Profile]:
    """[{name, shapes: {input: (min, opt, max)}}], every dynamic dimension covered, static ones respected."""
    dynamic = [(n, i, d) for n, dims in inputs.items() for i, d in enumerate(dims) if not isinstance(d, int)]
    if not params.profiles:
        if dynamic:
            n, i, d = dynamic[0]
            raise StageError(f"build: model '{variant}' input '{n}' dimension {i} ({d}) is dynamic, but no "
                             f"optimization profile is given: add stages.<build>.profiles: {{NAME: {{{n}: "
                             f"{{min: [...], opt: [...], max: [...]}}}}}}")
        static = {n: (dims, dims, dims) for n, dims in inputs.items()}
        return [Profile(name="static", shapes=static)]
    resolved = []
    for pname, shapes in params.profiles.items():
        where = f"profiles.{pname}"
        for name in shapes:
            if name not in inputs:
                raise StageError(f"build: {where}: model '{variant}' has no input '{name}'"
                                 f"{did_you_mean(name, list(inputs)) or '; inputs: ' + ', '.join(inputs)}")
        out: dict[str, tuple] = {}
        for name, dims in inputs.items():
            rng = shapes.get(name)
            if rng is None:
                missing = [(i, d) for i, d in enumerate(dims) if not isinstance(d, int)]
                if missing:
                    i, d = missing[0]
                    raise StageError(f"build: {where}: input '{name}' of model '{variant}' has dynamic dimension "
                                     f"{i} ({d}) but the profile gives no shape for it: add {where}.{name}")
                out[name] = (dims, dims, dims)
                continue
            if len(rng.min) != len(dims):
                raise StageError(f"build: {where}.{name}: rank {len(rng.min)} does not match the model's input "
                                 f"rank {len(dims)} ({dims})")
            for i, d in enumerate(dims):
                if isinstance(d, int) and not (rng.min[i] == rng.opt[i] == rng.max[i] == d):
                    raise StageError(f"build: {where}.{name}: dimension {i} is fixed at {d} in model '{variant}', "
                                     f"but the profile gives {rng.min[i]}/{rng.opt[i]}/{rng.max[i]}")
            out[name] = (rng.min, rng.opt, rng.max)
        resolved.append(Profile(name=pname, shapes=out))
    return resolved


def run(params: BuildStage, inputs: Inputs, out_dir: Path) -> StageResult:
    be = backend(params.backend)
    options = params.builder_options()
    config.check(options, importlib.import_module(be.module), be, params.targets)
    cache = None
    if params.timing_cache and "timing_cache" in inputs:
        cache = inputs.one("timing_cache").path / TIMING_CACHES.path(f"{be.flavour}-{be.version}.cache")
    # every profile is checked against every model before anything builds
    engines = out_dir / "engines"  # made by the first chain cut into it, else here once every profile checked
    cells = plan_cells(params, inputs.many("models"), be, str(cache) if cache else None, engines)
    engines.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    results = _build_or_reuse(cells, engines, params, inputs)
    wall = time.perf_counter() - t0

    rows = [CellRow.of(cell, built) for cell, built in zip(cells, results)]
    warnings = size_warnings(rows, be.flavour, {c.variant: c.model_file(engines) for c in cells}) + \
        [f"{r.name}: {w}" for r in rows if not r.reused for w in r.warnings]
    report = BuildReport(backend=be, environment=BuildEnvironment(tensorrt=be, gpu=gpus() or None), cells=rows,
                         wall_seconds=round(wall, 3), parallel=params.parallel,
                         timing_cache=str(cache) if cache else None, warnings=warnings)
    (out_dir / "report.json").write_text(report.model_dump_json(indent=2, exclude_none=True) + "\n")
    failed = report.failed
    result = StageResult(outputs={"engines": engines, "report": out_dir / "report.json"}, summary=report.summary(),
                         warnings=warnings,
                         metrics={"cells": len(rows), "failed": len(failed), "wall_seconds": round(wall, 3),
                                  "engine_bytes": sum(r.engine_bytes for r in rows)})
    if failed:
        raise StageFailed(f"build: {len(failed)} of {len(rows)} engine(s) failed; {failed[0].name}: "
                          f"{failed[0].error} (full log: {engines / failed[0].name / LOG})", result)
    return result


def _build_or_reuse(cells: list[Cell], engines: Path, params: BuildStage, inputs: Inputs) -> list[Built]:
    """Each cell built, or taken from the engine cache where nothing it depends on changed."""
    if not (params.engine_cache and "engine_cache" in inputs):
        return building.build_cells(cells, engines, params.parallel)
    cache = EngineCache(inputs.one("engine_cache").path / "engines")
    digests = {str(a.path): a.digest for a in inputs.many("models")}
    machine = gpus()
    plugins = trt_plugins.fingerprint(trt_plugins.declared())  # "" without plugins: the keys as before
    keys = [cell_key(c, (digests.get(c.model) or files.sha256(c.model_file(engines))) + plugins, machine)
            for c in cells]
    results: list[Built | None] = []
    for cell, key in zip(cells, keys):
        built = cache.take(key, engines / cell.name)
        if built is not None:
            (engines / cell.name / SPEC).write_text(cell.model_dump_json(indent=2) + "\n")
            built.write(engines / cell.name)
        results.append(built)
    todo = [i for i, r in enumerate(results) if r is None]
    for i, built in zip(todo, building.build_cells([cells[i] for i in todo], engines, params.parallel)):
        results[i] = built
        cache.keep(keys[i], engines / cells[i].name, built)
    return [r for r in results if r is not None]


def plan_cells(params: BuildStage, models: list[Artifact], be: Backend, timing_cache: str | None,
               engines: Path) -> list[Cell]:
    """The build matrix: model variant x profile (or all profiles, combined) x target; for a variant prepare
    offloaded in part to ONNX Runtime, one cell per TensorRT piece of its chain (cut into `engines`)."""
    cells = []
    options = params.builder_options().model_dump(mode="json")
    for art in models:
        variant = art.origin or art.path.stem
        graph = onnx.load(str(art.path), load_external_data=False)
        kind = precision(graph)
        profiles = resolve_profiles(params, model_inputs(graph), variant)
        groups = [[p] for p in profiles] if params.profile_mode == "separate" else [profiles]
        pieces = _pieces(art.path, engines / f"{variant}{CHAIN_SUFFIX}", profiles)
        for group in groups:
            for target in params.targets:
                cell = Cell(name=f"{variant}.{'+'.join(p.name for p in group)}.{target}", variant=variant,
                            precision=kind, model=str(art.path), profiles=group, target=target, backend=be,
                            options=options, log_severity=params.log_severity, timing_cache=timing_cache)
                cells += [cell] if pieces is None else [_piece_cell(cell, piece, pieces) for piece in pieces.cells]
    return cells


@dataclass(frozen=True)
class _Pieces:
    """An offloaded variant's chain and each TensorRT piece's profile for each of the model's profiles."""
    chain: Chain
    profiles: dict[str, dict[int, Profile]]  # the model's profile name -> piece index -> the piece's profile

    @property
    def cells(self) -> list[int]:
        return [i for i, p in enumerate(self.chain.pieces) if p.runtime == "tensorrt"]


def _pieces(model: Path, folder: Path, profiles: list[Profile]) -> _Pieces | None:
    chain = offload.cut(model, folder)
    if chain is None:
        return None
    return _Pieces(chain, {p.name: offload.piece_profiles(chain, p) for p in profiles})


def _piece_cell(cell: Cell, index: int, pieces: _Pieces) -> Cell:
    piece = pieces.chain.pieces[index]
    return cell.model_copy(update={
        "name": cell.name + piece_suffix(index), "model": piece.file, "chain": Path(pieces.chain.folder).name,
        "piece": index, "model_profiles": cell.profiles,
        "profiles": [pieces.profiles[p.name][index] for p in cell.profiles]})


def size_warnings(cells: list[CellRow], flavour: str, models: dict[str, Path]) -> list[str]:
    """An INT8 engine larger than the FP32 engine of the same profiles and target defeats a reason to quantize: say
    so, with the causes measured on TensorRT-RTX (docs/NOTES.md, "INT8 engine size on TensorRT-RTX") that apply.
    `models`: each variant's ONNX."""
    found = []
    groups: dict[tuple, dict[str, CellRow]] = {}
    for c in cells:
        if c.ok:
            groups.setdefault((tuple(c.profiles), c.target), {}).setdefault(c.precision, c)
    for group in groups.values():
        fp32, int8 = group.get("fp32"), group.get("int8")
        if fp32 and int8 and int8.engine_bytes > fp32.engine_bytes:
            why = _rtx_size_causes(int8, models[int8.variant]) if flavour == "tensorrt-rtx" else \
                "quantize fewer, larger ops, or use the FP16 variant"
            found.append(f"the INT8 engine {int8.name} ({int8.engine_bytes / 1e6:.2f} MB) is larger than the "
                         f"FP32 engine {fp32.name} ({fp32.engine_bytes / 1e6:.2f} MB): {why}")
    return found


def _rtx_size_causes(int8: CellRow, model: Path) -> str:
    kernels = ("TensorRT-RTX engines carry the CUDA source of every JIT-compiled kernel (about 130 KB each, measured) "
               "and an INT8 Conv's epilogue (dequantize, bias, activation, quantize) is a kernel of its own where "
               "FP32 fuses it into the Conv: the file grows, the weights it puts on the GPU shrink; quantize only ops "
               "of more than ~44K weights (calibrate: min_weight_params: 48000) or use the FP16 variant")
    static = all(lo == hi for shapes in int8.shapes.values() for lo, _, hi in shapes.values())
    padded = qdq.padded_convs(onnx.load(str(model), load_external_data=False)) if static else {}
    if not padded:
        return kernels
    depthwise = sum(padded.values())
    which = f" ({depthwise} depthwise)" if depthwise else ""
    also = ", or leave the depthwise ones in float (calibrate: float_depthwise: true, the default)" if depthwise else ""
    return (f"{len(padded)} of its INT8 Convs{which} have input channels per group not a multiple of 4, whose zero "
            f"padding TensorRT-RTX stores in an engine of static shapes (3 bytes per input value of a depthwise Conv, "
            f"1 per pixel of an RGB stem): give the profile a dynamic dimension{also}; and {kernels}")


CODE = StageCode(run, report=BuildReport)  # what the flow reaches the kind through (trtflow/stage_code.py)
