"""Every stage kind trtflow has built in, one line each.

A kind lives in two places: `pipelines/params/<kind>.py` (its parameter model and its row `KIND`: slots, outputs,
environment facts, shared caches) and the folder `stages/<kind>/` (its work: `stage.py` with `run(params, inputs,
out_dir)` and a `VERSION`, its report, the helpers only it uses). Adding a kind is those two and its line here. A user's own stage (`kind: package.module:function`)
has the row `USER`, whose slots and outputs come from what the user declared.
"""
from __future__ import annotations

import importlib
import re

from trtflow.pipelines.params.custom import KIND as USER
from trtflow.pipelines.row import Kind
from trtflow.pipelines.schema import CUSTOM_KIND, StageBase

BUILT_IN = (
    "prepare",
    "parity",
    "precision",
    "calibrate",
    "build",
    "validate",
    "benchmark",
    "release",
)

KINDS: dict[str, Kind] = {name: importlib.import_module(f"trtflow.pipelines.params.{name}").KIND for name in BUILT_IN}
assert all(row.name == name for name, row in KINDS.items()), "a params module's KIND is named after the module"


def is_user_kind(kind: str) -> bool:
    return kind not in KINDS and re.match(CUSTOM_KIND, kind) is not None


def kind_named(kind: str) -> Kind | None:
    """The row for a `kind:` value from the YAML; None if it is neither built in nor package.module:function."""
    return KINDS.get(kind) or (USER if is_user_kind(kind) else None)


def kind_of(spec: StageBase) -> Kind:
    return KINDS.get(spec.kind) or USER  # type: ignore[attr-defined]
