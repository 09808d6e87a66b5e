"""Run ONNX models with ONNX Runtime on CPU and compare their outputs (a runner and a comparator, kept apart; the
comparator's record, `OutputDiff`, is in `compare/records.py`)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from trtflow import phases
from trtflow.errors import StageError
from trtflow.stages.compare.records import OutputDiff
from trtflow.stages.ort import memory

RUNTIME = "onnxruntime-cpu"
# the roles of sessions whose passes bench/floor.py counts as work a stage cannot skip (trtflow/phases.py passes):
FP32 = "fp32 reference"  # the FP32 model run for its outputs
CANDIDATE = "candidate"  # a variant (or its emulation) run to be compared with them
CALIBRATION = "calibration"  # the model with its activations exposed, run for their ranges
PARITY = "parity comparison"  # the model on deploy-time and on training inputs
DEFAULT_DYNAMIC = 64  # size used for a dynamic non-batch dimension when no shape is given


@phases.timed("ONNX Runtime sessions: made")
def session(path: Path, spin: bool = False, role: str = ""):
    """An ONNX Runtime CPU session of the model as written. Its threads do not spin waiting for work unless `spin`
    (the benchmark harness, which times it): stages run side by side, and on a shared machine spinning threads take
    the cores the others need (three squeezenet loops on two cores: 2.85 s spinning, 1.89 s not; alone, spinning
    is 13% faster). Stage sessions run without memory patterns (memory.py: with them a second run at a shape holds
    its planned block beside what the arena kept from the first, 1001 MiB against 641 MiB for PP-OCRv4's recognizer
    at 32 x 48 x 1280, no slower); `run` bounds each run by the memory budget."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # compare the model as written: ORT's own graph rewrites would hide differences between two models
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if not spin:
        opts.enable_mem_pattern = False
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    memory.register(sess, Path(path))
    if phases.recording():  # (bench/floor.py, and the tests that count passes): each run, timed, by `role`
        sess.run = phases.timed_passes(sess.run, role or Path(path).name)
    return sess


NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
            "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
            "tensor(uint8)": np.uint8, "tensor(int16)": np.int16, "tensor(uint16)": np.uint16,
            "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_}


def concrete_shapes(inputs: list[tuple[str, list[Any]]], given: dict[str, list[int]]) -> dict[str, list[int]]:
    """A concrete shape for every (input name, dims) — dims are ints, symbol names (str) or None: `given` where
    given; a dimension named by a symbol takes one value wherever the symbol appears (silero-VAD's `batch` is
    axis 0 of `input` and axis 1 of `state`): the value it has in a given shape, else 1 if it is some input's
    axis 0, else DEFAULT_DYNAMIC; other free dimensions are 1 on axis 0 and DEFAULT_DYNAMIC elsewhere."""
    symbols: dict[str, int] = {}
    for name, dims in inputs:
        if name in given and len(given[name]) == len(dims):
            for d, v in zip(dims, given[name]):
                if isinstance(d, str) and d:
                    symbols.setdefault(d, int(v))
    for _, dims in inputs:
        for axis, d in enumerate(dims):
            if isinstance(d, str) and d and d not in symbols and axis == 0:
                symbols[d] = 1
    return {name: list(given[name]) if name in given else
            [d if isinstance(d, int) and d > 0 else symbols.get(d, DEFAULT_DYNAMIC) if isinstance(d, str) and d
             else (1 if axis == 0 else DEFAULT_DYNAMIC) for axis, d in enumerate(dims)]
            for name, dims in inputs}


def feed_digest(feed: dict[str, np.ndarray]) -> str:
    """sha256 of a feed: each input's name, dtype, shape and values (an object array, ONNX Runtime's strings, by the
    values, not by the addresses its buffer holds)."""
    h = hashlib.sha256()
    for name in sorted(feed):
        x = np.ascontiguousarray(feed[name])
        h.update(f"{name}\0{x.dtype}\0{x.shape}\n".encode())
        h.update(repr(x.tolist()).encode() if x.dtype.kind == "O" else x.data)
    return h.hexdigest()


@dataclass(frozen=True)
class InputSpec:
    """A model input as an ONNX Runtime session describes it (name, dims with symbols as str, 'tensor(float)'),
    read from the graph: for code that must not create a session (a variant that may crash ONNX Runtime)."""
    name: str
    shape: list[Any]
    type: str


def model_inputs(model: Any) -> list[InputSpec]:
    from onnx import TensorProto

    from trtflow.stages.onnx.graph import graph_inputs

    return [InputSpec(vi.name, [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                                for d in vi.type.tensor_type.shape.dim],
                      f"tensor({TensorProto.DataType.Name(vi.type.tensor_type.elem_type).lower()})")
            for vi in graph_inputs(model)]


def session_shapes(inputs: list[Any], given: dict[str, list[int]]) -> dict[str, list[int]]:
    """`concrete_shapes` for ONNX Runtime session inputs."""
    return concrete_shapes([(i.name, list(i.shape)) for i in inputs], given)


def random_input(inp: Any, given: dict[str, list[int]], rng: np.random.Generator,
                 value_range: tuple[float, float] | None = None) -> np.ndarray:
    """Random data for one session input: uniform in `value_range` (both ends included for integers) where
    given, else normal floats, small integers and booleans."""
    shape = concrete_shapes([(inp.name, list(inp.shape))], given)[inp.name]
    dtype = NP_TYPES.get(inp.type)
    if dtype is None:
        raise ValueError(f"input '{inp.name}' has type {inp.type}, which random inputs do not cover")
    if dtype is np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.floating):
        if value_range is None:
            return rng.standard_normal(shape).astype(dtype)
        return rng.uniform(value_range[0], value_range[1], shape).astype(dtype)
    low, high = (0, 7) if value_range is None else (int(np.ceil(value_range[0])), int(np.floor(value_range[1])))
    return rng.integers(low, high + 1, shape).astype(dtype)


def fit_to_input(x: np.ndarray, inp: Any) -> np.ndarray | None:
    """`x` with leading batch dimensions added and the input's dtype, or None if its shape cannot fit."""
    want = list(inp.shape)
    while x.ndim < len(want):
        x = x[None]
    if x.ndim != len(want) or any(isinstance(w, int) and w > 0 and w != s for w, s in zip(want, x.shape)):
        return None
    return x.astype(NP_TYPES.get(inp.type, x.dtype))  # a type not listed: as given (ONNX Runtime says if it is wrong)


def run(sess, feeds: dict[str, np.ndarray], names: list[str] | None = None) -> dict[str, np.ndarray]:
    """The outputs (`names`, else every one) of a session on `feeds`, the batch run in parts that fit the memory
    budget (memory.py: the estimate from the model's graph at the feeds' shapes; a single sample over the budget is
    refused naming the shape and the estimate)."""
    return memory.chunked(lambda part: whole(sess, part, names), feeds, memory.graph_of(sess))


def parts(sess, feeds: dict[str, np.ndarray], names: list[str] | None = None
          ) -> Iterator[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """(part of the feeds, its outputs) for each part of the batch that fits the memory budget: for statistics
    over outputs that need not be joined (every tensor of a model exposed, which need not follow the batch)."""
    return memory.parts(lambda part: whole(sess, part, names), feeds, memory.graph_of(sess))


def whole(sess, feeds: dict[str, np.ndarray], names: list[str] | None = None) -> dict[str, np.ndarray]:
    """One run on the whole feed, unplanned; the arena's unused memory handed back after it."""
    names = names or [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds, _shrinking())))


_RUN_OPTIONS: list[Any] = []


def _shrinking() -> Any:
    """Run options that shrink ONNX Runtime's CPU arena after each run: the memory a run freed goes back, so the
    next run's budget sees what the process holds."""
    if not _RUN_OPTIONS:
        import onnxruntime as ort

        options = ort.RunOptions()
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        _RUN_OPTIONS.append(options)
    return _RUN_OPTIONS[0]


def relative_errors(ref: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> list[float]:
    """Per float output of one sample: ||got - ref|| / ||ref|| (1e6 where the candidate is not finite)."""
    errors = []
    for name, r in ref.items():
        if not np.issubdtype(r.dtype, np.floating):
            continue
        r64, g64 = r.astype(np.float64), got[name].astype(np.float64)
        if not np.all(np.isfinite(g64)):
            errors.append(1e6)
            continue
        norm = float(np.linalg.norm(r64))
        errors.append(float(np.linalg.norm(g64 - r64)) / norm if norm > 0 else float(np.abs(g64).max(initial=0)))
    return errors


def compare(ref: dict[str, np.ndarray], got: dict[str, np.ndarray], rtol: float, atol: float
            ) -> dict[str, OutputDiff]:
    """Per output: max absolute and relative difference, and whether all elements are within atol + rtol*|ref|."""
    per_output = {}
    for name, r in ref.items():
        if name not in got:
            per_output[name] = OutputDiff(ok=False, error="missing output")
            continue
        g = got[name]
        if r.shape != g.shape:
            per_output[name] = OutputDiff(ok=False, error=f"shape {list(g.shape)} != {list(r.shape)}")
            continue
        r64, g64 = r.astype(np.float64), g.astype(np.float64)
        diff = np.abs(r64 - g64)
        finite = np.isfinite(r64) & np.isfinite(g64)
        nan_mismatch = int(np.count_nonzero(np.isnan(r64) != np.isnan(g64)))
        rel = diff / np.maximum(np.abs(r64), 1e-12)
        within = bool(np.all(diff[finite] <= atol + rtol * np.abs(r64[finite]))) and nan_mismatch == 0
        per_output[name] = OutputDiff(ok=within, max_abs=float(diff[finite].max(initial=0.0)),
                                      max_rel=float(rel[finite].max(initial=0.0)), nan_mismatch=nan_mismatch)
    return per_output


@dataclass
class ModelDiff:
    """Two models on the same inputs (`compare_models`): the worst difference per output over `samples`, the
    tolerances, the input shapes of the last sample, a violation per output beyond them. True when none is."""
    runtime: str
    rtol: float
    atol: float
    samples: int = 0
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    outputs: dict[str, OutputDiff] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return not self.violations


def compare_models(ref_path: Path, new_path: Path, feeds: Iterable[dict[str, np.ndarray]], rtol: float,
                   atol: float, ref_outputs: list[dict[str, np.ndarray]] | None = None
                   ) -> tuple[ModelDiff, list[dict[str, np.ndarray]]]:
    """Both models on the same inputs; the worst difference per output over all samples, and a violation per
    output with elements beyond atol + rtol * |reference|, with the new model's outputs per sample (the next
    check's `ref_outputs`, when the new model is its reference: not run twice). A failure of the reference model
    itself raises `ReferenceFailed` (the inputs, not the transformation, are at fault)."""
    ref_sess = session(ref_path) if ref_outputs is None else None
    new_sess = session(new_path)
    found, made = ModelDiff(RUNTIME, rtol, atol), []
    for index, feed in enumerate(feeds):
        found.input_shapes = {k: list(v.shape) for k, v in feed.items()}
        try:
            ref = run(ref_sess, feed) if ref_outputs is None else ref_outputs[index]
        except StageError:  # the memory budget's refusal (memory.py): one line naming the shape already
            raise
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own exception types
            raise ReferenceFailed(exc, feed) from None
        found.samples += 1
        made.append(run(new_sess, feed))
        for name, r in compare(ref, made[-1], rtol, atol).items():
            prev = found.outputs.get(name)
            if prev is None or not r.ok or (r.max_abs or 0) > (prev.max_abs or 0):
                if prev is None or prev.ok:
                    found.outputs[name] = r
    found.violations = [f"output '{name}': {r.problem(rtol, atol)}" for name, r in found.outputs.items() if not r.ok]
    return found, made


class ReferenceFailed(Exception):
    """The reference model cannot run on the given inputs (ONNX Runtime's error in `error`)."""

    def __init__(self, error: BaseException, feed: dict[str, np.ndarray]):
        super().__init__(str(error))
        self.error, self.feed = error, feed
