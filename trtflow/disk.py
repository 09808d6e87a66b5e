"""A full disk, a quota or a read-only file system, said as such: one line naming the path and the space left.

Without this, a full store surfaced as whatever a library made of a short write (`JSONDecodeError` of a report
written empty, `OSError: [Errno 28]` with no path) and, being unexpected, was retried."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from trtflow.errors import Refused, TrtflowError

_WHAT = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
         errno.EROFS: "the file system is read-only"}


class DiskError(TrtflowError):
    """Writing failed for lack of space or permission of the file system itself: never retried (the same write
    fails the same way until someone frees space)."""

    exit_code = 1

    def __init__(self, cause: OSError, path: str, shown: str, doing: str = ""):
        self.cause, self.path, self.shown, self.doing = cause, path, shown, doing
        read_only = cause.errno == errno.EROFS
        super().__init__(self._text(), hint="give a writable store with --store" if read_only
                         else "free some space, or give a store elsewhere with --store")

    def _text(self) -> str:
        free = None if self.cause.errno == errno.EROFS else free_bytes(self.path)
        room = f"; {_size(free)} free there" if free is not None else ""
        prefix = f"{self.doing}: " if self.doing else ""
        return f"{prefix}{_WHAT[self.cause.errno]} writing {self.shown}{room}"

    def remeasure(self) -> None:
        """Say the free space of now (after the failed stage's partial output was removed)."""
        self.tell(cause=Refused(self._text(), self.hint))


def disk_cause(exc: BaseException | None) -> OSError | None:
    """The OSError behind `exc` (itself, its cause or context) that is a full disk, a quota or a read-only file
    system; None when there is none."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _WHAT:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def free_bytes(path: Path | str) -> int | None:
    """Free bytes on the file system holding `path` (its nearest existing ancestor); None when unknown."""
    p = Path(os.path.abspath(path))
    for candidate in (p, *p.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def disk_error(exc: BaseException, where: Path | str, doing: str = "", shown: str | None = None) -> DiskError | None:
    """A DiskError saying what `exc` means (None when it is no disk problem). `where`: the directory being
    written, named when the error names no file (a library's short write names none) or a file inside it, as
    `shown` (a staging directory is gone by the time the message is read)."""
    cause = disk_cause(exc)
    if cause is None:
        return None
    path = cause.filename if isinstance(cause.filename, str) and cause.filename else str(where)
    inside = Path(os.path.abspath(path)).is_relative_to(os.path.abspath(where))
    return DiskError(cause, path, shown if shown is not None and inside else path, doing)
