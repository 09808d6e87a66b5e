"""`trtflow`, the command line. A `run` where nothing changed since the last one is answered by flows/noop.py from
its record before anything else is imported (milliseconds); every other command, and a run the record does not
cover, by app.py."""
from __future__ import annotations

import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["run"]:
        from trtflow.flows import noop

        answered = noop.answer(raw)
        if answered is not None:
            return answered
    return _app().main(raw)


def _app() -> Any:
    # by name: `from trtflow.flows.cli import app` would ask this module's __getattr__ for `app` first
    import importlib

    return importlib.import_module("trtflow.flows.cli.app")


def __getattr__(name: str) -> Any:  # `parser`, `COMMANDS`, ...: app's
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_app(), name)
