"""Processes and waits shared by the tests that run a fleet's parts (a Prefect server, workers, trtflow's CLI):
every process started is stopped by its process group, every wait is bounded and fails with the logs' tails."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

PIPE = """version: 1
name: {name}
model: models/cls.onnx
stages:
  engine: {{kind: "tests.stage_fns:copy_model", outputs: {{model: onnx}}, env_dependent: true}}
"""


@contextmanager
def _started(cmd: list[str], env: dict[str, str], log: Path, cwd: Path):
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue


def _until(what: str, predicate, timeout: float, logs: list[Path], every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")


def _cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _api(api: str, method: str, path: str, body: dict):
    response = getattr(httpx, method)(f"{api}{path}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()
