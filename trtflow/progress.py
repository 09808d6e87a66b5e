"""Progress of long stage work (calibration, builds), reported to whoever listens: the CLI's status line (every
stage's), a Prefect progress artifact (its own stage's), the pipe back from a stage's process. Stages call
`report`; they know nothing of the listeners.

Listeners live in a context variable, not a module-level list: Prefect runs each task in a copy of the caller's
context, so a stage hears the CLI's listener plus its own, and stages side by side do not hear each other's.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

Listener = Callable[[str, int, int], None]
_listeners: ContextVar[tuple[Listener, ...]] = ContextVar("trtflow_progress_listeners", default=())


def report(what: str, done: int, total: int) -> None:
    for listener in _listeners.get():
        listener(what, done, total)


@contextmanager
def listening(listener: Listener, alone: bool = False) -> Iterator[None]:
    """`listener` hears the reports made in this context while the block runs (`alone`: only it does)."""
    token = _listeners.set((listener,) if alone else _listeners.get() + (listener,))
    try:
        yield
    finally:
        _listeners.reset(token)
