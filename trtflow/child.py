"""Native work (ONNX Runtime, TensorRT) in a child Python process, so a crash or a write into the current
directory ends there: `python -m MODULE ARGS`, whose result is the last JSON object line it prints."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_module(module: str, args: list[str], timeout: float,
               cwd: Path | None = None) -> tuple[dict[str, Any] | None, subprocess.CompletedProcess]:
    """The child's result (None when it printed none: it crashed or failed before) and the finished process.
    Raises subprocess.TimeoutExpired after `timeout` seconds (the child is killed)."""
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return (json.loads(lines[-1]) if lines else None), proc
