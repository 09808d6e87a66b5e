"""The engines output of a build stage, with one reader and one writer: a directory per cell of the build matrix,

    engines/<cell name>/spec.json    the Cell: what it builds, from which model, how (the build worker's request)
                        build.json   the Built record the worker wrote (or the build stage, when the worker died)
                        engine.plan  the serialized engine (status ok only)
                        build.log    TensorRT's log

and the stages after a build see it as `Candidate`s: one per engine that built, matched with its model variant
(or, without a build stage, one per model variant). The records of a cell's files (`Cell`, `Built`, with their
reader and writer) are in `records.py`, where reports read them without this module.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtflow import files
from trtflow.artifact import Artifact
from trtflow.errors import StageError
from trtflow.precisions import Precision
from trtflow.stages.trt.records import SPEC, Built, Cell, Profile

PLAN, LOG = "engine.plan", "build.log"
VARIANT = "variant.onnx"  # a cell's own ONNX variant, where it carries one
CHAIN_SUFFIX = ".chain"  # an offloaded variant's chain: `<variant>.chain/` beside the cells (CHAIN_FILE in it)


@dataclass(frozen=True)
class Engine:
    """A cell that built, as found in an engines directory; or an offloaded variant's chain whose TensorRT pieces
    all built (`pieces`: their engines by piece index; `directory`: the chain's folder, `CHAIN_FILE` in it;
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

        from trtflow.stages.onnx.records import CHAIN_FILE, read_chain

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
    from trtflow.stages.onnx.records import read_chain

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


