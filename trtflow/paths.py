"""Relative paths that come from someone else (a manifest's file list, a key listed in a shared bucket, a record's
name in a ledger) mapped onto a local directory: one rule, `under()`, so nothing a store holds is ever written or
read outside the directory it belongs to.

A path is refused when it is absolute, has a `..`, an empty or `.` component, a backslash or a NUL byte, or passes
through a symlink below the root (a directory replaced by a link to elsewhere). Writes that must not be taken twice
(a release's version) are exclusive creates (`create_exclusive`): O_EXCL on a descriptor opened beneath the root
without following any link.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any


class OutsidePath(ValueError):
    """A relative path that would leave its directory (or go through a symlink there)."""


def safe_relpath(rel: Any) -> bool:
    """A relative path inside its directory: no '..', '.', empty component, absolute path, backslash or NUL."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel or rel.startswith("/"):
        return False
    return all(p not in ("", ".", "..") for p in rel.split("/"))


def under(root: Path, rel: str, make_parents: bool = False) -> Path:
    """`root / rel`, refused (OutsidePath) when `rel` is not a safe relative path or a directory on the way is a
    symlink or not a directory; `make_parents` makes the missing ones."""
    if not safe_relpath(rel):
        raise OutsidePath(f"{rel!r} is not a path inside {root}")
    path = Path(root)
    for part in rel.split("/")[:-1]:
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            if not make_parents:
                return Path(root) / rel  # nothing there to lead anywhere: the caller finds no file
            path.mkdir()
            continue
        if not stat.S_ISDIR(mode):
            raise OutsidePath(f"{rel!r} goes through {path}, which is " +
                              ("a symlink" if stat.S_ISLNK(mode) else "not a directory"))
    return Path(root) / rel


def create_exclusive(root: Path, rel: str, data: bytes) -> bool:
    """Write `data` to `root/rel` only if nothing is there (True), else leave what is there (False). Directories
    are made; every one is opened without following links, relative to the one before."""
    if not safe_relpath(rel):
        raise OutsidePath(f"{rel!r} is not a path inside {root}")
    *dirs, name = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in dirs:
            try:
                os.mkdir(part, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OutsidePath(f"{rel!r}: {part} under {root} is a symlink or not a directory") from None
                raise
            os.close(fd)
            fd = nxt
        tmp = f".{name}.{os.getpid()}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        try:
            os.write(out, data)
            os.fsync(out)
        finally:
            os.close(out)
        try:
            os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)  # fails if `name` exists
            return True
        except FileExistsError:
            return False
        except OSError as exc:  # a file system without hard links: create it exclusively, then write
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            return _create_then_write(fd, name, data)
        finally:
            os.unlink(tmp, dir_fd=fd)
    finally:
        os.close(fd)


def _create_then_write(dir_fd: int, name: str, data: bytes) -> bool:
    try:
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    except FileExistsError:
        return False
    try:
        os.write(out, data)
        os.fsync(out)
    finally:
        os.close(out)
    return True
