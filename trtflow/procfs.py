"""What Linux's /proc says of a process: when it started and whether it is a zombie (None where /proc has no
answer: the process is gone, or the system has no /proc)."""
from __future__ import annotations

import os
import time


def _fields(pid: int | str) -> list[bytes] | None:
    """/proc/<pid>/stat's fields from the third on (after the command's name, which may hold spaces and ')')."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def started(pid: int | str = "self") -> int | None:
    """When the process started, in clock ticks since boot (field 22): a pid reused by another process has
    another."""
    fields = _fields(pid)
    try:
        return int(fields[19]) if fields is not None else None
    except (ValueError, IndexError):
        return None


def zombie(pid: int) -> bool:
    fields = _fields(pid)
    return bool(fields) and fields[0] == b"Z"


def now_ticks() -> int:
    """Now, in the clock of `started`."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // (10**9 // os.sysconf("SC_CLK_TCK"))


def seconds(ticks: int) -> float:
    return ticks / os.sysconf("SC_CLK_TCK")
