"""What the stage keys were computed from, as it was read: the one ledger every reader of a key's input writes to,
and from which the no-op's witness is made (flows/noop.py), so the two can never disagree by a list kept by hand.

Each reader says what it read where it reads it:
- a file whose bytes a key holds (the digest cache: the model, data files, upstream artifacts; the source file of a
  user's function), by the path it was asked for (the witness also checks where a link leads);
- a folder whose listing a key depends on, and every folder under one a glob may reach, links followed as the glob
  follows them (`tree`);
- an environment variable the pipeline interpolated, with the value it had (or None: unset, its default used);
- the import path a library's version or the user's code was looked up on: every entry (a new distribution or
  module in any of them can change what is found) and the metadata file of the distribution found.
Where a reader cannot name what it read (too many folders, a folder it cannot stat), it says why (`blind`): no
witness is taken and the next run decides the full way (fail closed).

Only the standard library: flows/noop.py checks a witness before anything else is imported.
"""
from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

MAX_FOLDERS = 20000  # a tree of more folders than this is not witnessed (the next run takes the full path)


@dataclass
class Ledger:
    files: set[str] = field(default_factory=set)  # absolute paths, as asked (not resolved)
    folders: set[str] = field(default_factory=set)  # absolute paths whose listing was read
    variables: dict[str, str | None] = field(default_factory=dict)
    blind: list[str] = field(default_factory=list)  # why a witness cannot be taken
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def clear(self) -> None:
        with self._lock:
            self.files.clear()
            self.folders.clear()
            self.variables.clear()
            self.blind.clear()

    def file(self, path: str | os.PathLike) -> None:
        with self._lock:
            self.files.add(os.path.abspath(path))

    def folder(self, path: str | os.PathLike) -> None:
        with self._lock:
            self.folders.add(os.path.abspath(path))

    def variable(self, name: str, value: str | None) -> None:
        with self._lock:
            if name in self.variables and self.variables[name] != value:
                self.blind.append(f"${{{name}}} read with two values")
            self.variables[name] = value

    def cannot(self, why: str) -> None:
        with self._lock:
            self.blind.append(why)

    def tree(self, root: str | os.PathLike) -> None:
        """`root` and every folder under it a glob can reach (symlinked folders followed, each real folder once);
        where `root` does not exist, its parent (a folder made there later is a change)."""
        root = os.path.abspath(root)
        if not os.path.isdir(root):
            self.folder(os.path.dirname(root))
            return
        found = reachable_folders(root)
        if found is None:
            self.cannot(f"more than {MAX_FOLDERS} folders under {root}, or one that cannot be read")
            return
        with self._lock:
            self.folders |= found

    def import_path(self, entries: list[str] | None = None) -> None:
        """Every entry of the import path (sys.path by default): a folder by its listing, a zip file by its
        stat. What importlib finds, a distribution's version or a module, is the first match over all of them."""
        for entry in sys.path if entries is None else entries:
            path = os.path.abspath(entry or os.curdir)
            if os.path.isdir(path):
                self.folder(path)
            else:
                self.file(path)  # a zip file, or an entry that does not exist (made later: a change)


def reachable_folders(root: str) -> set[str] | None:
    """`root` and every folder under it, following links to folders (each real folder listed once: a link cycle
    ends); None past MAX_FOLDERS, or where a folder cannot be read (what it holds cannot be witnessed)."""
    found: set[str] = set()
    real_seen: set[tuple[int, int]] = set()
    todo = [root]
    while todo:
        folder = todo.pop()
        try:
            st = os.stat(folder)
        except OSError:
            return None
        found.add(folder)
        if len(found) > MAX_FOLDERS:
            return None
        if (st.st_dev, st.st_ino) in real_seen:
            continue
        real_seen.add((st.st_dev, st.st_ino))
        try:
            with os.scandir(folder) as entries:
                listed = list(entries)
        except OSError:
            return None
        todo += [e.path for e in listed if _is_folder(e)]
        found |= {e.path for e in listed if _dangling(e)}  # a folder made there later is a change
    return found


def _dangling(entry: os.DirEntry) -> bool:
    return entry.is_symlink() and not os.path.exists(entry.path)


def _is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir(follow_symlinks=True)
    except OSError:
        return False


def installed_metadata(dist: object) -> Path | None:
    """The metadata file importlib.metadata read a distribution's version from (its `_path` is the dist-info or
    egg-info folder of a distribution found on the import path)."""
    folder = getattr(dist, "_path", None)
    if folder is None:
        return None
    folder = Path(folder)
    for name in ("METADATA", "PKG-INFO"):
        if (folder / name).is_file():
            return folder / name
    return folder


READ = Ledger()  # this process's: cleared when a command starts (flows/noop.py `begin`)
