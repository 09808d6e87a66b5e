"""The store's FP32 reference outputs (stages/ort/references.py): read back exactly, keyed by the model and every
byte, shape and dtype of the feed, never served when they do not match their record, bounded by the setting with
the least recently used removed first, and turned off by 0."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from trtflow.stages.ort.references import INDEX, References


def _refs(root: Path | None, model: str = "m" * 64, limit: int = 1 << 30) -> References:
    return References(root, model, limit)


def _feed(seed: int, n: int = 16) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, n)).astype(np.float32)}


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        return {"y": next(iter(feed.values())) * 2, "ids": np.arange(3, dtype=np.int64)}


def test_outputs_are_computed_once_and_read_back_exactly(tmp_path):
    compute = Counting()
    first = _refs(tmp_path).outputs(_feed(0), compute)
    again = _refs(tmp_path)
    second = again.outputs(_feed(0), compute)
    assert compute.calls == 1 and (again.computed, again.reused) == (0, 1)
    assert second.keys() == first.keys()
    for name in first:
        assert second[name].dtype == first[name].dtype and np.array_equal(second[name], first[name])


@pytest.mark.parametrize("change", ["a value", "the dtype", "the shape", "the input's name", "the model"])
def test_anything_the_outputs_depend_on_is_in_the_key(tmp_path, change):
    compute = Counting()
    _refs(tmp_path).outputs(_feed(0), compute)
    feed, model = _feed(0), "m" * 64
    if change == "a value":
        feed["x"][0, 3] += 1e-6
    elif change == "the dtype":
        feed["x"] = feed["x"].astype(np.float64)
    elif change == "the shape":
        feed["x"] = feed["x"].reshape(2, 8)
    elif change == "the input's name":
        feed = {"x2": feed["x"]}
    else:
        model = "n" * 64
    _refs(tmp_path, model).outputs(feed, compute)
    assert compute.calls == 2


def test_an_entry_that_does_not_match_its_record_is_dropped_and_computed_again(tmp_path):
    compute = Counting()
    refs = _refs(tmp_path)
    refs.outputs(_feed(0), compute)
    entry = next(tmp_path.glob("??/*.npz"))
    data = bytearray(entry.read_bytes())
    data[-20] ^= 0xFF
    entry.write_bytes(bytes(data))
    out = _refs(tmp_path).outputs(_feed(0), compute)
    assert compute.calls == 2 and np.array_equal(out["y"], _feed(0)["x"] * 2)
    assert (tmp_path / INDEX / entry.stem).exists()  # written again, whole


def test_the_least_recently_used_go_first_beyond_the_limit(tmp_path):
    compute = Counting()
    one = len(_entry_bytes(tmp_path / "probe", compute))
    refs = _refs(tmp_path, limit=int(2.5 * one))
    for seed in (1, 2):
        refs.outputs(_feed(seed), compute)
    first = next(p for p in tmp_path.glob("??/*.npz") if p.stem == refs.key(_feed(1)))
    os.utime(first, ns=(1, 1))  # seed 1's entry, used long ago
    refs.outputs(_feed(2), compute)  # seed 2's: read, so used now
    refs.outputs(_feed(3), compute)  # a third entry: one must go
    kept = {p.stem for p in tmp_path.glob("??/*.npz")}
    assert kept == {refs.key(_feed(2)), refs.key(_feed(3))}
    assert sum(p.stat().st_size for p in tmp_path.glob("??/*.npz")) <= 2.5 * one


def _entry_bytes(root: Path, compute: Counting) -> bytes:
    _refs(root).outputs(_feed(9), compute)
    return next(root.glob("??/*.npz")).read_bytes()


def test_zero_keeps_nothing_and_no_store_keeps_nothing(tmp_path):
    compute = Counting()
    for refs in (_refs(tmp_path, limit=0), _refs(None)):
        refs.outputs(_feed(0), compute)
        refs.outputs(_feed(0), compute)
    assert compute.calls == 4 and not list(tmp_path.iterdir())


def test_a_symlinked_index_is_never_written_through(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "refs"
    root.mkdir()
    (root / INDEX).symlink_to(elsewhere)
    _refs(root).outputs(_feed(0), Counting())
    assert not list(elsewhere.iterdir())


def test_string_inputs_are_keyed_by_their_values_not_their_buffers(tmp_path):
    """ONNX Runtime's string tensors are object arrays: their buffer holds addresses, which the key must not read."""
    refs = _refs(tmp_path)
    same = {"text": np.array(["".join(["a", "b"]), "c"], dtype=object)}
    again = {"text": np.array(["ab", "c"], dtype=object)}
    other = {"text": np.array(["ab", "d"], dtype=object)}
    assert refs.key(same) == refs.key(again) != refs.key(other)


def test_outputs_named_as_savez_arguments_read_back(tmp_path):
    def compute(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"file": feed["x"], "allow_pickle": feed["x"] + 1, "arr_0": feed["x"] * 3}

    _refs(tmp_path).outputs(_feed(0), compute)
    again = _refs(tmp_path)
    out = again.outputs(_feed(0), compute)
    assert again.reused == 1 and list(out) == ["file", "allow_pickle", "arr_0"]
    assert np.array_equal(out["arr_0"], _feed(0)["x"] * 3)
