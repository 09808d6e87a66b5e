"""Processes that die with the process that started them, whatever kills it (`kill -9` included).

Linux's `PR_SET_PDEATHSIG` sends a signal to a process when the *thread* that forked it exits. trtflow's
children use it at every level: the fork server (started from a thread that lives as long as the process, see
`flows/isolate.py`), each stage's process (forked by the fork server), and every helper a stage starts (the
pre-flight, ONNX Runtime probes, engine builds, trtexec). Without it, a killed `trtflow run` left the fork
server importing its preloads for up to 2.6 s and build workers running for 2.4 s.

Importing this module in the fork server (it is the first of its preloads) arms the signal there; anywhere else
the import does nothing.
"""
from __future__ import annotations

import ctypes
import os
import re
import select
import signal

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved now: a child between fork and exec may not load
except (OSError, AttributeError):  # not Linux
    _prctl = None


def die_with_parent() -> None:
    """Arm SIGKILL on the death of the calling process's parent (its forking thread). Usable as a `preexec_fn`:
    it only calls an already resolved C function."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _fork_server_alive_fd() -> int | None:
    """In the fork server: the pipe its parent holds open while alive (its command line names it); else None."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            found = re.search(rb"from multiprocessing\.forkserver import main; main\((\d+), (\d+),", f.read())
    except OSError:
        return None
    return int(found.group(2)) if found else None


_alive = _fork_server_alive_fd()
if _alive is not None:
    die_with_parent()
    # the parent may have died before the signal was armed (during this interpreter's start-up): its pipe is then
    # at end of file, and the fork server would only notice after importing every preload
    if select.select([_alive], [], [], 0)[0]:
        os._exit(0)
