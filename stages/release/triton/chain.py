"""An offloaded model (issue #68, partial offload) as a Triton model repository: one model per piece of its chain
(`onnx.records.Chain`) and an ensemble that runs them in order.

- Piece `i` is the model `<model>_p<ii>_<runtime>`: a TensorRT piece `platform: "tensorrt_plan"` with its engine as
  `<version>/model.plan` (and `contract.json` beside its config, as the release writes for an engine: its
  optimization profiles, which the config cannot say); an ONNX Runtime piece `platform: "onnxruntime_onnx"` with
  its ONNX as `<version>/model.onnx` (saved again from the piece: external data, if any, beside it as
  `model.onnx.data`). Names come from the piece's index and runtime, never from the model's text.
- The ensemble is served under the model's own name: a client calls the same model whether the release is one
  engine or a chain. Its inputs and outputs are the chain's; its steps, one per piece in the chain's order, map each
  piece's tensors to ensemble tensors of the same (ONNX) names.
- Shapes: `max_batch_size: 0` everywhere, `dims` the full shape (the batch dimension included) with -1 where the
  model does not fix a size (a symbol, or a count only the data decides, as a NonZero's); a scalar is `dims: [1]`
  reshaped to `[]`. Batching across a chain would need every piece to share a dynamic leading batch: not done.

Every config is written from Triton's protobuf message, read back through Triton's schema (`config.parse`) and
checked (`problems`) before anything is written: names, platforms and files, `max_batch_size`, dims Triton takes,
and the ensemble's wiring (each step's input an ensemble input or an earlier step's output, each tensor produced
once, its data type and dims the same for its producer and every consumer, every ensemble output produced). A
problem stops the release with one line, before Triton sees the repository.
"""
from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow import names
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.graph import graph_inputs
from trtflow.stages.onnx.records import Chain, Piece, Runtime, TensorSpec
from trtflow.stages.release.triton import config as triton_config
from trtflow.stages.release.triton.config import ConfigError
from trtflow.stages.release.triton.contract import FILE as CONTRACT_FILE
from trtflow.stages.release.triton.contract import Contract
from trtflow.stages.trt.records import Profile

ENSEMBLE = "ensemble"
PLATFORMS: dict[Runtime, str] = {"tensorrt": triton_config.PLATFORM, "onnxruntime": "onnxruntime_onnx"}
ONNX_FILE = "model.onnx"
FILES: dict[Runtime, str] = {"tensorrt": triton_config.PLAN_FILE, "onnxruntime": ONNX_FILE}
SUFFIX_LENGTH = len("_p00_onnxruntime")

# ONNX's element type -> Triton's; a TensorRT piece exchanges only what Triton's TensorRT backend does
DATA_TYPES = {"FLOAT": "TYPE_FP32", "FLOAT16": "TYPE_FP16", "BFLOAT16": "TYPE_BF16", "DOUBLE": "TYPE_FP64",
              "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
              "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32", "UINT64": "TYPE_UINT64",
              "BOOL": "TYPE_BOOL", "STRING": "TYPE_STRING"}
TENSORRT_TYPES = {"FLOAT", "FLOAT16", "BFLOAT16", "INT8", "UINT8", "INT32", "INT64", "BOOL"}


@dataclass(frozen=True)
class PieceEngine:
    """What serves a TensorRT piece: its engine file and the optimization profiles it was built with."""
    plan: Path
    profiles: list[Profile] = field(default_factory=list)


@dataclass(frozen=True)
class ChainRepository:
    """What `write` put in the repository: the pieces' models in the chain's order, the ensemble's, and each
    model's config.pbtxt text."""
    ensemble: str
    pieces: list[str]
    configs: dict[str, str]

    @property
    def models(self) -> list[str]:
        """Every model, in an order to load them (the ensemble last)."""
        return [*self.pieces, self.ensemble]


def piece_name(model_name: str, index: int, runtime: Runtime) -> str:
    return f"{model_name}_p{index:02d}_{runtime}"


# --- making the configs --------------------------------------------------------------------------------------------

def _dims(spec: TensorSpec, where: str) -> list[int]:
    if spec.shape is None:
        raise ConfigError(f"{where}: tensor '{spec.name}' has no known rank, which Triton's config must declare: "
                          f"give the model's outputs shapes (or run ONNX's shape inference on it)")
    return [d if isinstance(d, int) and d > 0 else -1 for d in spec.shape]


def _data_type(spec: TensorSpec, runtime: Runtime | None, where: str) -> str:
    if spec.dtype not in DATA_TYPES or runtime == "tensorrt" and spec.dtype not in TENSORRT_TYPES:
        allowed = sorted(TENSORRT_TYPES if runtime == "tensorrt" else DATA_TYPES)
        raise ConfigError(f"{where}: tensor '{spec.name}' is {spec.dtype}, which Triton cannot exchange with "
                          f"{'a TensorRT engine' if runtime == 'tensorrt' else 'a model'} (it takes "
                          f"{', '.join(allowed)})")
    return DATA_TYPES[spec.dtype]


def _declare(into: Any, spec: TensorSpec, runtime: Runtime | None, where: str) -> None:
    pb = triton_config.model_config_pb2()
    dims = _dims(spec, where)
    item = into.add(name=spec.name, data_type=pb.DataType.Value(_data_type(spec, runtime, where)))
    item.dims.extend(dims or [1])
    if not dims:  # a scalar: Triton declares it [1], the model takes it as it is
        item.reshape.SetInParent()


def piece_config(model_name: str, index: int, piece: Piece, gpu: bool) -> Any:
    """The piece's `ModelConfig`."""
    pb = triton_config.model_config_pb2()
    name = piece_name(model_name, index, piece.runtime)
    config = pb.ModelConfig(name=name, platform=PLATFORMS[piece.runtime], max_batch_size=0,
                            default_model_filename=FILES[piece.runtime])
    for spec in piece.inputs:
        _declare(config.input, spec, piece.runtime, f"piece {index} ({name})")
    for spec in piece.outputs:
        _declare(config.output, spec, piece.runtime, f"piece {index} ({name})")
    kind = pb.ModelInstanceGroup.KIND_GPU if gpu else pb.ModelInstanceGroup.KIND_CPU
    config.instance_group.add(count=1, kind=kind)
    return config


def ensemble_config(model_name: str, chain: Chain) -> Any:
    """The ensemble's `ModelConfig`: the chain's inputs and outputs, one step per piece."""
    pb = triton_config.model_config_pb2()
    config = pb.ModelConfig(name=model_name, platform=ENSEMBLE, max_batch_size=0)
    for spec in chain.inputs:
        _declare(config.input, spec, None, f"the ensemble ({model_name})")
    for spec in chain.outputs:
        _declare(config.output, spec, None, f"the ensemble ({model_name})")
    for index, piece in enumerate(chain.pieces):
        step = config.ensemble_scheduling.step.add(model_name=piece_name(model_name, index, piece.runtime),
                                                   model_version=-1)
        for spec in piece.inputs:
            step.input_map[spec.name] = spec.name
        for spec in piece.outputs:
            step.output_map[spec.name] = spec.name
    return config


def make(chain: Chain, model_name: str, gpu: bool = True) -> list[Any]:
    """The pieces' configs in the chain's order, then the ensemble's (Triton's `ModelConfig` messages)."""
    why = names.problem(model_name, names.DOTTED, names.MODEL_MAX_LENGTH)
    if why:
        raise ConfigError(f"the offloaded model's Triton name: {why}")
    if not chain.pieces:
        raise ConfigError(f"the offloaded model '{model_name}' has no pieces to serve")
    return [piece_config(model_name, i, p, gpu) for i, p in enumerate(chain.pieces)] + \
        [ensemble_config(model_name, chain)]


# --- checking them -------------------------------------------------------------------------------------------------

def problems(configs: list[Any]) -> list[str]:
    """What Triton would refuse, or run wrongly, in the configs of a chain (`make`'s list: pieces, then the
    ensemble), read as Triton reads them."""
    out = [msg for c in configs for msg in _model_problems(c)]
    ensembles = [c for c in configs if c.platform == ENSEMBLE]
    if len(ensembles) != 1:
        return out + [f"{len(ensembles)} ensemble models, not one"]
    models = {c.name: c for c in configs if c.platform != ENSEMBLE}
    if len(models) != len(configs) - 1:
        out.append("two models have one name")
    return out + _wiring_problems(ensembles[0], models)


def _model_problems(config: Any) -> list[str]:
    out = []
    why = names.problem(config.name, names.DOTTED, names.MODEL_MAX_LENGTH + SUFFIX_LENGTH)
    if why:
        out.append(f"model name: {why}")
    runtime = next((r for r, p in PLATFORMS.items() if p == config.platform), None)
    if config.platform != ENSEMBLE and runtime is None:
        out.append(f"model '{config.name}': platform '{config.platform}' is neither a piece's nor an ensemble")
    elif runtime is not None and config.default_model_filename != FILES[runtime]:
        out.append(f"model '{config.name}': serves '{config.default_model_filename}', not {FILES[runtime]}")
    if config.max_batch_size != 0:
        out.append(f"model '{config.name}': max_batch_size {config.max_batch_size}, not 0 (a chain declares full "
                   f"shapes)")
    for what, tensors in (("input", config.input), ("output", config.output)):
        out += [f"model '{config.name}': {what} '{t.name}' has dims {list(t.dims)} (each must be -1 or at least 1)"
                for t in tensors if not t.dims or any(d < 1 and d != -1 for d in t.dims)]
    return out


@dataclass
class _Wiring:
    """The ensemble's tensors as its steps are read in order: who declared each (the ensemble's input, or a
    step's output) and its declaration."""
    declared: dict[str, tuple[str, Any]]
    inputs: set[str]
    problems: list[str] = field(default_factory=list)


def _wiring_problems(ensemble: Any, models: dict[str, Any]) -> list[str]:
    wiring = _Wiring(declared={t.name: (f"the ensemble's input '{t.name}'", t) for t in ensemble.input},
                     inputs={t.name for t in ensemble.input})
    if not ensemble.ensemble_scheduling.step:
        wiring.problems.append(f"ensemble '{ensemble.name}' has no steps")
    for number, step in enumerate(ensemble.ensemble_scheduling.step):
        model = models.get(step.model_name)
        if model is None:
            wiring.problems.append(f"step {number} runs model '{step.model_name}', which is not in the repository")
            continue
        _step_inputs(wiring, number, step, model)
        _step_outputs(wiring, number, step, model)
    for t in ensemble.output:
        _ensemble_output(wiring, t)
    return wiring.problems


def _step_inputs(wiring: _Wiring, number: int, step: Any, model: Any) -> None:
    where = f"step {number} ({model.name})"
    declared = {t.name: t for t in model.input}
    wiring.problems += [f"{where}: its input '{n}' is not mapped" for n in declared if n not in step.input_map]
    for name, tensor in sorted(step.input_map.items()):
        if name not in declared:
            wiring.problems.append(f"{where}: maps '{name}', which is not an input of its model")
        elif tensor not in wiring.declared:
            wiring.problems.append(f"{where}: input '{name}' reads '{tensor}', which is neither an ensemble input "
                                   f"nor an earlier step's output")
        else:
            source, made = wiring.declared[tensor]
            wiring.problems += _agree(made, declared[name], f"{where} input '{name}' reads {source}")


def _step_outputs(wiring: _Wiring, number: int, step: Any, model: Any) -> None:
    where = f"step {number} ({model.name})"
    declared = {t.name: t for t in model.output}
    for name, tensor in sorted(step.output_map.items()):
        if name not in declared:
            wiring.problems.append(f"{where}: maps '{name}', which is not an output of its model")
        elif tensor in wiring.declared:
            wiring.problems.append(f"{where}: output '{name}' writes '{tensor}', which "
                                   f"{wiring.declared[tensor][0]} already is")
        else:
            wiring.declared[tensor] = (f"step {number}'s output '{name}'", declared[name])


def _ensemble_output(wiring: _Wiring, t: Any) -> None:
    if t.name not in wiring.declared or t.name in wiring.inputs:
        wiring.problems.append(f"the ensemble's output '{t.name}' is produced by no step")
        return
    source, made = wiring.declared[t.name]
    wiring.problems += _agree(made, t, f"the ensemble's output '{t.name}' from {source}")


def _agree(made: Any, read: Any, what: str) -> list[str]:
    """The producer's declaration against a consumer's: one data type, one rank, sizes equal where both fix one."""
    pb = triton_config.model_config_pb2()
    out = []
    if made.data_type != read.data_type:
        out.append(f"{what}: {pb.DataType.Name(made.data_type)} made, {pb.DataType.Name(read.data_type)} read")
    a, b = list(made.dims), list(read.dims)
    if len(a) != len(b) or any(x != y and -1 not in (x, y) for x, y in zip(a, b)):
        out.append(f"{what}: dims {a} made, {b} read")
    return out


# --- the files -----------------------------------------------------------------------------------------------------

def _engines(chain: Chain, engines: Mapping[int, Path | PieceEngine]) -> dict[int, PieceEngine]:
    """Each TensorRT piece's engine (every one has one; no other piece has one)."""
    wanted = {i for i, p in enumerate(chain.pieces) if p.runtime == "tensorrt"}
    if set(engines) != wanted:
        raise ConfigError(f"the chain's TensorRT pieces are {sorted(wanted)}, engines were given for "
                          f"{sorted(engines)}: give one engine per TensorRT piece")
    found = {i: e if isinstance(e, PieceEngine) else PieceEngine(Path(e)) for i, e in engines.items()}
    missing = [str(e.plan) for e in found.values() if not e.plan.is_file()]
    if missing:
        raise ConfigError(f"the engine {missing[0]} of a TensorRT piece is not a file")
    return found


def _onnx_problems(chain: Chain, configs: list[Any]) -> list[str]:
    """Each ONNX Runtime piece's file against its config: the same inputs and outputs (Triton's ONNX Runtime
    backend refuses a config that names others)."""
    out = []
    for piece, config in zip(chain.pieces, configs):
        if piece.runtime != "onnxruntime":
            continue
        model = model_io.load(chain.path(piece), with_data=False)
        have = (sorted(v.name for v in graph_inputs(model)), sorted(v.name for v in model.graph.output))
        want = (sorted(t.name for t in config.input), sorted(t.name for t in config.output))
        if have != want:
            out.append(f"model '{config.name}': its ONNX has inputs/outputs {have}, its config {want}")
    return out


def _place(chain: Chain, piece: Piece, folder: Path, engine: PieceEngine | None, config: Any) -> None:
    """The piece's file (and a TensorRT piece's contract) in its model's folder."""
    if engine is not None:
        shutil.copyfile(engine.plan, folder / triton_config.PLAN_FILE)
        (folder.parent / CONTRACT_FILE).write_text(Contract.of(config, engine.profiles).model_dump_json(indent=2)
                                                   + "\n")
    else:
        model_io.save(model_io.load(chain.path(piece)), folder / ONNX_FILE)


def write(chain: Chain, engines: Mapping[int, Path | PieceEngine], repo: Path, model_name: str, version: int = 1,
          gpu: bool = True) -> ChainRepository:
    """The chain's models in the Triton repository `repo` (`engines`: piece index -> the engine serving that
    TensorRT piece; `gpu`: instance groups KIND_GPU, else KIND_CPU). Checked before anything is written: a
    ConfigError of one line names every problem."""
    repo = Path(repo)
    served = _engines(chain, engines)
    configs = [triton_config.parse(triton_config.to_text(c)) for c in make(chain, model_name, gpu)]
    found = problems(configs) + _onnx_problems(chain, configs)
    if found:
        raise ConfigError(f"the offloaded model '{model_name}' cannot be served as a Triton ensemble: "
                          + "; ".join(found))
    taken = [c.name for c in configs if (repo / c.name).exists()]
    if taken:
        raise ConfigError(f"the Triton repository {repo} has a model '{taken[0]}' already")
    texts = {}
    for config in configs:
        folder = repo / config.name / str(version)
        folder.mkdir(parents=True)
        texts[config.name] = triton_config.to_text(config)
        (repo / config.name / "config.pbtxt").write_text(texts[config.name])
    for index, (piece, config) in enumerate(zip(chain.pieces, configs)):
        _place(chain, piece, repo / config.name / str(version), served.get(index), config)
    return ChainRepository(ensemble=configs[-1].name, pieces=[c.name for c in configs[:-1]], configs=texts)
