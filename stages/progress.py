"""Progress of long stage work (calibration, builds), reported to whoever listens: the CLI's status line, a
Prefect progress artifact. Stages call `report`; they know nothing of the listeners."""
from __future__ import annotations

from typing import Callable

LISTENERS: list[Callable[[str, int, int], None]] = []


def report(what: str, done: int, total: int) -> None:
    for listener in LISTENERS:
        listener(what, done, total)
