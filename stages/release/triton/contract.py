"""The serving contract of a release: what a client of the Triton model may send and gets back (names, data types,
dimensions as Triton declares them, max_batch_size and batching) and the shapes the engine takes (each optimization
profile's min/opt/max per input, which Triton's config cannot say: a dimension a profile bounds is -1 there).

It is written beside `config.pbtxt` as `contract.json` (Triton ignores it; clients, the stand-in backend of the
tests and the preprocessing model read it) and kept with each version's record, so that a new version whose
contract differs from the previous one of the same model and target is refused unless the pipeline allows it.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

FILE = "contract.json"


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    data_type: str  # Triton's TYPE_*
    dims: list[int]  # as config.pbtxt declares them: without the batch dimension where max_batch_size > 0


class ProfileRange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    shapes: dict[str, tuple[list[int], list[int], list[int]]]  # input -> full (min, opt, max), batch included


class Contract(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    max_batch_size: int
    dynamic_batching: bool
    profiles: list[ProfileRange]

    @classmethod
    def of(cls, config: Any, profiles: list[Any]) -> "Contract":
        """From the parsed config.pbtxt and the engine's profiles (`trt.records.Profile`)."""
        from trtflow.stages.release.triton.config import model_config_pb2
        pb = model_config_pb2()

        def specs(tensors: Any) -> list[TensorSpec]:
            return [TensorSpec(name=t.name, data_type=pb.DataType.Name(t.data_type), dims=list(t.dims))
                    for t in tensors]
        return cls(inputs=specs(config.input), outputs=specs(config.output), max_batch_size=config.max_batch_size,
                   dynamic_batching=config.HasField("dynamic_batching"),
                   profiles=[ProfileRange(name=p.name, shapes={k: (list(lo), list(opt), list(hi))
                                                               for k, (lo, opt, hi) in p.shapes.items()})
                             for p in profiles])

    def changes(self, before: "Contract") -> list[str]:
        """What a client of `before` finds different here, one line each (empty: the same contract)."""
        out = []
        for what, old, new in (("input", before.inputs, self.inputs), ("output", before.outputs, self.outputs)):
            olds, news = {t.name: t for t in old}, {t.name: t for t in new}
            out += [f"{what} '{n}' removed" for n in olds if n not in news]
            out += [f"{what} '{n}' added" for n in news if n not in olds]
            for n in olds.keys() & news.keys():
                a, b = olds[n], news[n]
                if a.data_type != b.data_type:
                    out.append(f"{what} '{n}': {a.data_type} -> {b.data_type}")
                if a.dims != b.dims:
                    out.append(f"{what} '{n}': dims {a.dims} -> {b.dims}")
        if before.max_batch_size != self.max_batch_size:
            out.append(f"max_batch_size {before.max_batch_size} -> {self.max_batch_size}")
        if before.dynamic_batching != self.dynamic_batching:
            out.append(f"dynamic batching {'on' if before.dynamic_batching else 'off'} -> "
                       f"{'on' if self.dynamic_batching else 'off'}")
        old_env, new_env = before.envelope(), self.envelope()
        for name in old_env.keys() & new_env.keys():
            if old_env[name] != new_env[name]:
                (a, b), (c, d) = old_env[name], new_env[name]
                out.append(f"input '{name}' shapes {a}..{b} -> {c}..{d}")
        return sorted(set(out))

    def envelope(self) -> dict[str, tuple[list[int], list[int]]]:
        """Per input, the smallest and largest shape any profile takes, dimension by dimension."""
        out: dict[str, tuple[list[int], list[int]]] = {}
        for p in self.profiles:
            for name, (lo, _, hi) in p.shapes.items():
                if name in out and len(out[name][0]) == len(lo):
                    a, b = out[name]
                    out[name] = ([min(x, y) for x, y in zip(a, lo)], [max(x, y) for x, y in zip(b, hi)])
                else:
                    out[name] = (list(lo), list(hi))
        return out
