"""The engines output of a build stage, with one reader and one writer: a directory per cell of the build matrix,

    engines/<cell name>/spec.json    the Cell: what it builds, from which model, how (the build worker's request)
                        build.json   the Built record the worker wrote (or the build stage, when the worker died)
                        engine.plan  the serialized engine (status ok only)
                        build.log    TensorRT's log

and the stages after a build see it as `Candidate`s: one per engine that built, matched with its model variant
(or, without a build stage, one per model variant).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from trtflow import files
from trtflow.artifact import Artifact
from trtflow.errors import StageError
from trtflow.precisions import Precision
from trtflow.records import Recorded
from trtflow.stages.trt.env import Backend, Gpu, TensorRT
from trtflow.stages.trt.parse import ParseFailure, TensorInfo

SPEC, BUILT, PLAN, LOG = "spec.json", "build.json", "engine.plan", "build.log"
VARIANT = "variant.onnx"  # a cell's own ONNX variant, where it carries one
CHAIN_SUFFIX = ".chain"  # an offloaded variant's chain: `<variant>.chain/` beside the cells (split.CHAIN_FILE in it)


class Profile(BaseModel):
    name: str
    shapes: dict[str, tuple[list[int], list[int], list[int]]]  # input -> (min, opt, max)

    def at(self, point: str) -> dict[str, list[int]]:
        """The shapes of every input at 'min', 'opt' or 'max'."""
        index = ("min", "opt", "max").index(point)
        return {name: list(rng[index]) for name, rng in self.shapes.items()}

    def fits(self, shapes: dict[str, tuple[int, ...]]) -> bool:
        return all(name not in shapes or (len(shapes[name]) == len(lo)
                                          and all(a <= s <= b for a, s, b in zip(lo, shapes[name], hi)))
                   for name, (lo, _, hi) in self.shapes.items())

    @property
    def dynamic(self) -> bool:
        """Whether some input's min and max differ."""
        return any(lo != hi for lo, _, hi in self.shapes.values())

    def describe(self) -> str:
        return f"{self.name}: " + ", ".join(f"{n} {lo}..{hi}" for n, (lo, _, hi) in self.shapes.items())


class Cell(BaseModel):
    """One engine of the build matrix: model variant x profile(s) x target, and how the worker builds it."""
    model_config = ConfigDict(extra="forbid")

    name: str
    variant: str
    precision: Precision
    model: str
    profiles: list[Profile]
    target: str
    backend: Backend
    options: dict[str, Any]  # BuilderOptions as JSON: the worker validates it again on its side
    log_severity: str = "warning"
    timing_cache: str | None = None
    # an offloaded variant (issue #68): the folder of its chain in the engines output, and the TensorRT piece of it
    # this cell builds (`model` is the piece's file name there: `model_file`); one candidate's cells differ in `piece`
    chain: str | None = None
    piece: int | None = None
    model_profiles: list[Profile] | None = None  # a piece's: the whole model's profiles it was derived from

    def model_file(self, engines: Path) -> Path:
        """The ONNX the cell builds (`engines`: the folder of the cells): a piece's lies in its chain's folder."""
        return engines / self.chain / self.model if self.chain else Path(self.model)

    @property
    def candidate(self) -> str:
        """The name of the candidate this cell's engine serves: its own, or its chain's for a piece."""
        return self.name if self.piece is None else self.name.removesuffix(piece_suffix(self.piece))

    @classmethod
    def read(cls, cell_dir: Path) -> "Cell":
        return cls.model_validate_json(files.read_bounded(cell_dir / SPEC, files.RECORD_BYTES, follow=False))


def piece_suffix(index: int) -> str:
    return f".p{index:02d}"


class AppliedOptions(Recorded):
    """The builder options `config.apply` set on the builder config (those left unset are absent)."""
    optimization_level: int | None = None
    workspace: int | None = None
    aux_streams: int | None = None
    hardware_compatibility: str | None = None
    version_compatible: bool | None = None
    strip_plan: bool | None = None
    weight_streaming: bool | None = None
    legacy_precision: list[str] | None = None
    compute_capability: str | None = None  # the target, where it is not "native"


class Validity(Recorded):
    """Whether this machine could run the engine, by the engine's own verdict (TensorRT-RTX's
    `Runtime.get_engine_validity`): `checked` False where this TensorRT cannot tell, with the reason."""
    checked: bool = False
    validity: str | None = None  # "VALID" | "INVALID" | "SUBOPTIMAL"
    diagnostics: list[str] = []
    reason: str | None = None  # TensorRT's log line that says why, where no diagnostic does


class BuiltOn(Recorded):
    """The TensorRT that built an engine and the GPUs of the machine it was built on (None: none)."""
    tensorrt: TensorRT | None = None
    gpu: list[Gpu] | None = None


class Built(BaseModel):
    """What building a cell gave: status ok with the engine's facts, or failed with the error."""
    model_config = ConfigDict(extra="ignore")  # what an older or newer trtflow recorded beside these

    status: str  # "ok" | "failed"
    error: str | None = None
    failures: list[ParseFailure] = []  # nodes the parser rejected
    runtime: str | None = None
    seconds: float = 0.0
    engine_bytes: int = 0
    layers: int | None = None
    options: AppliedOptions = AppliedOptions()
    validity: Validity | None = None
    environment: BuiltOn | None = None
    peak_host_memory_mb: float | None = None
    reused: str | None = None  # the engine cache's key, when the engine was taken from it instead of built
    engine_sha256: str | None = None  # the engine's digest as the builder made it (the engine cache checks against it)
    warnings: list[str] = []  # what the cell built without (an unreadable timing cache)
    inputs: list[TensorInfo] | None = None  # the engine's IO tensors, as the parser reports them (None: an older
    outputs: list[TensorInfo] | None = None  # record, made before they were kept)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def write(self, cell_dir: Path) -> None:
        (cell_dir / BUILT).write_text(self.model_dump_json(indent=2, exclude_none=True) + "\n")

    @classmethod
    def read(cls, cell_dir: Path) -> "Built | None":
        """The cell's record; None where there is none (NotAFile for a FIFO, symlink or device in its place)."""
        try:
            data = files.read_bounded(cell_dir / BUILT, files.RECORD_BYTES, follow=False)
        except FileNotFoundError:
            return None
        return cls.model_validate_json(data)


@dataclass(frozen=True)
class Engine:
    """A cell that built, as found in an engines directory; or an offloaded variant's chain whose TensorRT pieces
    all built (`pieces`: their engines by piece index; `directory`: the chain's folder, `split.CHAIN_FILE` in it;
    `cell` and `built` the first piece's, named for the whole)."""
    cell: Cell
    built: Built
    directory: Path
    pieces: dict[int, "Engine"] = field(default_factory=dict)

    @property
    def plan(self) -> Path:
        return self.directory / PLAN

    @property
    def chain(self) -> Path | None:
        """The chain's folder, for an offloaded candidate."""
        return self.directory if self.pieces else None

    @property
    def plans(self) -> list[Path]:
        """Its engine files: its own, or its pieces' in the chain's order."""
        return [self.pieces[i].plan for i in sorted(self.pieces)] if self.pieces else [self.plan]

    def sha256(self) -> str:
        """The engine's digest; a chain's covers its pieces' engines and the chain itself (an ONNX Runtime piece
        changed is another release)."""
        if not self.pieces:
            return files.sha256(self.plan)
        import hashlib

        from trtflow.stages.onnx.split import CHAIN_FILE, read_chain

        chain = read_chain(self.directory)
        parts = [files.sha256(self.directory / CHAIN_FILE)] + [files.sha256(self.directory / p.file)
                                                               for p in chain.pieces if p.runtime == "onnxruntime"]
        parts += [files.sha256(plan) for plan in self.plans]
        return hashlib.sha256(" ".join(parts).encode()).hexdigest()

    @property
    def own_variant(self) -> Path | None:
        """The ONNX model the engine was built from, where the cell carries it (validate's repaired engines)."""
        path = self.directory / VARIANT
        return path if path.exists() else None


def built_engines(engines: Path) -> list[Engine]:
    """Every cell of an engines directory that built, in name order (cells that failed are left out); the pieces
    of an offloaded variant's chain as one engine, where every TensorRT piece built."""
    found: list[Engine] = []
    pieces: dict[str, list[Engine]] = {}
    for cell_dir in sorted(p for p in engines.iterdir() if p.is_dir()):
        if not (cell_dir / SPEC).exists():
            continue
        built = Built.read(cell_dir)
        if built is not None and built.ok:
            eng = Engine(Cell.read(cell_dir), built, cell_dir)
            if eng.cell.piece is None:
                found.append(eng)
            else:
                pieces.setdefault(eng.cell.candidate, []).append(eng)
    found += [e for group in pieces.values() if (e := _chain_engine(engines, group)) is not None]
    return sorted(found, key=lambda e: e.cell.name)


def _chain_engine(engines: Path, group: list[Engine]) -> Engine | None:
    """One candidate of the engines of its chain's TensorRT pieces; None where one of them did not build."""
    from trtflow.stages.onnx.split import read_chain

    first = group[0].cell
    folder = engines / (first.chain or "")
    wanted = [i for i, p in enumerate(read_chain(folder).pieces) if p.runtime == "tensorrt"]
    by_index = {e.cell.piece: e for e in group}
    if sorted(by_index) != wanted:
        return None
    built = group[0].built.model_copy(update={
        "seconds": round(sum(e.built.seconds for e in group), 3),
        "engine_bytes": sum(e.built.engine_bytes for e in group), "inputs": None, "outputs": None})
    cell = first.model_copy(update={"name": first.candidate, "piece": None, "profiles": first.model_profiles or [],
                                    "model_profiles": None})
    return Engine(cell, built, folder, {i: e for i, e in by_index.items() if i is not None})


@dataclass
class Candidate:
    name: str
    variant: str
    precision: Precision
    model: Path  # the ONNX variant the engine was built from
    engine: Path | None = None
    module: str = ""  # TensorRT module that built the engine
    profiles: list[Profile] = field(default_factory=list)
    replaces: str | None = None  # a repaired candidate: the failing candidate it was made from
    chain: Path | None = None  # an offloaded candidate: its chain's folder (no `engine`: one per TensorRT piece)


def engine_candidates(engines: Artifact | None, models: list[Artifact], stage: str,
                      exclude: str | None = None) -> list[Candidate]:
    """The built engines, matched with their variants among `models`; without engines, every model variant (but
    the one whose digest is `exclude`, the reference)."""
    by_variant = {m.origin or m.path.stem: m for m in models}
    if engines is None:
        import onnx

        from trtflow.stages.onnx.graph import precision

        found = [Candidate(v, v, precision(onnx.load(str(m.path), load_external_data=False)), m.path)
                 for v, m in by_variant.items() if m.digest != exclude]
        if not found:
            raise StageError(f"{stage}: nothing to {stage}: no build stage and no model variant other than the "
                             f"reference; add a precision/calibrate or build stage before it, or set inputs.engines")
        return found
    found = []
    for eng in built_engines(engines.path):
        cell = eng.cell
        model = by_variant[cell.variant].path if cell.variant in by_variant else eng.own_variant
        if model is None:
            raise StageError(f"{stage}: engine '{cell.name}' was built from model variant '{cell.variant}', which "
                             f"is not among this stage's models ({', '.join(by_variant) or 'none'}): add "
                             f"'{cell.variant}' to inputs.models")
        found.append(Candidate(cell.name, cell.variant, cell.precision, model,
                               None if eng.chain else eng.plan, cell.backend.module, cell.profiles, chain=eng.chain))
    if not found:
        raise StageError(f"{stage}: the build output {engines.path} holds no built engine")
    return found


