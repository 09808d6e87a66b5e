"""`model_warmup` for a released engine: one request per optimization profile at its opt shape, run by Triton before
the model is ready (the first real request would otherwise pay for CUDA graphs, tactics and memory). The data is the
release's own samples (the validation images or tensors, `data:`), one sample per input written raw under the
model's `warmup/` directory, which Triton duplicates up to the request's batch size; where no sample has the opt
shape (or the samples are random), Triton's `random_data` instead.

File names are numbers (profile, input): a tensor name never becomes a path.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trtflow.stages.release.triton import schema
from trtflow.stages.trt.engines import Profile


def add(config: Any, profiles: list[Profile], sample: dict[str, np.ndarray] | None, model_dir: Path) -> list[str]:
    """`config.model_warmup` per profile, the data files under `model_dir/warmup/`; returns a note per input that
    is warmed with random data although samples were given."""
    pb = schema.model_config_pb2()
    batched = config.max_batch_size > 0
    notes: list[str] = []
    for pi, prof in enumerate(profiles or [Profile(name="default", shapes={})]):
        warm = config.model_warmup.add(name=f"opt-{prof.name}", batch_size=1)
        for ii, tensor in enumerate(config.input):
            rng = prof.shapes.get(tensor.name)
            opt = list(rng[1]) if rng is not None else ([1] if batched else []) + [max(d, 1) for d in tensor.dims]
            if batched:
                warm.batch_size = max(warm.batch_size, min(opt[0], config.max_batch_size))
            dims = list(tensor.dims) if tensor.HasField("reshape") else (opt[1:] if batched else opt)
            item = warm.inputs[tensor.name]
            item.data_type = tensor.data_type
            item.dims.extend(dims)
            data = _one(sample, tensor.name, dims, batched)
            dtype = schema.NUMPY.get(pb.DataType.Name(tensor.data_type))
            if data is None or dtype is None:
                item.random_data = True
                if sample is not None:
                    notes.append(f"warmup of profile '{prof.name}': no sample of input '{tensor.name}' has its opt "
                                 f"shape {opt}: Triton's random data instead")
                continue
            (model_dir / "warmup").mkdir(exist_ok=True)
            name = f"{pi}-{ii}.bin"
            (model_dir / "warmup" / name).write_bytes(np.ascontiguousarray(data, dtype=dtype).tobytes())
            item.input_data_file = name
    return notes


def _one(sample: dict[str, np.ndarray] | None, name: str, dims: list[int], batched: bool) -> np.ndarray | None:
    """One sample of input `name` with `dims` (without the batch dimension where the model is batched)."""
    if sample is None or name not in sample:
        return None
    data = sample[name]
    one = data[0] if batched and data.ndim == len(dims) + 1 else data
    if list(one.shape) == dims:
        return one
    return one.reshape(dims) if one.size == int(np.prod(dims)) else None
