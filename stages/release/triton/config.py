"""A Triton `config.pbtxt` for one engine (platform `tensorrt_plan`), derived from what the build recorded: the
engine's IO tensors (names, TensorRT data types, dimensions with -1 where dynamic) and its optimization profiles.

- Batching: when every input and output has a dynamic first dimension and every profile starts it at 1, that
  dimension is Triton's batch: `max_batch_size` is the largest batch every profile takes (the least of their
  maxima: each instance group runs one profile), `dims` leave it out, and dynamic batching prefers the profiles'
  opt batches. Otherwise `max_batch_size: 0` and `dims` are the engine's full shape.
- `dims`: the engine's, with a dynamic dimension fixed where every profile pins it (min = max), -1 elsewhere.
- Instance groups: on GPU (Triton's TensorRT backend runs nowhere else); one per optimization profile where the
  engine has several, each naming its profile.

`problems` checks a config against the engine with the rules Triton's TensorRT backend and core apply at load
(tensorrt_backend `CompareDimsSupported`/`ValidateDimension`, core `ValidateModelConfig`/`ValidateInstanceGroup`),
and the ones it leaves to failed requests (a `max_batch_size` beyond a profile's maximum loads, then fails).

A config is checked as Triton reads it: through Triton's own schema (`model_config_pb2`, as `tritonclient` ships it:
`tritonclient.grpc`'s package import needs grpcio, whose `[grpc]` extra pins protobuf < 7 while everything else here
runs on protobuf 7; the generated module needs only protobuf, so it is loaded from its file, without the package
around it). `add_warmup` writes its `model_warmup`.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from trtflow.errors import StageError
from trtflow.pipelines.params.release import TritonSpec
from trtflow.stages.trt.engines import Engine
from trtflow.stages.trt.records import Profile

if TYPE_CHECKING:
    from trtflow.stages.ort.samples import SampleSource

PLAN_FILE = "model.plan"
PLATFORM = "tensorrt_plan"

# TensorRT DataType -> Triton's (tensorrt_backend ConvertTrtTypeToConfigDataType); FP8, INT4, FP4 have none
DATA_TYPES = {"FLOAT": "TYPE_FP32", "HALF": "TYPE_FP16", "BF16": "TYPE_BF16", "INT8": "TYPE_INT8",
              "UINT8": "TYPE_UINT8", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "BOOL": "TYPE_BOOL"}


class ConfigError(ValueError):
    """The engine cannot be served by Triton's TensorRT backend as it is (one line: what, and what to do)."""


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: list[int]  # -1 where dynamic
    dtype: str  # TensorRT's name (FLOAT, HALF, ...)


def engine_io(engine: Engine) -> tuple[list[Tensor], list[Tensor]]:
    built = engine.built
    if built.inputs is None or built.outputs is None:
        raise ConfigError(f"engine '{engine.cell.name}': its build record has no IO tensors (built by an older "
                          f"trtflow): run the build stage again (--force build)")
    return [Tensor(t.name, list(t.shape), t.dtype) for t in built.inputs], \
        [Tensor(t.name, list(t.shape), t.dtype) for t in built.outputs]


def batch_limits(inputs: list[Tensor], outputs: list[Tensor], profiles: list[Profile]) -> tuple[int, list[int], str]:
    """(max_batch_size, preferred batch sizes, why there is no batch dimension); 0 when there is none."""
    not_dynamic = [t.name for t in inputs + outputs if not t.shape or t.shape[0] != -1]
    if not_dynamic:
        return 0, [], f"the first dimension of {', '.join(not_dynamic[:3])} is not dynamic"
    if not profiles:
        return 0, [], "the engine has no optimization profile"
    maxima, preferred = [], set()
    for prof in profiles:
        ranges = [prof.shapes[t.name] for t in inputs if t.name in prof.shapes]
        if not ranges:
            return 0, [], f"profile '{prof.name}' sets no input's shape"
        if any(lo[0] != 1 for lo, _, _ in ranges):
            return 0, [], f"profile '{prof.name}' does not take a batch of 1"
        maxima.append(min(hi[0] for _, _, hi in ranges))
        preferred.add(min(opt[0] for _, opt, _ in ranges))
    largest = min(maxima)
    return largest, sorted(b for b in preferred if 1 < b <= largest), ""


def _dims(tensor: Tensor, profiles: list[Profile], batched: bool) -> list[int]:
    dims = list(tensor.shape)
    for i, d in enumerate(dims):
        if d != -1 or i == 0 and batched:
            continue
        size = _pinned(tensor, profiles, i, len(dims))
        if size is not None:
            dims[i] = size
    return dims[1:] if batched else dims


def _pinned(tensor: Tensor, profiles: list[Profile], i: int, rank: int) -> int | None:
    """The one size every profile gives dynamic dimension `i` of `tensor` (each profile shapes it, and all of those
    of its rank have min = max, the same), else None."""
    if not all(p.shapes.get(tensor.name) for p in profiles):
        return None
    pinned = {(rng[0][i], rng[2][i]) for p in profiles if len((rng := p.shapes[tensor.name])[0]) == rank}
    if len(pinned) != 1:
        return None
    lo, hi = pinned.pop()
    return lo if lo == hi else None


def _data_type(tensor: Tensor, engine: Engine) -> str:
    if tensor.dtype not in DATA_TYPES:
        raise ConfigError(f"engine '{engine.cell.name}': tensor '{tensor.name}' is {tensor.dtype}, which Triton's "
                          f"TensorRT backend cannot exchange (it takes {', '.join(DATA_TYPES)}): keep the model's "
                          f"IO in one of those (precision stages keep FP32 IO by default)")
    return DATA_TYPES[tensor.dtype]


def make(model_name: str, engine: Engine, spec: TritonSpec) -> Any:
    """The engine's `ModelConfig` (Triton's protobuf message)."""
    pb = model_config_pb2()
    inputs, outputs = engine_io(engine)
    profiles = engine.cell.profiles
    max_batch, preferred, why = batch_limits(inputs, outputs, profiles)
    if spec.max_batch_size is not None:
        if spec.max_batch_size > max_batch:
            raise ConfigError(f"engine '{engine.cell.name}': triton.max_batch_size {spec.max_batch_size}, but "
                              + (f"the engine takes batches of at most {max_batch}" if max_batch else
                                 f"it has no batch dimension Triton can fill ({why})")
                              + ": leave it out, or lower it")
        max_batch = spec.max_batch_size
        preferred = [b for b in preferred if b <= max_batch]
    config = pb.ModelConfig(name=model_name, platform=PLATFORM, max_batch_size=max_batch,
                            default_model_filename=PLAN_FILE)
    for tensor, into in [(t, config.input) for t in inputs] + [(t, config.output) for t in outputs]:
        dims = _dims(tensor, profiles if tensor in inputs else [], max_batch > 0)
        item = into.add(name=tensor.name, data_type=pb.DataType.Value(_data_type(tensor, engine)))
        if dims:
            item.dims.extend(dims)
        else:  # a batched tensor of one value per sample: Triton needs dims, and reshapes to the engine's
            item.dims.append(1)
            item.reshape.SetInParent()
    if max_batch > 1 and spec.dynamic_batching:
        config.dynamic_batching.preferred_batch_size.extend(preferred)
        config.dynamic_batching.max_queue_delay_microseconds = round(spec.max_queue_delay * 1e6)
    if spec.optimization:
        from google.protobuf import json_format
        try:
            json_format.ParseDict({"optimization": spec.optimization}, config)
        except json_format.ParseError as exc:
            raise ConfigError(f"triton.optimization is not Triton's `optimization` block: {exc}") from None
    if spec.response_cache:
        config.response_cache.enable = True
    for key, value in spec.parameters.items():
        config.parameters[key].string_value = value
    groups = [[str(i)] for i in range(len(profiles))] if len(profiles) > 1 else [[]]
    for names in groups:
        group = config.instance_group.add(count=spec.instances, kind=pb.ModelInstanceGroup.KIND_GPU)
        group.gpus.extend(spec.gpus)
        group.profile.extend(names)
    return config


def problems(config: Any, engine: Engine) -> list[str]:
    """What Triton would refuse at load, or fail on at the first request, in `config` for `engine`."""
    pb = model_config_pb2()
    inputs, outputs = engine_io(engine)
    batch = config.max_batch_size
    out: list[str] = []
    if config.platform != PLATFORM and config.backend != "tensorrt":
        out.append(f"platform is '{config.platform}', not '{PLATFORM}'")
    if batch < 0:
        out.append(f"max_batch_size {batch} is negative")
    out += _io_problems(pb, config.input, inputs, "input", batch)
    out += _io_problems(pb, config.output, outputs, "output", batch)
    out += _profile_problems(config, engine.cell.profiles, batch)
    out += [f"instance group kind {pb.ModelInstanceGroup.Kind.Name(g.kind)}: Triton's TensorRT backend runs on GPU "
            f"only (KIND_GPU)" for g in config.instance_group if g.kind != pb.ModelInstanceGroup.KIND_GPU]
    if config.HasField("dynamic_batching"):
        out += _batching_problems(config.dynamic_batching, batch)
    return out


def _io_problems(pb: Any, declared: Any, actual: list[Tensor], what: str, batch: int) -> list[str]:
    """The config's inputs (or outputs) against the engine's: the same names, and each one's type and dims."""
    by_name = {t.name: t for t in actual}
    names = [d.name for d in declared]
    out = [f"{what}s {sorted(names)} are not the engine's {sorted(by_name)}"] if sorted(names) != sorted(by_name) \
        else []
    for d in declared:
        if d.name in by_name:
            out += _tensor_problems(pb, d, by_name[d.name], what, batch)
    return out


def _tensor_problems(pb: Any, d: Any, t: Tensor, what: str, batch: int) -> list[str]:
    """One declared tensor against the engine's: data type, dims Triton accepts, rank and sizes with the batch."""
    out = []
    if pb.DataType.Name(d.data_type) != DATA_TYPES.get(t.dtype):
        out.append(f"{what} '{d.name}': {pb.DataType.Name(d.data_type)}, but the engine's is {t.dtype}")
    dims = list(d.reshape.shape) if d.HasField("reshape") else list(d.dims)
    if not d.dims or any(x < 1 and x != -1 for x in d.dims):
        out.append(f"{what} '{d.name}': dims {list(d.dims)} (each must be -1 or at least 1)")
    full = _with_batch(dims, batch)
    if len(full) != len(t.shape):
        out.append(f"{what} '{d.name}': {len(full)} dimensions with the batch, the engine has {len(t.shape)} "
                   f"({t.shape})")
        return out
    out += [f"{what} '{d.name}': dimension {i} is {c}, the engine's is {e}"
            for i, (c, e) in enumerate(zip(full, t.shape)) if _clash(c, e)]
    if batch > 0 and t.shape[0] != -1:
        out.append(f"{what} '{d.name}': max_batch_size {batch} > 0, but the engine's first dimension is "
                   f"{t.shape[0]}, not a batch")
    return out


def _with_batch(dims: list[int], batch: int) -> list[int]:
    """A config's dims as the engine's shape has them: the batch dimension first where the config batches."""
    return [-1, *dims] if batch > 0 else dims


def _clash(declared: int, engine: int) -> bool:
    """Whether a dimension the config fixes differs from the engine's fixed one (-1 is dynamic: it never clashes)."""
    return -1 not in (declared, engine) and declared != engine


def _profile_problems(config: Any, profiles: list[Profile], batch: int) -> list[str]:
    """Each profile an instance group runs (profile 0 where none names one): it exists, and takes the batches and
    fixed dims the config declares."""
    out = []
    for i in sorted({int(p) for g in config.instance_group for p in g.profile} or {0}):
        if not 0 <= i < max(len(profiles), 1):
            out.append(f"instance group profile {i}: the engine has {len(profiles)} profile(s)")
        elif profiles:
            out += [msg for d in config.input for msg in _input_in_profile(d, profiles[i], batch)]
    return out


def _input_in_profile(d: Any, prof: Profile, batch: int) -> list[str]:
    rng = prof.shapes.get(d.name)
    if rng is None:
        return []
    lo, _, hi = rng
    out = []
    if batch > 0 and not (lo[0] <= 1 and batch <= hi[0]):
        out.append(f"input '{d.name}': profile '{prof.name}' takes batches {lo[0]}..{hi[0]}, Triton sends 1..{batch}")
    full = _with_batch(list(d.dims), batch)
    out += [f"input '{d.name}': dimension {j} is {c}, outside profile '{prof.name}' ({lo[j]}..{hi[j]})"
            for j, c in enumerate(full) if c != -1 and j < len(lo) and not lo[j] <= c <= hi[j]]
    return out


def _batching_problems(dynamic_batching: Any, batch: int) -> list[str]:
    out = ["dynamic batching with max_batch_size 0"] if batch == 0 else []
    bad = [b for b in dynamic_batching.preferred_batch_size if not 0 < b <= batch]
    if bad:
        out.append(f"preferred batch sizes {bad} are not within 1..max_batch_size ({batch})")
    return out


MODULE = "tritonclient.grpc.model_config_pb2"
# Triton's data types that trtflow writes as numpy arrays (the preprocessing's tensor, warmup files, the card's
# request example): Triton's name -> numpy's
NUMPY = {"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_UINT8": "uint8", "TYPE_INT8": "int8",
         "TYPE_INT32": "int32", "TYPE_INT64": "int64", "TYPE_BOOL": "bool"}


@cache
def model_config_pb2() -> ModuleType:
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    found = importlib.util.find_spec("tritonclient")
    locations = list(found.submodule_search_locations or []) if found else []
    for base in locations:
        spec = importlib.util.spec_from_file_location(MODULE, f"{base}/grpc/model_config_pb2.py")
        if spec is None or spec.loader is None:
            continue
        try:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except (OSError, ImportError):
            continue
        sys.modules[MODULE] = module
        return module
    raise StageError("Triton's model configuration schema was not found: install tritonclient (a dependency of "
                     "trtflow: pip install -e . again)")


def parse(text: str) -> Any:
    """A config.pbtxt as Triton reads it (`ModelConfig` in protobuf text format); a ValueError names what Triton
    would not accept."""
    from google.protobuf import text_format

    try:
        return text_format.Parse(text, model_config_pb2().ModelConfig())
    except text_format.ParseError as exc:
        raise ValueError(f"not a Triton model configuration: {exc}") from None


def to_text(config: Any) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(config)


def add_warmup(config: Any, profiles: list[Profile], source: SampleSource | None, model_dir: Path) -> list[str]:
    """`config.model_warmup`: one request per optimization profile at its opt shape, run by Triton before the model
    is ready (the first real request would otherwise pay for CUDA graphs, tactics and memory). The data is the
    release's own (`data:`) made into the opt shape as validate makes its batches (`SampleSource.at`: files cut or
    padded, `data.pad` honoured; random data drawn within `data.ranges` or the table an input indexes), the batch's
    first row per input written raw under `model_dir/warmup/`, which Triton duplicates up to the request's batch
    size. Integer and boolean inputs never get Triton's `random_data` (random ids far outside a vocabulary, fed to
    an embedding's gather at load): a random one nothing bounds is zeros, and where the data cannot make a shape
    the values are drawn from the range the data holds. Float inputs of random data get Triton's random data.
    File names are numbers (profile, input): a tensor name never becomes a path. Returns the warnings: per profile,
    the inputs the data had to be padded or cropped into its opt shape, or could not make; random integers, once."""
    batched = config.max_batch_size > 0
    notes: list[str] = []
    random_ints: dict[str, str] = {}  # random data: integer input -> where its values come from
    for pi, prof in enumerate(profiles or [Profile(name="default", shapes={})]):
        warm = config.model_warmup.add(name=f"opt-{prof.name}", batch_size=1)
        opts = {t.name: _opt(t, prof, batched) for t in config.input}
        if batched:
            warm.batch_size = max([1] + [min(o[0], config.max_batch_size) for o in opts.values()])
        made = _Made.at(source, opts, config)
        for ii, tensor in enumerate(config.input):
            item = warm.inputs[tensor.name]
            item.data_type = tensor.data_type
            item.dims.extend(_warm_dims(tensor, opts[tensor.name], batched))
            data = made.value(tensor, batched)
            if data is None:
                item.random_data = True
                continue
            (model_dir / "warmup").mkdir(exist_ok=True)
            item.input_data_file = f"{pi}-{ii}.bin"
            (model_dir / "warmup" / item.input_data_file).write_bytes(np.ascontiguousarray(data).tobytes())
        notes += made.warnings(prof.name)
        random_ints.update(made.random_ints)
    if random_ints:
        notes.append("warmup: the release's data is random: integer input(s) " + "; ".join(
            f"'{n}' {how}" for n, how in random_ints.items()) + ", never Triton's random data (give data.tensors, "
            "or declare data.ranges, for realistic values)")
    return notes


def _opt(tensor: Any, prof: Profile, batched: bool) -> list[int]:
    """The engine's shape of an input at the profile's opt (its batch dimension included)."""
    rng = prof.shapes.get(tensor.name)
    return list(rng[1]) if rng is not None else ([1] if batched else []) + [max(d, 1) for d in tensor.dims]


def _warm_dims(tensor: Any, opt: list[int], batched: bool) -> list[int]:
    """An input's dims in the warmup request: the config's where Triton reshapes it, else the opt shape without
    the batch dimension."""
    return list(tensor.dims) if tensor.HasField("reshape") else (opt[1:] if batched else opt)


@dataclass
class _Made:
    """One profile's warmup data: the release's samples made at its opt shapes (None where there are none or none
    is needed), and what making them did, for the warnings."""
    source: SampleSource | None
    opts: dict[str, list[int]]
    feeds: dict[str, np.ndarray] | None = None
    reshaped: dict[str, list[str]] = field(default_factory=dict)  # input -> how its files were cut or padded
    cannot: dict[str, str] = field(default_factory=dict)  # input -> its shape and the values drawn instead
    random_ints: dict[str, str] = field(default_factory=dict)  # input -> the range of its random values

    @property
    def random(self) -> bool:
        return self.source is None or not self.source.from_files

    @classmethod
    def at(cls, source: SampleSource | None, opts: dict[str, list[int]], config: Any) -> "_Made":
        made = cls(source, opts)
        if source is None or not len(source) or made.random and not any(made.drawn_here(t) for t in config.input):
            return made  # no data, or random floats only (Triton's random data is as good)
        shaped = source.at(opts)
        made.feeds = shaped.sample(0)
        made.reshaped = shaped.target.notes.by_input() if shaped.target else {}
        return made

    def drawn_here(self, tensor: Any) -> bool:
        """Whether random data's input is drawn here rather than by Triton: every integer or boolean input, and a
        float input whose range `data.ranges` declares."""
        dtype = _numpy(tensor)
        declared = self.source is not None and tensor.name in self.source.data.ranges
        return dtype is not None and (np.dtype(dtype).kind != "f" or declared)

    def value(self, tensor: Any, batched: bool) -> np.ndarray | None:
        """An input's warmup tensor (one batch row where batched), or None for Triton's random data: a float input
        of random data whose range is not declared, or a type numpy has not (BF16)."""
        dtype = _numpy(tensor)
        if dtype is None or self.random and not self.drawn_here(tensor):
            return None
        dims = _warm_dims(tensor, self.opts[tensor.name], batched)
        if self.random:
            return self._random(tensor.name, dims, dtype, batched)
        data = _one(self.feeds, tensor.name, dims, batched)
        return data.astype(dtype) if data is not None else self._drawn(tensor.name, dims, dtype)

    def _random(self, name: str, dims: list[int], dtype: str, batched: bool) -> np.ndarray:
        """Random data's input drawn here: the random sample's values where a range bounds them (declared in
        `data.ranges`, or the rows of the table an integer input indexes) or they are booleans, else zeros."""
        bounds = self.source.ranges.get(name) if self.source is not None else None
        kind = np.dtype(dtype).kind
        data = _one(self.feeds, name, dims, batched) if bounds is not None or kind == "b" else None
        if data is None:
            self.random_ints[name] = "zeros (nothing bounds its values)"
            return np.zeros(dims, dtype)
        assert self.source is not None
        if kind == "b":
            self.random_ints[name] = "random 0 or 1"
        elif kind != "f":  # a float input in its declared range needs no word
            self.random_ints[name] = f"within [{bounds[0]:g}, {bounds[1]:g}] (" + (
                "data.ranges" if name in self.source.data.ranges else "the rows of the table it indexes") + ")"
        return data.astype(dtype)

    def _drawn(self, name: str, dims: list[int], dtype: str) -> np.ndarray:
        """An input whose data cannot be made its warmup shape: values drawn from the range its data holds (zeros
        without data)."""
        seen = self.feeds.get(name) if self.feeds is not None else None
        if seen is None or not seen.size:
            self.cannot[name] = f"'{name}' {self.opts[name]} (no sample of it): zeros"
            return np.zeros(dims, dtype)
        lo, hi = float(seen.min()), float(seen.max())
        self.cannot[name] = f"'{name}' {self.opts[name]}: values drawn from the range its data holds ({lo:g}..{hi:g})"
        rng = np.random.default_rng(0)
        drawn = rng.uniform(lo, hi, dims) if np.dtype(dtype).kind == "f" else rng.integers(int(lo), int(hi) + 1, dims)
        return drawn.astype(dtype)

    def warnings(self, profile: str) -> list[str]:
        out = []
        if self.reshaped:
            out.append(f"warmup of profile '{profile}': no sample has its opt shape, so it is made as validate makes "
                       f"its batches: " + "; ".join(f"'{n}' {self.opts.get(n)} " + ", ".join(how)
                                                    for n, how in self.reshaped.items()))
        if self.cannot:
            out.append(f"warmup of profile '{profile}': the data cannot make " + "; ".join(self.cannot.values()))
        return out


def _numpy(tensor: Any) -> str | None:
    """numpy's name of a config tensor's data type (None where numpy has none)."""
    return NUMPY.get(model_config_pb2().DataType.Name(tensor.data_type))


def _one(sample: dict[str, np.ndarray] | None, name: str, dims: list[int], batched: bool) -> np.ndarray | None:
    """One sample of input `name` with `dims` (without the batch dimension where the model is batched)."""
    if sample is None or name not in sample:
        return None
    data = sample[name]
    one = data[0] if batched and data.ndim == len(dims) + 1 else data
    if list(one.shape) == dims:
        return one
    return one.reshape(dims) if one.size == int(np.prod(dims)) else None
