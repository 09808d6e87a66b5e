"""Where trtexec is: a path the pipeline gives, `PATH`, `TENSORRT_ROOT`/`TRT_ROOT`, the usual install locations —
and which TensorRT it belongs to."""
from __future__ import annotations

import glob
import os
import re
import shutil
from pathlib import Path

from trtflow import child

USUAL = ("/usr/src/tensorrt/bin/trtexec", "/usr/local/tensorrt/bin/trtexec", "/opt/tensorrt/bin/trtexec",
         "/usr/lib/x86_64-linux-gnu/tensorrt/bin/trtexec", "/opt/nvidia/tensorrt/bin/trtexec",
         "/usr/local/TensorRT*/bin/trtexec", "/opt/TensorRT*/bin/trtexec")


def find_trtexec(explicit: str | None = None) -> tuple[Path | None, list[str]]:
    """(the trtexec to use or None, every place looked at, in order)."""
    looked: list[str] = []
    candidates: list[str] = []
    if explicit:
        candidates.append(explicit)
    else:
        on_path = shutil.which("trtexec")
        looked.append("PATH")
        if on_path:
            return Path(on_path), looked
        for var in ("TENSORRT_ROOT", "TRT_ROOT"):
            if os.environ.get(var):
                candidates.append(os.path.join(os.environ[var], "bin", "trtexec"))
        candidates += USUAL
    for pattern in candidates:
        for path in sorted(glob.glob(pattern)) or [pattern]:
            looked.append(path)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return Path(path), looked
    return None, looked


_PACKED = re.compile(r"\[TensorRT(?:-RTX)? v(\d{4,6})\]")


def trtexec_version(trtexec: Path, timeout: float = 60) -> str | None:
    """TensorRT's version as trtexec prints it (`&&&& RUNNING TensorRT.trtexec [TensorRT v100300]`)."""
    from trtflow.stages.trtexec.log import decode_packed_version

    try:
        ended = child.run([str(trtexec), "--help"], timeout, what="trtexec --help")
    except OSError:
        return None
    if isinstance(ended, child.TimedOut):
        return None
    m = _PACKED.search(ended.stdout + ended.stderr)
    return decode_packed_version(m.group(1)) if m else None
