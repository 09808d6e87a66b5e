"""The cache key recipe, pinned (as DVC pins its stage hashes): a change of any pinned value below means every
published result in every user's store stops being found. If the change is deliberate, bump
`trtflow.flows.keys.KEY_FORMAT` (or the stage's VERSION) and update the pins; if not, it is a bug."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.assets import PPOCR
from trtflow.flows import code_lock, keys
from trtflow.flows.keys import Environment
from trtflow.flows.runner import Runner
from trtflow.flows.store import LocalStore
from trtflow.pipelines.kinds import KINDS
from trtflow.pipelines.loader import load_pipeline
from trtflow.stages.trt.records import TensorRT

PARTS = keys.key_parts("prepare", "1", {"simplify": True, "target_opset": 17},
                       {"model": "ab" * 32},
                       Environment(tensorrt=TensorRT(flavour="tensorrt-rtx", version="1.7.1.116")),
                       {"m:f": "0123456789abcdef"},
                       {"files": {"stages/prepare/stage.py": "0123456789abcdef"}, "libraries": {"onnx": "1.23.2"}})


def test_recipe_is_pinned():
    assert PARTS["format"] == keys.KEY_FORMAT == 4
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
    """Everything that feeds a real stage's key: the parameters with their defaults, its VERSION, the digest of
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


PINNED_RECIPE = "f2fd73d2d59487fa572cee98912d5af0"  # KEY_FORMAT 4
PINNED_PREPARE = "fd224ff44bdd7c7124830d7e3e57d462"  # prepare v5, KEY_FORMAT 4: defaults in, the code lock's part


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


KEYS_OF_A_TREE = """
import json, sys
from trtflow.flows import keys
from trtflow.pipelines.kinds import KINDS
params = json.loads(sys.argv[1])
print(json.dumps({kind: keys.stage_key(keys.key_parts(
    kind, "1", KINDS[kind].params.model_validate({"kind": kind, **params[kind]}).key_params(), {"model": "ab" * 32},
    None)) for kind in sorted(KINDS)}))
"""


def _keys_with_default(tmp_path, file: str, old: str, new: str) -> dict[str, str]:
    """Every kind's key, MINIMAL and SET, computed by a copy of trtflow's source whose `file` has `old` replaced
    by `new` (once: the default as written)."""
    from tests.test_new_kind import _copy_source
    src = _copy_source(tmp_path / f"tree{len(list(tmp_path.iterdir()))}")  # (a ':' would split PYTHONPATH)
    path = src / "trtflow" / file
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {file}"
    path.write_text(text.replace(old, new))
    out = {}
    for label, params in (("minimal", MINIMAL), ("set", {k: {**MINIMAL[k], **SET[k]} for k in MINIMAL})):
        done = subprocess.run([sys.executable, "-c", KEYS_OF_A_TREE, json.dumps(params)], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(src)}, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr
        out.update({f"{kind} {label}": key for kind, key in json.loads(done.stdout).items()})
    return out


@pytest.mark.slow
def test_a_changed_default_rekeys_exactly_the_stages_that_leave_it_unset(tmp_path):
    """Defaults are in the key (KEY_FORMAT 4): a trtflow release that changes a default re-keys the stages that
    use it and no other, without anyone bumping a VERSION. SampleData's `samples` (8) is left unset by precision,
    validate and calibrate; benchmark and release default to one sample, set in their own defaults."""
    same = _keys_with_default(tmp_path, "pipelines/schema.py", "samples: int = Field(8,", "samples: int = Field(8,")
    samples = _keys_with_default(tmp_path, "pipelines/schema.py", "samples: int = Field(8,", "samples: int = Field(9,")
    percentile = _keys_with_default(tmp_path, "pipelines/params/calibrate.py", "Field(99.999,", "Field(99.99,")

    def moved(keys_: dict[str, str]) -> set[str]:
        return {label for label, key in keys_.items() if key != same[label]}

    assert moved(samples) == {f"{kind} {label}" for kind in ("precision", "validate", "calibrate")
                              for label in ("minimal", "set")}
    # calibrate alone reads it (its key holds it under SET's `method: minmax` too: a parameter is keyed by kind)
    assert moved(percentile) == {"calibrate minimal", "calibrate set"}


def test_a_value_equal_to_the_default_is_the_default():
    assert _key("prepare", {"simplify": True}) == _key("prepare", {}) != _key("prepare", {"simplify": False})


PINNED_KINDS = {  # kind -> (its minimal parameters, some set): KEY_FORMAT 4 (without the part `trtflow`)
    "benchmark": ("3c18863520e4d0b2b0b913c0f750583e", "b0f89f2fe5bbdc2a4060018f7684bb83"),  # VERSION 5
    "build": ("11ac08d41d836f746f58d5eeb8e41038", "7b014a7302459a39cf9072460a4e10fa"),
    "calibrate": ("97575ea4f3ca418ea2204065d8f0abdb", "e5ca5b1d67a508723e2d4383f38b58a0"),  # VERSION 12
    "parity": ("deb28cbc94f2d5f0a44a9dc41e169683", "44c23030f22b1bf5ccef7df177377cf7"),
    "precision": ("5320f36c19fa0d68797934d47a736f6d", "89781a8072dab1594c10daf243d21b76"),
    "prepare": ("8ad17ff6fc137146c25b9ccce0c1181f", "ff5dd4d99f0b97aa19f1cf11dd62a583"),  # VERSION 5
    "release": ("98ebf2e5d36170bf278d5f462b826d30", "30a47fff29552fcdea7dc7eca63baae8"),  # VERSION 6
    "validate": ("dd05565304674bb6817eb5d00c8a4d75", "f57f84d4af3d01fc1f6f45f192479ce1"),  # VERSION 10
}
