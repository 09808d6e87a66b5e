"""Run by tests/test_sigterm.py in a pytest of its own (not collected by the suite: no test_ prefix): a fixture
starts a process in a session of its own, as the suite's servers are, and stops it at teardown."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture
def server():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    Path(os.environ["SIGTERM_PROBE"]).write_text(str(proc.pid))
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_waits_for_its_signal(server):
    time.sleep(300)
