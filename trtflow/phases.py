"""Where a run's time goes, for bench/overhead.py: with `TRTFLOW_PHASES=<file>` set, each trtflow process adds up
the seconds it spends per phase and appends them to the file as one JSON line when it exits. Unset (always, but for
the bench), `phase` and `add` cost a dictionary update."""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from typing import Iterator

from trtflow import procfs

VARIABLE = "TRTFLOW_PHASES"
_totals: dict[str, float] = {}
_lock = threading.Lock()


def add(name: str, seconds: float) -> None:
    with _lock:
        _totals[name] = _totals.get(name, 0.0) + seconds


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - started)


def since_process_start() -> float:
    """Seconds since this process started (Linux: /proc/self/stat's start time), 0 where unknown."""
    ticks = procfs.started()
    return max(0.0, procfs.seconds(procfs.now_ticks() - ticks)) if ticks is not None else 0.0


def _write() -> None:
    target = os.environ.get(VARIABLE)
    if target and _totals:
        with open(target, "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "phases": _totals}) + "\n")


atexit.register(_write)
