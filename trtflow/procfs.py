"""What Linux's /proc says of a process: its parent, its state (a zombie?), its CPU time and when it started (None
where /proc has no answer: the process is gone, or the system has no /proc)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass


def _fields(pid: int | str) -> list[bytes] | None:
    """/proc/<pid>/stat's fields from the third on (after the command's name, which may hold spaces and ')')."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/<pid>/stat trtflow reads."""
    parent: int
    state: bytes  # b"R", b"S", ..., b"Z" (a zombie)
    cpu_ticks: int  # user + system, in clock ticks
    started: int  # when the process started, in clock ticks since boot (field 22): a reused pid has another


def stat(pid: int | str = "self") -> Stat | None:
    fields = _fields(pid)
    try:
        return Stat(int(fields[1]), fields[0], int(fields[11]) + int(fields[12]), int(fields[19])) \
            if fields is not None else None
    except (ValueError, IndexError):
        return None


def started(pid: int | str = "self") -> int | None:
    """When the process started, in clock ticks since boot."""
    found = stat(pid)
    return found.started if found is not None else None


def zombie(pid: int) -> bool:
    found = stat(pid)
    return found is not None and found.state == b"Z"


def now_ticks() -> int:
    """Now, in the clock of `started`."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // (10**9 // os.sysconf("SC_CLK_TCK"))


def seconds(ticks: int) -> float:
    return ticks / os.sysconf("SC_CLK_TCK")
