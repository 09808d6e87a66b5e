"""A stage kind's row: its parameter model, its input slots and outputs (which the stage graph wires), the module
that does its work (a `run` function and a `VERSION`), which environment facts enter its cache key and which shared
caches outside the key it reads and updates. Each built-in kind's row sits beside its parameter model in
`pipelines/params/<kind>.py`; `pipelines/kinds.py` lists them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, get_args

from trtflow.pipelines.schema import StageBase


@dataclass(frozen=True)
class Slot:
    """An input of a stage kind and where its default comes from."""

    type: str
    many: bool = False
    required: bool = True
    prefer: tuple[str, ...] = ()  # kinds a default is taken from, nearest first; () = no default
    source_ok: bool = False  # fall back to the pipeline's model when no preferred stage exists


@dataclass(frozen=True)
class SharedArea:
    """A part of the store's `shared/` a kind reads and updates outside its key, declared once: its stage names its
    files from `prefix` (a folder: 'releases/'; a file name's start: 'timing-'); a remote store keeps it for every
    machine (files up to `max_bytes`); `claimed`: its records are created once by a claim (StageResult.claims),
    never sent otherwise."""
    prefix: str
    max_bytes: int
    claimed: bool = False

    def path(self, *parts: str) -> str:
        """A file or folder of the area, relative to `shared/`."""
        return self.prefix + "/".join(parts)


ANY_KIND = "*"
# the input slot of the store's shared/ where the FP32 reference outputs are kept (stages/ort/references.py), for the
# kinds that compare a model with its FP32 reference
REFERENCE_CACHE = "reference_cache"
MODEL_MAKERS = ("prepare", "precision", "calibrate")
PREPROCESS_SLOT = Slot("preprocess", required=False, prefer=("parity",))

# Environment facts a stage's key may hold (see flows/keys.py): "tensorrt", the TensorRT flavour and version
# with the CUDA runtime it loads and the platform; "gpu", the GPUs with their driver.
Facet = Literal["tensorrt", "gpu"]
FACETS: tuple[Facet, ...] = get_args(Facet)
TENSORRT: tuple[Facet, ...] = ("tensorrt",)
TENSORRT_AND_GPU: tuple[Facet, ...] = ("tensorrt", "gpu")


def _nothing(spec: Any) -> tuple:
    return ()


def _no_gpu(spec: Any) -> bool:
    return False


def _no_outputs(spec: Any) -> Mapping[str, str]:
    return {}


def _no_wiring_check(spec: Any, upstream: Mapping[str, StageBase]) -> tuple[str, tuple[str, ...], str] | None:
    return None


@dataclass(frozen=True)
class Kind:
    name: str
    params: type[StageBase]
    slots: Mapping[str, Slot]
    outputs: Mapping[str, str]  # output name -> artifact type
    module: str | None = ""  # where `run` and `VERSION` live (default trtflow.stages.<name>; None: the user's function)
    env: Callable[[Any], tuple[Facet, ...]] = _nothing  # params -> the environment facts in the key
    # the distributions whose installed versions enter the key (flows/code_lock.py: the libraries that decide what
    # the kind's code makes of its inputs; a test checks each one its code imports is declared)
    libraries: tuple[str, ...] = ()
    shared_caches: Callable[[Any], tuple[str, ...]] = _nothing  # params -> input slots of caches outside the key
    result_caches: tuple[str, ...] = ()  # those of them holding results (not only speed): a forced run goes without
    more_outputs: Callable[[Any], Mapping[str, str]] = _no_outputs  # params -> outputs some settings add
    # what the flow does for this kind, so that flows/ names no kind (its stage module's `CODE`, a
    # trtflow.stage_code.StageCode, gives the functions it calls: `run`, its report's class, its events, why a
    # result about to be reused no longer holds): the parts of the store's shared/ it keeps, ...
    shared: tuple[SharedArea, ...] = ()
    keeps_input_names: bool = False  # the ONNX model it writes has the input names of the one it read
    # params -> it uses the GPU (a build, a trial build, an engine run): the flow runs it on the machine's GPU tag
    # and keeps it off a GPU a `gpu_alone` stage is timing (flows/pipeline_flow.py)
    gpu: Callable[[Any], bool] = _no_gpu
    gpu_alone: bool = False  # it times the GPU: no other stage uses that GPU while it runs
    # it copies the pipeline's TensorRT plugins into what it releases: they reach its stage process, and its key, as
    # they reach a kind with the `tensorrt` facet (flows/runner.py `plugins_for`)
    ships_plugins: bool = False
    # the libraries its stage process imports only once it works (beyond its stage module's own imports): when a
    # stage of this kind is about to run, the fork server imports them and the stage module ahead (flows/isolate.py)
    preload: tuple[str, ...] = ()
    # (params, every stage it depends on, directly or not: name -> its params) -> (what is wrong, the parameter's
    # key path under the stage, what to do), for settings that cannot work with what the pipeline feeds the stage
    wiring: Callable[[Any, Mapping[str, StageBase]], tuple[str, tuple[str, ...], str] | None] = _no_wiring_check

    def __post_init__(self) -> None:
        if self.module == "":
            object.__setattr__(self, "module", f"trtflow.stages.{self.name}.stage")

    def slots_for(self, spec: StageBase) -> dict[str, Slot]:
        return dict(self.slots)

    def outputs_for(self, spec: StageBase) -> dict[str, str]:
        return {**self.outputs, **self.more_outputs(spec)}
