"""Progress of long stage work (calibration, builds), reported to whoever listens: the CLI's status line (every
stage's), a Prefect progress artifact (its own stage's), the pipe back from a stage's process. Stages call
`report`; they know nothing of the listeners.

Listeners live in a context variable, not a module-level list: Prefect runs each task in a copy of the caller's
context, so a stage hears the CLI's listener plus its own, and stages side by side do not hear each other's.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Generic, Iterator, TypeVar

L = TypeVar("L", bound=Callable[..., None])


class Listeners(Generic[L]):
    """Whoever listens in the current context: a context variable, not a module-level list, so what a Prefect task
    (run in a copy of its caller's context) adds is heard in that task only."""

    def __init__(self, name: str) -> None:
        self._var: ContextVar[tuple[L, ...]] = ContextVar(name, default=())

    def notify(self, *args: object) -> None:
        for listener in self._var.get():
            listener(*args)

    @contextmanager
    def listening(self, listener: L, alone: bool = False) -> Iterator[None]:
        """`listener` hears what is reported in this context while the block runs (`alone`: only it does)."""
        token = self._var.set((listener,) if alone else self._var.get() + (listener,))
        try:
            yield
        finally:
            self._var.reset(token)


Listener = Callable[[str, int, int], None]  # (what, done, total)
_progress: Listeners[Listener] = Listeners("trtflow_progress_listeners")
report = _progress.notify  # report(what, done, total)
listening = _progress.listening
