"""Opening files that something other than this process wrote: a regular file only, read with a bound.

A FIFO blocks `open()` until a writer comes, a device (`/dev/zero`) never ends, and a 50 GB file where a 2 KB
manifest belongs exhausts memory: each hung or crashed `plan`, `verify` or `run`. Every file trtflow reads back
(its store's manifests and records, hashed outputs, data files) is opened here: without blocking, checked to be
a regular file with `fstat` on the descriptor that is then read (no window between check and read), and, for
trtflow's own files, without following a symlink.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Any

MANIFEST_BYTES = 64 * 2**20  # a manifest is a few KB; one recording 100 000 files is ~20 MB
RECORD_BYTES = 64 * 2**20  # last.json, the machine's environment record, digests.json of a large store


class NotAFile(OSError):
    """The path exists but is no regular file, or is larger than files of its kind are."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def stamp(st: os.stat_result) -> list[int]:
    """What must not move for a file to be taken as unchanged without reading it: size, mtime, inode and ctime.
    ctime is the one a user cannot set back (`touch -d`/`os.utime` restore mtime, and move ctime to now), so a
    file written in place with its mtime restored is hashed again."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def open_regular(path: Path | str, follow: bool = True) -> tuple[IO[bytes], os.stat_result]:
    """`path` opened for reading, and its stat; NotAFile for anything but a regular file (with `follow=False`, a
    symlink too: it could lead anywhere)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)  # O_NONBLOCK: a FIFO opens at once
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotAFile(errno.EINVAL, f"{path} is a symlink", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotAFile(errno.EINVAL, f"{path} is {_kind(st.st_mode)}, not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


def digest_stream(fh: IO[bytes], chunk: int = 1 << 20) -> tuple[str, int]:
    """The sha256 (hex) of everything `fh` yields and how many bytes that was: the one recipe for a file's digest
    (stage outputs, engines, remote blobs), so a digest recorded by one part of trtflow is the one another computes."""
    h, size = hashlib.sha256(), 0
    while data := fh.read(chunk):
        h.update(data)
        size += len(data)
    return h.hexdigest(), size


def sha256(path: Path | str, follow: bool = True) -> str:
    """sha256 of regular file `path`, streamed (NotAFile for a FIFO or device, which would be read for ever)."""
    fh, _ = open_regular(path, follow)
    with fh:
        return digest_stream(fh)[0]


def read_bounded(path: Path | str, limit: int, follow: bool = True) -> bytes:
    """The bytes of regular file `path`, at most `limit` of them (NotAFile beyond)."""
    fh, st = open_regular(path, follow)
    with fh:
        if st.st_size > limit:
            raise NotAFile(errno.EFBIG, f"{path} is {st.st_size} bytes, more than the {limit} a file of its kind "
                                        f"may have", str(path))
        data = fh.read(limit + 1)
    if len(data) > limit:  # it grew after the stat
        raise NotAFile(errno.EFBIG, f"{path} is more than {limit} bytes", str(path))
    return data


def read_json(path: Path | str, limit: int, follow: bool = True) -> Any:
    return json.loads(read_bounded(path, limit, follow))


def is_regular(path: Path) -> bool:
    """A regular file, not through a symlink."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


# --- the build's caches in the store's shared/ (issue #37) ---------------------------------------------------------
TIMING_CACHE_BYTES = 2**30  # a TensorRT timing cache: a few MB for a model zoo; more is not a timing cache
ENGINE_LOG_BYTES = 256 * 2**20  # TensorRT's build log, verbose included
ENGINE_BYTES = 2**38  # a serialized engine: a large language model's is tens of GB (copied streamed, never read whole)


def copy_regular(src: Path | str, dst: Path | str, limit: int, follow: bool = True) -> None:
    """Copy regular file `src` (at most `limit` bytes, NotAFile beyond) to a new file `dst`, streamed."""
    fh, st = open_regular(src, follow)
    with fh:
        if st.st_size > limit:
            raise NotAFile(errno.EFBIG, f"{src} is {st.st_size} bytes, more than the {limit} a file of its kind "
                                        f"may have", str(src))
        with open(dst, "xb") as out:
            copied = 0
            while chunk := fh.read(1 << 20):
                copied += len(chunk)
                if copied > limit:  # it grew after the stat
                    raise NotAFile(errno.EFBIG, f"{src} is more than {limit} bytes", str(src))
                out.write(chunk)


def place(src: Path | str, dst: Path | str, limit: int) -> None:
    """Regular file `src` at new path `dst` stored once: a hard link where the file system allows it (engines are
    large), else a streamed copy (another file system, a link count at its maximum); never through a symlink. A
    file placed so may share its bytes with others: it is replaced, never written in place."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError:
        copy_regular(src, dst, limit, follow=False)
        return
    if not is_regular(Path(dst)):  # a link to a FIFO or device is one too: nothing but a regular file is placed
        os.unlink(dst)
        raise NotAFile(errno.EINVAL, f"{src} is not a regular file", str(src))


def write_atomic(path: Path | str, data: bytes) -> None:
    """`data` as the whole of `path`, renamed into place: a reader sees the old file or the new one, never half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

