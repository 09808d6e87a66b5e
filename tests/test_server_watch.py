"""A slow Prefect server is not a dead one: while a run goes on, trtflow asks the server's /health every 3 s. A
server that refuses connections is gone (the run stops, exit 3, within seconds); one that takes connections and
does not answer (SQLite writes, a busy machine, a paused VM) is waited for, up to TRTFLOW_SERVER_PATIENCE seconds.
Three unanswered checks (about 18 s) used to end a healthy run, and, run in process, the pytest worker with it. The
watcher's thread never exits the process itself: it interrupts the main thread, which unwinds (its `finally` blocks
run) and ends with the one line."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

WATCHED = textwrap.dedent("""
    import sys, time
    from trtflow.flows.cli import _fail
    from trtflow.flows.cli.run import _server_watch
    try:
        with _server_watch(sys.argv[1], False):
            try:
                time.sleep(float(sys.argv[2]))
            finally:
                print("unwound", flush=True)
    except BaseException as exc:  # as the CLI's main does: one line, its exit code
        sys.exit(_fail(exc, False))
    print("the run ended")
""")


def _start(url: str, seconds: float, patience: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WATCHED, url, str(seconds)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TRTFLOW_SERVER_PATIENCE": patience})


@pytest.mark.slow
def test_a_silent_server_past_its_patience_and_a_refusing_one_are_gone():
    """Two runs side by side: one whose server takes connections and says nothing beyond
    TRTFLOW_SERVER_PATIENCE=4 ends with exit 3; one whose server refuses connections ends with exit 3 within seconds.
    (A silent server within its patience is waited for: tests/test_server.py pauses a real one past the old limit.)"""
    with socket.socket() as silent, socket.socket() as closed:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # connections are taken (the kernel's backlog) and never answered
        closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        t0 = time.monotonic()
        impatient = _start(f"http://127.0.0.1:{silent.getsockname()[1]}/api", 120, "4")
        refused = _start(f"http://127.0.0.1:{closed.getsockname()[1]}/api", 120, "120")
        ended = {}
        for name, proc in (("refused", refused), ("impatient", impatient)):
            out, err = proc.communicate(timeout=120)
            ended[name] = (proc.returncode, time.monotonic() - t0, out + err)
    for name, says in (("impatient", "took connections but did not answer for"),
                       ("refused", "stopped answering during the run")):
        code, seconds, text = ended[name]
        assert code == 3 and says in text and seconds < 40, (name, ended)
        assert "a new one is started" not in text, text  # (not trtflow's own server here: nothing would start)
        assert "Traceback" not in text and "the run ended" not in text and "unwound" in text, text
