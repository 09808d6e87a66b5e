"""The cache key recipe, pinned (as DVC pins its stage hashes): a change of any pinned value below means every
published result in every user's store stops being found. If the change is deliberate, bump
`trtflow.flows.keys.KEY_FORMAT` (or the stage's VERSION) and update the pins; if not, it is a bug."""
from __future__ import annotations

import shutil

from tests.assets import PPOCR
from trtflow.flows import keys
from trtflow.flows.runner import Runner
from trtflow.flows.store import LocalStore
from trtflow.pipelines.loader import load_pipeline

PARTS = keys.key_parts("prepare", "1", {"simplify": True, "target_opset": 17},
                       {"model": "ab" * 32}, {"tensorrt": {"flavour": "tensorrt-rtx", "version": "1.7.1.116"}},
                       {"m:f": "0123456789abcdef"})


def test_recipe_is_pinned():
    assert PARTS["format"] == keys.KEY_FORMAT == 1
    assert keys.stage_key(PARTS) == PINNED_RECIPE


def test_every_part_changes_the_key():
    base = keys.stage_key(PARTS)
    for part, other in (("kind", "build"), ("version", "2"), ("params", {"simplify": False, "target_opset": 17}),
                        ("inputs", {"model": "cd" * 32}), ("env", None), ("code", {"m:f": "fedcba9876543210"})):
        assert keys.stage_key({**PARTS, part: other}) != base, part


def test_key_of_a_real_stage_is_pinned(tmp_path):
    """Everything that feeds a real stage's key: its parameters with their defaults, its VERSION, the digest of
    the model file. The pre-flight is off, so no environment fact enters (the key is the same on every machine)."""
    shutil.copy(PPOCR, tmp_path / "cls.onnx")
    (tmp_path / "pipeline.yaml").write_text("version: 1\nname: pin\nmodel: cls.onnx\n"
                                            "stages:\n  prepare: {kind: prepare, preflight: off}\n")
    runner = Runner(load_pipeline(tmp_path / "pipeline.yaml"), store=LocalStore(tmp_path / "store"))
    (item,) = runner.plan()
    assert item.action == "run" and item.reason == "never run"
    assert item.key == PINNED_PREPARE


PINNED_RECIPE = "e2f25c64db5d59af9072da01fccb7806"
PINNED_PREPARE = "2235884dcec5515111b6396b2adbebec"  # prepare v2: check.data, ranges, trial_build
