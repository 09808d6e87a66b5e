"""Call a stage function, in a killable child process when it has a timeout.

Prefect's task timeout cannot interrupt blocking native code in a worker thread, so a stage with `timeout:`
runs in a spawned process that is killed when the time is up. A crash in native code (a segfault inside a
parser or builder) then fails that stage with a clear message instead of killing the flow.
"""
from __future__ import annotations

import multiprocessing
from typing import Any, Callable

from trtflow.errors import StageError


def _child(conn, func: Callable[..., Any], args: tuple) -> None:
    try:
        conn.send(("ok", func(*args)))
    except BaseException as exc:  # report everything, including the user's own exceptions
        try:
            conn.send(("error", exc))
        except Exception:  # an exception that cannot be pickled
            conn.send(("error", StageError(f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()


def call_stage(func: Callable[..., Any], args: tuple, timeout: float | None, name: str) -> Any:
    if timeout is None:
        return func(*args)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, func, args), name=f"trtflow-{name}", daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout):
            proc.kill()
            proc.join()
            raise StageError(f"stage '{name}' timed out after {timeout:g} s (raise 'timeout:' in the pipeline "
                             f"file if the work is expected to take longer)")
        try:
            status, value = parent.recv()
        except EOFError:
            proc.join()
            raise StageError(f"stage '{name}' crashed (its process exited with code {proc.exitcode})") from None
    finally:
        parent.close()
    proc.join()
    if status == "error":
        raise value
    return value
