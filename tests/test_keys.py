"""The cache key recipe, pinned (as DVC pins its stage hashes): a change of any pinned value below means every
published result in every user's store stops being found. If the change is deliberate, bump
`trtflow.flows.keys.KEY_FORMAT` (or the stage's VERSION) and update the pins; if not, it is a bug."""
from __future__ import annotations

import importlib
import json
import shutil

import pytest
from pydantic import create_model

from tests.assets import PPOCR
from trtflow.flows import code_lock, keys
from trtflow.flows.keys import Environment
from trtflow.flows.runner import Runner
from trtflow.flows.store import LocalStore
from trtflow.pipelines.kinds import KINDS
from trtflow.pipelines.loader import load_pipeline
from trtflow.stages.trt.env import TensorRT

PARTS = keys.key_parts("prepare", "1", {"simplify": True, "target_opset": 17},
                       {"model": "ab" * 32},
                       Environment(tensorrt=TensorRT(flavour="tensorrt-rtx", version="1.7.1.116")),
                       {"m:f": "0123456789abcdef"},
                       {"files": {"stages/prepare/stage.py": "0123456789abcdef"}, "libraries": {"onnx": "1.23.2"}})


def test_recipe_is_pinned():
    assert PARTS["format"] == keys.KEY_FORMAT == 3
    assert keys.stage_key(PARTS) == PINNED_RECIPE


def test_every_part_changes_the_key():
    base = keys.stage_key(PARTS)
    for part, other in (("kind", "build"), ("version", "2"), ("params", {"simplify": False, "target_opset": 17}),
                        ("inputs", {"model": "cd" * 32}), ("env", None), ("code", {"m:f": "fedcba9876543210"}),
                        ("trtflow", {"files": {"stages/prepare/stage.py": "fedcba9876543210"},
                                     "libraries": {"onnx": "1.23.2"}}),
                        ("trtflow", {"files": {"stages/prepare/stage.py": "0123456789abcdef"},
                                     "libraries": {"onnx": "1.24.0"}})):
        assert keys.stage_key({**PARTS, part: other}) != base, part


# a code lock that moves with no edit of trtflow's code, and library versions that move with no `pip install`: the
# pin below is of the recipe; tests/test_code_key.py checks the real lock's digests enter the key
FIXED_LOCK = {"format": 1, "files": {"stages/prepare/stage.py": "0123456789abcdef"},
              "kinds": {"prepare": {"files": ["stages/prepare/stage.py"],
                                    "keyed": {"stages/prepare/stage.py": "0123456789abcdef"},
                                    "libraries": ["onnx", "onnxruntime", "onnxsim", "opencv-python-headless"]}}}
FIXED_LIBRARIES = {"onnx": "1.23.2", "onnxruntime": "1.32.0", "onnxsim": "0.8.1", "opencv-python-headless": "5.0.0.93"}


def test_key_of_a_real_stage_is_pinned(tmp_path, monkeypatch):
    """Everything that feeds a real stage's key: the parameters not at their default, its VERSION, the digest of
    the model file, its code's digests from the code lock and its libraries' versions (both fixed here). The
    pre-flight is off, so no environment fact enters (the key is the same on every machine)."""
    (tmp_path / "code.lock.json").write_text(json.dumps(FIXED_LOCK))
    monkeypatch.setattr(code_lock, "LOCK", tmp_path / "code.lock.json")
    monkeypatch.setattr(code_lock, "library_version", FIXED_LIBRARIES.__getitem__)
    shutil.copy(PPOCR, tmp_path / "cls.onnx")
    (tmp_path / "pipeline.yaml").write_text("version: 1\nname: pin\nmodel: cls.onnx\n"
                                            "stages:\n  prepare: {kind: prepare, preflight: off}\n")
    runner = Runner(load_pipeline(tmp_path / "pipeline.yaml"), store=LocalStore(tmp_path / "store"))
    (item,) = runner.plan()
    assert item.action == "run" and item.reason == "never run"
    assert item.key == PINNED_PREPARE


PINNED_RECIPE = "fcf8e3fd1226bfa097843fbc303f91c4"  # KEY_FORMAT 3
PINNED_PREPARE = "334fea0e392980b1b0b9da8240f2af78"  # prepare v5, KEY_FORMAT 3: defaults left out, the code lock's part


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


PINNED_KINDS = {  # kind -> (its minimal parameters, some set): KEY_FORMAT 3 (without the part `trtflow`)
    "benchmark": ("49d8c36de6b1f4c3451f9693481e7f45", "bfcf42e3bc64ddd8a0620267544634d2"),  # VERSION 5
    "build": ("cecbb673e7ec3c4fca353aab24e652cc", "00cccd241b64e52c4581596b00ef26d8"),
    "calibrate": ("c4e5552e699559d27cb3e65af01541ad", "a7edea2a31a2598a3e316772a1dd996c"),  # VERSION 11
    "parity": ("9dbbf3de7cb568ddde9a6bf6e154b109", "0a3fd4c8b2654ab1e664e6cb909d9616"),
    "precision": ("0d4d5049ba426b38f394fe131d661c0f", "4cc1330e5cb4f7f2f37466b165692249"),
    "prepare": ("a0ddb1c051c3329556331cc55e51a134", "7a4930f318f43485dc7a5dfba3b869a6"),  # VERSION 5
    "release": ("856037ac6197e5acd91fc64e962e9d9e", "e58e9fc827fa2f9fb38eb8915bec75db"),  # VERSION 6
    "validate": ("2057d01d96af89d0e7026c908385686e", "124a3fcb24c1383e9d6c9273c5031a1d"),  # VERSION 10
}
