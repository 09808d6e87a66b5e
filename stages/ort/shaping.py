"""Samples made into a profile's shape from the user's files (validate checks every dynamic profile at its min, opt
and max): each input cut or grown along every dimension where its sample differs from the target, and the batch
dimension filled with more samples. What was done is kept as notes, so the report says how each row's data was made.

Growing a dimension: an input named in `data.pad` is padded with that value (token ids: the tokenizer's pad id);
otherwise integer and boolean inputs are padded with 0 (an attention mask's padding, token type 0) and float inputs
repeat their content (features of a longer sequence, rather than a row of zeros that means nothing to the model).
Shrinking keeps the first elements. Dimension 0 is the batch where every model input's first dimension is dynamic
(Triton's rule): a batch of B takes B samples (files in turn, from the start again where there are fewer).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def along(x: np.ndarray, axis: int, size: int, pad: float | None) -> np.ndarray:
    """`x` cut or grown to `size` along `axis`: grown with `pad`, or (None) by repeating its content."""
    n = x.shape[axis]
    if size <= n:
        return np.take(x, np.arange(size), axis=axis)
    if pad is None:
        return np.take(x, np.arange(size) % n, axis=axis)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - n)
    return np.pad(x, widths, constant_values=np.asarray(pad).astype(x.dtype))


@dataclass
class Notes:
    """What making samples into one shape did: per (input, dimension, how) the sizes it started from and the size
    it made, and whole sentences (how images were made, how batches were filled), each said once."""
    made: dict[tuple[str, int, str], tuple[set[int], int]] = field(default_factory=dict)
    said: dict[str, None] = field(default_factory=dict)

    def add(self, name: str, axis: int, how: str, was: int, now: int) -> None:
        self.made.setdefault((name, axis, how), (set(), now))[0].add(was)

    def say(self, sentence: str) -> None:
        self.said[sentence] = None

    def by_input(self) -> dict[str, list[str]]:
        """Per input, what was done to it ("padded along dim 1 from 5..7 to 16"), in input and dimension order."""
        done: dict[str, list[str]] = {}
        for (name, axis, how), (was, now) in sorted(self.made.items()):
            start = f"{min(was)}" if len(was) == 1 else f"{min(was)}..{max(was)}"
            done.setdefault(name, []).append(f"{how} along dim {axis} from {start} to {now}")
        return done

    def text(self) -> str:
        parts = list(self.said) + [f"{name} {what}" for name, done in self.by_input().items() for what in done]
        return "; ".join(parts) or "as given"


@dataclass
class Target:
    """One profile shape for file samples: per input its shape, the pad values, whether dim 0 is the batch."""
    shapes: dict[str, list[int]]
    pads: dict[str, float]
    batched: bool
    notes: Notes = field(default_factory=Notes)

    @classmethod
    def of(cls, shapes: dict[str, list[int]], model_inputs: list[Any], pads: dict[str, float]) -> "Target":
        batched = all(m.shape and not (isinstance(m.shape[0], int) and m.shape[0] > 0) for m in model_inputs)
        return cls(shapes, pads, batched)

    @property
    def batch_size(self) -> int | None:
        """The batch the target wants (None where dim 0 is no batch)."""
        wanted = [s[0] for s in self.shapes.values() if s]
        return max(wanted) if self.batched and wanted else None

    def files_per_sample(self, rows: int) -> int:
        """How many files one sample takes, each giving `rows` rows."""
        b = self.batch_size
        return 1 if b is None else max(1, -(-b // max(rows, 1)))

    def fit(self, feed: dict[str, np.ndarray], floats_pad: dict[str, float] | None = None) -> dict[str, np.ndarray]:
        """One file's feed with every non-batch dimension made the target's (`floats_pad`: float inputs padded
        with a value rather than repeated, where the caller knows better: a preprocessed image)."""
        out = {}
        for name, x in feed.items():
            want = self.shapes.get(name)
            if want is None:
                out[name] = x
                continue
            if len(want) != x.ndim:
                raise ValueError(f"input '{name}': a sample of shape {list(x.shape)} cannot be made the profile's "
                                 f"{want} (the ranks differ)")
            pad = self.pads.get(name, (floats_pad or {}).get(name))
            if pad is None and x.dtype.kind != "f":
                pad = 0
            for axis in range(1 if self.batched else 0, x.ndim):
                if x.shape[axis] != want[axis]:
                    how = ("cropped" if x.shape[axis] > want[axis] else
                           "tiled" if pad is None else f"padded with {pad:g}")
                    self.notes.add(name, axis, how, x.shape[axis], want[axis])
                    x = along(x, axis, want[axis], pad)
            out[name] = x
        return out

    def batch(self, feeds: list[dict[str, np.ndarray]], files: int) -> dict[str, np.ndarray]:
        """Fitted feeds of consecutive files as one batch of the target's size (`files`: how many there are)."""
        b = self.batch_size
        if b is None:
            return feeds[0]
        out = {}
        for name in feeds[0]:
            x = np.concatenate([f[name] for f in feeds], axis=0) if len(feeds) > 1 else feeds[0][name]
            if x.shape[0] != b or len(feeds) > 1:
                rows = feeds[0][name].shape[0]
                self.notes.say(f"batches of {b}: " + (
                    f"the first {b} of each file's {rows} rows" if len(feeds) == 1 else
                    f"{len(feeds)} files each" + (" (files taken again: fewer files than that)"
                                                  if len(feeds) > files else "")))
                x = along(x, 0, b, None)
            out[name] = x
        return out
