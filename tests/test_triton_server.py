"""The test Triton server (tests/triton_server.py) leaves no process behind, whatever a test's outcome: not the server,
not its Python backend's stubs (which ignore SIGTERM and outlive a server that died or hung while loading them).
Each test starts the real server with a one-line Python model loaded, ends it the way a test can end, and then looks
in /proc: nothing of the server's session, and no stub serving a model of its repository, whoever its parent is now.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests import triton_server

ROOT = Path(__file__).resolve().parent.parent


def echo_model(repository: Path, name: str = "echo", initialize_s: float = 0) -> None:
    """A Python-backend model answering its input (its `initialize` sleeps `initialize_s` first)."""
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(textwrap.dedent(f"""\
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [{{ name: "IN" data_type: TYPE_FP32 dims: [1] }}]
        output [{{ name: "OUT" data_type: TYPE_FP32 dims: [1] }}]
        instance_group [{{ kind: KIND_CPU count: 1 }}]
        """))
    (repository / name / "1" / "model.py").write_text(textwrap.dedent(f"""\
        import time
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                time.sleep({initialize_s})

            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
        """))


@pytest.fixture(scope="module")
def backend_env() -> Path:
    """The Python backend's environment the `triton` fixture uses (cached: made once for both)."""
    from trtflow.stages.release.triton.preprocess import REQUIREMENTS
    return triton_server.environment(list(REQUIREMENTS) + triton_server.STAND_IN_REQUIREMENTS)


def stubs_of(server: triton_server.Server) -> list[triton_server.Process]:
    """The stubs the server started (its children), once each of its loaded models has one."""
    return [p for p in triton_server.processes() if p.name == triton_server.STUB and p.ppid == server.proc.pid]


def assert_nothing_left(sid: int, repository: Path, stubs: list[int]) -> None:
    assert not triton_server.session(sid), triton_server.session(sid)
    assert not triton_server.stubs(repository), triton_server.stubs(repository)
    running = {p.pid for p in triton_server.processes() if p.name == triton_server.STUB}
    assert not running & set(stubs), running & set(stubs)


@pytest.mark.slow
def test_a_failing_test_leaves_no_triton_process(tmp_path: Path, backend_env: Path):
    repository = tmp_path / "models"
    echo_model(repository)
    with pytest.raises(RuntimeError, match="the test failed"), \
            triton_server.triton(repository, backend_env, tmp_path / "tritonserver.log") as server:
        server.load("echo")
        started = stubs_of(server)
        assert started, "the Python model's stub is not the server's child"
        raise RuntimeError("the test failed")
    assert server.proc.returncode is not None
    assert_nothing_left(server.proc.pid, repository, [p.pid for p in started])


@pytest.mark.slow
def test_a_server_hung_loading_a_model_is_killed_with_its_stub(tmp_path: Path, backend_env: Path):
    """A test failing while Triton loads a Python model: Triton waits for the load to finish before it exits on
    SIGTERM (here, never): after `grace` the session is killed, the stub (ignoring SIGTERM) with it."""
    repository = tmp_path / "models"
    echo_model(repository, "slow", initialize_s=600)
    grace = 2
    with pytest.raises(RuntimeError, match="the test failed"), \
            triton_server.triton(repository, backend_env, tmp_path / "tritonserver.log", grace=grace) as server:
        def load() -> None:
            with contextlib.suppress(Exception):  # the server is killed under it
                server._request("POST", "/v2/repository/models/slow/load", {}, timeout=60)
        threading.Thread(target=load, daemon=True).start()
        deadline = time.monotonic() + 120
        while not (started := stubs_of(server)):
            assert time.monotonic() < deadline, "no stub started"
            time.sleep(0.2)
        time.sleep(1)  # the stub is in the model's initialize now
        stopping = time.monotonic()
        raise RuntimeError("the test failed")
    assert time.monotonic() - stopping < grace + 20
    assert_nothing_left(server.proc.pid, repository, [p.pid for p in started])


INNER = '''
import json
import os
from pathlib import Path

from tests import triton_server
from tests.test_triton_server import echo_model


def record(what, server):
    with open(os.environ["TRTFLOW_TEST_RECORD"], "a") as fh:
        fh.write(json.dumps({"what": what, "server": server.proc.pid, "repository": str(server.repository),
                             "stubs": [p.pid for p in triton_server.stubs(server.repository)]}) + "\\n")


def test_fails_with_the_fixture_server(triton):
    echo_model(triton.repository)
    triton.load("echo")
    record("the triton fixture", triton)
    assert False, "fails on purpose"


def test_leaves_its_own_server_running(tmp_path):
    from trtflow.stages.release.triton.preprocess import REQUIREMENTS
    env = triton_server.environment(list(REQUIREMENTS) + triton_server.STAND_IN_REQUIREMENTS)
    echo_model(tmp_path / "models")
    server = triton_server.start(tmp_path / "models", env, tmp_path / "tritonserver.log")  # never stopped by the test
    server.load("echo")
    record("a server the test never stopped", server)
'''


@pytest.mark.slow
def test_no_triton_process_outlives_pytest(tmp_path: Path, backend_env: Path):
    """A pytest run (its own process, as a user's is) whose test fails using the `triton` fixture, and whose other test
    leaves a server it started running: when pytest has exited, neither server nor any of their stubs is left."""
    (tmp_path / "test_inner.py").write_text(INNER)
    record = tmp_path / "record.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                          cwd=ROOT, env={**os.environ, "TRTFLOW_TEST_RECORD": str(record)}, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 1 and "1 failed, 1 passed" in done.stdout, done.stdout + done.stderr
    servers = [json.loads(line) for line in record.read_text().splitlines()]
    assert [s["what"] for s in servers] == ["the triton fixture", "a server the test never stopped"], servers
    for s in servers:
        assert s["stubs"], s  # each had its Python model's stub running
        assert_nothing_left(s["server"], Path(s["repository"]), s["stubs"])
