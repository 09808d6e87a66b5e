"""The cache key recipe, pinned (as DVC pins its stage hashes): a change of any pinned value below means every
published result in every user's store stops being found. If the change is deliberate, bump
`trtflow.flows.keys.KEY_FORMAT` (or the stage's VERSION) and update the pins; if not, it is a bug."""
from __future__ import annotations

import importlib
import shutil

import pytest
from pydantic import create_model

from tests.assets import PPOCR
from trtflow.flows import keys
from trtflow.flows.fingerprint import Environment
from trtflow.flows.runner import Runner
from trtflow.flows.store import LocalStore
from trtflow.pipelines.kinds import KINDS
from trtflow.pipelines.loader import load_pipeline
from trtflow.stages.trt.env import TensorRT

PARTS = keys.key_parts("prepare", "1", {"simplify": True, "target_opset": 17},
                       {"model": "ab" * 32},
                       Environment(tensorrt=TensorRT(flavour="tensorrt-rtx", version="1.7.1.116")),
                       {"m:f": "0123456789abcdef"})


def test_recipe_is_pinned():
    assert PARTS["format"] == keys.KEY_FORMAT == 2
    assert keys.stage_key(PARTS) == PINNED_RECIPE


def test_every_part_changes_the_key():
    base = keys.stage_key(PARTS)
    for part, other in (("kind", "build"), ("version", "2"), ("params", {"simplify": False, "target_opset": 17}),
                        ("inputs", {"model": "cd" * 32}), ("env", None), ("code", {"m:f": "fedcba9876543210"})):
        assert keys.stage_key({**PARTS, part: other}) != base, part


def test_key_of_a_real_stage_is_pinned(tmp_path):
    """Everything that feeds a real stage's key: the parameters not at their default, its VERSION, the digest of
    the model file. The pre-flight is off, so no environment fact enters (the key is the same on every machine)."""
    shutil.copy(PPOCR, tmp_path / "cls.onnx")
    (tmp_path / "pipeline.yaml").write_text("version: 1\nname: pin\nmodel: cls.onnx\n"
                                            "stages:\n  prepare: {kind: prepare, preflight: off}\n")
    runner = Runner(load_pipeline(tmp_path / "pipeline.yaml"), store=LocalStore(tmp_path / "store"))
    (item,) = runner.plan()
    assert item.action == "run" and item.reason == "never run"
    assert item.key == PINNED_PREPARE


PINNED_RECIPE = "e3c11055abdb68857bfdeb94268c6949"  # KEY_FORMAT 2
PINNED_PREPARE = "1ccf8254caa8b23c9a459538071460af"  # prepare v3, KEY_FORMAT 2: defaults left out


# the smallest valid parameters of every kind, and parameters set to something else than their defaults
MINIMAL = {
    "prepare": {}, "precision": {}, "build": {}, "validate": {}, "benchmark": {},
    "parity": {"images": "data/*.png", "deploy": [{"read": "rgb"}], "training": {"callable": "mine.prep:reference"}},
    "calibrate": {"data": {"images": "data/*.png"}}, "release": {},
}
SET = {
    "prepare": {"target_opset": 13, "simplify": False}, "precision": {"holdout": 3},
    "build": {"profiles": {"p": {"x": {"min": [1, 3], "opt": [2, 3], "max": [4, 3]}}}},
    "validate": {"repair": True}, "benchmark": {"duration": "1s", "shapes": ["opt", "max"]},
    "parity": {"tolerances": {"top1": "90%"}}, "calibrate": {"method": "minmax"},
    "release": {"select": {"prefer": "size", "max_accuracy_drop": "1%"}, "triton": {"model_name": "m"}},
}


def _key(kind: str, params: dict) -> str:
    """The key of a kind's stage on fixed inputs, outside any environment: what its parameters and VERSION give."""
    spec = KINDS[kind].params.model_validate({"kind": kind, **params})
    version = str(importlib.import_module(KINDS[kind].module).VERSION)
    return keys.stage_key(keys.key_parts(kind, version, spec.key_params(), {"model": "ab" * 32}, None))


def test_every_kind_covered():
    assert set(MINIMAL) == set(SET) == set(KINDS)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_key_of_every_kind_is_pinned(kind):
    assert (_key(kind, MINIMAL[kind]), _key(kind, {**MINIMAL[kind], **SET[kind]})) == PINNED_KINDS[kind]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_new_option_with_a_default_changes_no_key(kind, monkeypatch):
    """What a trtflow release adds to a kind (an option, a nested option) must not re-key its stored results."""
    for params in (MINIMAL[kind], {**MINIMAL[kind], **SET[kind]}):
        before = _key(kind, params)
        model = KINDS[kind].params
        grown = create_model(f"Grown{model.__name__}", __base__=model, new_option=(int, 3),
                             new_block=(dict[str, float], {"bound": 0.5}))
        monkeypatch.setitem(KINDS, kind, type(KINDS[kind])(**{**KINDS[kind].__dict__, "params": grown}))
        assert _key(kind, params) == before, params
        assert _key(kind, {**params, "new_option": 4}) != before, "an option set to something else does count"
        monkeypatch.undo()


def test_a_value_equal_to_the_default_is_the_default():
    assert _key("prepare", {"simplify": True}) == _key("prepare", {}) != _key("prepare", {"simplify": False})


PINNED_KINDS = {  # kind -> (its minimal parameters, some set): KEY_FORMAT 2
    "benchmark": ("6ed0d6225f6c1ceeaf9e5ac561ac6897", "da43cd7ddd15cc1826da4b6af6f3658b"),
    "build": ("c2afb7c78f90809f7aa52d33c58ea5ba", "b1097a9c4299885f07d7c5cf4e5578b9"),
    "calibrate": ("1dcd90341a576f39d32bbaad547b0194", "dac6938073c76aadc661e08da9985ac7"),
    "parity": ("6996d520918f56c5aa9464e3b7b8f262", "95d0f918acacce2cfd62599861b6fc22"),
    "precision": ("4cbc63fb995252b276a93456fb56e819", "d245ff587a13eab5ceb21cbc906d5df1"),
    "prepare": ("4cc41c6d04c595a91d43d4bd5a49e065", "84314c7aa7fb461b4fd375e05ede74a6"),
    "release": ("3b34221579161e512b20b54d766e5d3d", "880fc5d519afd1117cc6f7ae52534a96"),  # VERSION 4
    "validate": ("aed0c7a26f890e310dc028e0a8245641", "ecd970059d9e0deea1ec0ea9043befed"),
}
