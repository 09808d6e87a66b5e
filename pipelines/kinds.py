"""Every stage kind trtflow knows: the built-in ones, one line each, and the kinds installed packages add.

A kind is its contract, `KIND` (a `Kind` row: its parameter model, input slots, outputs, environment facts, shared
caches, the module of its code) and the code that contract names: a stage module whose `CODE` (a
`trtflow.stage_code.StageCode`) gives `run` and its report's class, with a `VERSION`. A built-in kind's contract is
`pipelines/params/<kind>.py` and its code `stages/<kind>/`; adding one is those and its line here.

A package of yours adds a kind without touching trtflow: its contract, stage module and report, and an entry point
of the group `trtflow.kinds` naming the contract (`count = countkind.contract:KIND` under
`[project.entry-points."trtflow.kinds"]` in its pyproject.toml); once installed, `kind: count` works in every
pipeline (tests/test_new_kind.py). A user's own function (`kind: package.module:function`) has the row `USER`, whose
slots and outputs come from what the user declared.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import re

from trtflow.errors import SpecError
from trtflow.pipelines.params.custom import KIND as USER
from trtflow.pipelines.row import Kind
from trtflow.pipelines.schema import StageBase
from trtflow.strict import CUSTOM_KIND

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
ENTRY_POINTS = "trtflow.kinds"  # the group of the kinds installed packages add

BUILT_IN_KINDS: dict[str, Kind] = {name: importlib.import_module(f"trtflow.pipelines.params.{name}").KIND
                                   for name in BUILT_IN}
assert all(row.name == name for name, row in BUILT_IN_KINDS.items()), "a params module's KIND is named after it"


def installed() -> dict[str, Kind]:
    """The kinds of installed packages (entry points of the group `trtflow.kinds`), each checked: a `Kind` named
    as its entry point, with its own stage module, taking no built-in kind's name."""
    out: dict[str, Kind] = {}
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        where = f"the kind '{entry.name}' ({entry.value}, entry point of {ENTRY_POINTS})"
        try:
            row = entry.load()
        except Exception as exc:  # noqa: BLE001 - the package's own import failing: one line, naming it
            raise SpecError(f"{where} cannot be loaded: {type(exc).__name__}: {exc}") from None
        out[entry.name] = _checked(row, entry.name, where)
    return out


def _checked(row: object, name: str, where: str) -> Kind:
    if not isinstance(row, Kind):
        raise SpecError(f"{where} is a {type(row).__name__}, not a trtflow.pipelines.row.Kind")
    if name in BUILT_IN_KINDS or row.name != name:
        raise SpecError(f"{where}: its row is named '{row.name}' (a kind's entry point, its row and its `kind:` "
                        f"are one name, not a built-in kind's)")
    if (row.module or "").startswith("trtflow."):
        raise SpecError(f"{where}: give its row module='yourpackage.stage' (the module whose CODE runs it)")
    return row


KINDS: dict[str, Kind] = {**BUILT_IN_KINDS, **installed()}


def is_user_kind(kind: str) -> bool:
    return kind not in KINDS and re.match(CUSTOM_KIND, kind) is not None


def kind_named(kind: str) -> Kind | None:
    """The row for a `kind:` value from the YAML; None if it is neither a kind nor package.module:function."""
    return KINDS.get(kind) or (USER if is_user_kind(kind) else None)


def kind_of(spec: StageBase) -> Kind:
    return KINDS.get(spec.kind) or USER  # type: ignore[attr-defined]


def is_built_in(row: Kind) -> bool:
    return BUILT_IN_KINDS.get(row.name) is row
