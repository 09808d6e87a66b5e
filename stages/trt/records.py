"""The records of TensorRT's work that reports and later stages read, apart from the code that does it: the
installed flavour (`Backend`), the TensorRT and GPUs an engine is built with (`TensorRT`, `Gpu`: `env.py` finds
them), what the parser refused and the network's IO (`parse.py`), the pre-flight's report and trial builds
(`preflight.py`), the engines output's cells and build records (`Profile`, `Cell`, `Built`, ...: `engines.py`
finds the engines), and the GPU telemetry of a benchmark (`telemetry.py` samples it). Types and small pure methods
only (a cell's and a build record's own reader and writer among them)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from trtflow import files
from trtflow.precisions import Precision
from trtflow.records import Recorded

SPEC, BUILT = "spec.json", "build.json"  # a cell's files in the engines output (engines.py)


# --- the installed TensorRT and the machine (env.py) ---------------------------------------------------------------

class Backend(BaseModel):
    """An installed TensorRT flavour: what builds and parses here."""
    flavour: str  # "tensorrt" | "tensorrt-rtx"
    module: str  # its Python module: "tensorrt" | "tensorrt_rtx"
    version: str  # from the pip metadata ("unknown" where none says)

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0]) if self.version[:1].isdigit() else 0


class TensorRT(Recorded):
    """A TensorRT flavour ("tensorrt" | "tensorrt-rtx") and its version: what an engine is built with."""
    flavour: str
    version: str


class Gpu(Recorded):
    """A GPU as NVML or nvidia-smi describes it. The fingerprint leaves `driver` out (the machine's driver is one
    fact of its own there); records of builds carry it."""
    model_config = ConfigDict(frozen=True)

    name: str
    compute_capability: str  # "8.9"
    memory_mb: int | None = None  # None where nvidia-smi does not say
    driver: str | None = None


# --- what the parser said (parse.py) -------------------------------------------------------------------------------

class ParseFailure(BaseModel):
    """A node the parser rejected (`hint`: what to do about it, added by the pre-flight or the build)."""
    node: str = ""
    op_type: str = ""
    node_index: int | None = None
    domain: str = ""
    code: str = ""
    reason: str = ""
    where: str = ""  # in the parser's source
    importer: bool | None = None  # the parser's own `supports_operator(op_type)`: it has an importer for the op
    hint: str | None = None


class TensorInfo(BaseModel):
    """A network's (or engine's) input or output as TensorRT reports it."""
    name: str
    shape: list[int]
    dtype: str


class IoTensors(BaseModel):
    inputs: list[TensorInfo] = []
    outputs: list[TensorInfo] = []


# --- the pre-flight (preflight.py) ---------------------------------------------------------------------------------

class TrialBuild(BaseModel):
    """A trial engine build at fixed shapes (or a profile from `min_shapes` up to them)."""
    ok: bool = False
    shapes: dict[str, list[int]] = {}
    min_shapes: dict[str, list[int]] | None = None
    opt_shapes: dict[str, list[int]] | None = None
    seconds: float | None = None
    engine_bytes: int | None = None
    needs_gpu: bool | None = None  # it failed only for want of a GPU at build time
    error: str | None = None
    detail: str | None = None  # the builder's first error line, whole
    log: list[str] | None = None
    hint: str | None = None


class VariantTrial(TrialBuild):
    """A precision variant's trial build as the precision stage reports it (`ran`: whether TensorRT was asked)."""
    ran: bool = False
    reason: str | None = None  # why it did not run
    runtime: str | None = None
    warning: str | None = None  # neither the variant nor the FP32 model builds


class PreflightReport(IoTensors):
    """What the pre-flight found (`inputs`/`outputs`: the network's, as the parser reports them)."""
    ran: bool
    runtime: str | None = None
    reason: str | None = None  # why no parser ran
    parsed: bool = False
    failures: list[ParseFailure] = []
    log: list[str] = []
    layers: int | None = None
    trial_build: TrialBuild | None = None

    def failed_build(self) -> TrialBuild | None:
        trial = self.trial_build
        return trial if trial is not None and not trial.ok else None


# --- the engines output (engines.py) -------------------------------------------------------------------------------

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


# --- GPU telemetry (telemetry.py) ----------------------------------------------------------------------------------

class Spread(BaseModel):
    min: int | float
    max: int | float
    mean: float


class TelemetrySummary(Recorded):
    """What the benchmark report says of the GPU during the run: unavailable (and why), or the samples' spread of
    each quantity and the throttle reasons seen."""
    available: bool = False
    why: str | None = None  # why there is no telemetry
    samples: int | None = None
    gpu_util: Spread | None = None
    mem_util: Spread | None = None
    sm_clock_mhz: Spread | None = None
    mem_clock_mhz: Spread | None = None
    mem_used_mb: Spread | None = None
    power_w: Spread | None = None
    throttled: list[str] | None = None
