"""Progress of long stage work (calibration, builds), reported to whoever listens: the CLI's status line (every
stage's), a Prefect progress artifact (its own stage's: stages run side by side, each in its own thread). Stages
call `report`; they know nothing of the listeners."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

Listener = Callable[[str, int, int], None]
LISTENERS: list[Listener] = []  # hear every stage
_thread = threading.local()  # listeners of the stage running in this thread


def report(what: str, done: int, total: int) -> None:
    for listener in LISTENERS + getattr(_thread, "listeners", []):
        listener(what, done, total)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """`listener` hears the reports made in this thread (by the stage running here) while the block runs."""
    previous = getattr(_thread, "listeners", [])
    _thread.listeners = previous + [listener]
    try:
        yield
    finally:
        _thread.listeners = previous
