"""SIGTERM to the test run (a cancelled CI job, `timeout`) runs every teardown: the processes tests start in
sessions of their own are stopped, not left running (tests/conftest.py `_teardown_on_sigterm`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_faults import alive, wait_gone

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_sigterm_runs_the_teardowns(tmp_path):
    """In an xdist worker, as the suite runs (`-n 0`, one process, takes the same handler)."""
    pid_file = tmp_path / "pid"
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1",
                            "tests/sigterm_probe.py"], cwd=ROOT, env={**os.environ, "SIGTERM_PROBE": str(pid_file)},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() or not pid_file.read_text():
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0][-3000:]
            time.sleep(0.1)
        started = int(pid_file.read_text())
        assert alive(started)
        os.killpg(run.pid, signal.SIGTERM)  # as a CI runner stops a job: its process group
        out = run.communicate(timeout=60)[0]
        assert run.returncode != 0, out
        assert wait_gone([started], 10) == [], f"pid {started} outlived the test run:\n{out[-3000:]}"
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
