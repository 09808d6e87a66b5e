"""What trtflow relies on in Prefect beyond its documented API, pinned (issue #70 Build 5): each test fails when
Prefect changes the behaviour, rather than trtflow silently losing it. (Prefect's error texts for a server it cannot
reach are pinned by tests/test_cli.py::test_prefect_unreachable_is_one_line, against the real Prefect.)"""
from __future__ import annotations

import concurrent.futures

import pytest


@pytest.mark.slow
def test_a_task_future_on_the_default_runner_wraps_an_in_process_future(prefect_api):
    """The flow's scheduler waits on the in-process futures (flows/pipeline_flow.py `_local`), asking the server
    nothing while stages run."""
    from prefect import flow, task

    from trtflow.flows.pipeline_flow import _local

    @task
    def one() -> int:
        return 1

    @flow
    def submits() -> bool:
        future = one.submit()
        inner = _local(future)
        done, _ = concurrent.futures.wait([inner], timeout=60)
        return isinstance(inner, concurrent.futures.Future) and inner in done and future.result() == 1

    assert submits()


QUIETED = """
import logging
from prefect.logging.configuration import setup_logging
from trtflow.flows.cli.run import _quiet_prefect_console
setup_logging(incremental=False)
NAMES = ("prefect._internal.concurrency", "prefect.events.clients", "prefect")
for name in NAMES:
    logging.getLogger(name).error("loud before: %s", name)
_quiet_prefect_console()
for name in NAMES:
    logging.getLogger(name).error("quiet after: %s", name)
"""


@pytest.mark.slow
def test_quieted_prefect_prints_nothing_of_its_own_on_the_console(tmp_path):
    """The CLI prints one line per failure: after `_quiet_prefect_console`, neither Prefect's console handler nor
    the stream handler its internal services log through (an event it could not send, a server gone) prints. In a
    process of its own: it reconfigures logging."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", QUIETED], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed
    assert "loud before: prefect._internal.concurrency" in printed  # Prefect's own handler does print, unquieted
    assert "quiet after" not in printed
