"""Progress of long stage work (calibration, builds), reported to whoever listens: the CLI's status line (every
stage's), a Prefect progress artifact (its own stage's), the pipe back from a stage's process. Stages call
`report`; they know nothing of the listeners. `Eta` says how long is left, from the steps so far.

Listeners live in a context variable, not a module-level list: Prefect runs each task in a copy of the caller's
context, so a stage hears the CLI's listener plus its own, and stages side by side do not hear each other's.
"""
from __future__ import annotations

import time
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


class Eta:
    """The time left of each piece of work reported as (what, done, total), from how long its steps so far took
    (the first report of `what` starts its clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started: dict[str, tuple[float, int]] = {}

    def left(self, what: str, done: int, total: int) -> float | None:
        """Seconds left; None until a step has been timed (or once it is done)."""
        now = self._clock()
        began, first = self._started.setdefault(what, (now, done))
        if done <= first or done >= total:
            return None
        return (now - began) / (done - first) * (total - done)

    def said(self, what: str, done: int, total: int) -> str:
        """`what done/total`, and about how long is left where it is known."""
        left = self.left(what, done, total)
        return f"{what} {done}/{total}" + (f", about {_duration(left)} left" if left is not None else "")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
