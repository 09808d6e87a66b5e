"""What Linux's /proc says of a process: its parent, its state (a zombie?), its CPU time and when it started, its
memory and the machine's (None where /proc has no answer: the process is gone, or the system has no /proc)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


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


def status_bytes(field_name: str, path: str = "/proc/self/status") -> int | None:
    """A `<field>: <n> kB` line of a /proc file, in bytes (None where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def resident() -> int:
    """This process's resident memory now (VmRSS), in bytes (0 where /proc does not say)."""
    return status_bytes("VmRSS") or 0


def peak_resident() -> int:
    """This process's largest resident memory so far (VmHWM), in bytes."""
    return status_bytes("VmHWM") or 0


def _cgroup_room() -> int | None:
    """What this process's cgroup (v2) may still take, where it has a limit."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(int(limit) - used, 0)


def available() -> int | None:
    """The memory this machine (or this process's cgroup, where smaller) has available now: MemAvailable."""
    found = [v for v in (status_bytes("MemAvailable", "/proc/meminfo"), _cgroup_room()) if v is not None]
    return min(found) if found else None
