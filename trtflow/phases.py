"""Where a run's time goes, for bench/overhead.py and bench/floor.py: with `TRTFLOW_PHASES=<file>` set, each trtflow
process adds up the seconds it spends per phase and appends them to the file as one JSON line when it exits, and
each ONNX Runtime inference pass of a stage is appended as it ends (`timed_passes`: its role, such as the FP32
reference, the shapes fed and its seconds). Unset (always, but for the benches and the tests that count passes),
`phase` and `add` cost a dictionary update and sessions run untouched."""
from __future__ import annotations

import atexit
import contextlib
import functools
import json
import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from trtflow import procfs

VARIABLE = "TRTFLOW_PHASES"
IMAGES = "images: decoded and preprocessed (OpenCV)"  # the phase every stage reading images times
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


def timed(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A function whose calls add up as the phase `name` (a leaf of the work: nothing timed inside it)."""
    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            with phase(name):
                return func(*args, **kwargs)
        return timed_call
    return wrap


def recording() -> bool:
    return bool(os.environ.get(VARIABLE))


def timed_passes(run: Callable[..., Any], role: str) -> Callable[..., Any]:
    """`run` (an ONNX Runtime session's), each call appended to the file as it ends (a stage's process may end
    without running exit handlers): {"pass": role, "shapes": the inputs', "seconds", "process": its name, which
    for a stage's process is `trtflow-<stage>`}."""
    def timed(output_names: Any, feed: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = run(output_names, feed, *args, **kwargs)
        line = {"pid": os.getpid(), "process": multiprocessing.current_process().name, "pass": role,
                "seconds": time.perf_counter() - started,
                "shapes": {k: list(getattr(v, "shape", ())) for k, v in feed.items()}}
        with open(os.environ[VARIABLE], "a") as fh:
            fh.write(json.dumps(line) + "\n")
        return out

    return timed


def recorded(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What processes wrote to the file `TRTFLOW_PHASES` named: (their phase totals, an entry per process and flush,
    {"pid", "process", "phases": {name: seconds}}; the passes, an entry per run, as `timed_passes` writes them)."""
    entries = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [e for e in entries if "phases" in e], [e for e in entries if "pass" in e]


def _write() -> None:
    target = os.environ.get(VARIABLE)
    if target and _totals:
        with open(target, "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "process": multiprocessing.current_process().name,
                                 "phases": _totals}) + "\n")


def flush() -> None:
    """The phases so far written now, and counted afresh (a stage's process, which may end without exit handlers)."""
    with _lock:
        _write()
        _totals.clear()


atexit.register(_write)
