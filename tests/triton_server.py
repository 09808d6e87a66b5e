"""A real Triton Inference Server for the tests: the `tritonserver` binary (Triton 2.51.0, with its Python backend)
that ships inside the `nvidia-pytriton` 0.7.0 wheel, fetched from the package index with `pip download --no-deps`
and unpacked into a cache, never installed (the wheel declares numpy < 2, the project runs numpy 2). It starts on a
machine without a GPU, on loopback ports.

No TensorRT backend comes with it: `tests/triton_backend/model.py` stands in for it (a Python-based backend named
`tensorrt`, which Triton picks for `platform: "tensorrt_plan"`), running the released variant's ONNX on ONNX
Runtime. What the tests prove with it is what Triton does with a released repository, not what TensorRT does. The
same file stands in for Triton's ONNX Runtime backend too (a backend named `onnxruntime`, which Triton picks for
`platform: "onnxruntime_onnx"`: an offloaded model's ONNX Runtime pieces), running the model's own ONNX.

The Python backend's stub (one per Python minor version, shipped in the wheel) runs in an environment of its own,
found through `PATH` (the environment's `bin` first) with the base interpreter's libpython on `LD_LIBRARY_PATH`:
`environment()` makes one from exact requirement lines, as a release's card tells its users to.

A server leaves nothing running, whatever the test's outcome: it is started in a session of its own, and `stop()`
(the context's exit; at the latest the interpreter's exit, `atexit`) ends that whole session and waits until none of
it is left. Asking Triton to stop is not enough: a stub ignores SIGTERM, and one whose server died or hung while
loading it (a test failing right after starting the server, or during a load) outlives the server, reparented to
init, until it notices.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from tests import wheels

WHEEL = "nvidia-pytriton==0.7.0"
TRITON_VERSION = "2.51.0"
STAND_IN = Path(__file__).with_name("triton_backend") / "model.py"
# the backend directories it stands in as: `tensorrt` (platform tensorrt_plan), `onnxruntime` (onnxruntime_onnx)
STAND_IN_BACKENDS = ("tensorrt", "onnxruntime")
STAND_IN_REQUIREMENTS = ["numpy>=1.26,<2", "onnxruntime>=1.20,<1.33"]  # what the stand-in backend itself imports
STUB = "triton_python_backend_stub"  # the Python backend's process, one per model instance


def server_home() -> Path:
    """The unpacked wheel: `pytriton/tritonserver/{bin,backends}` and `nvidia_pytriton.libs`."""
    return wheels.unpacked(WHEEL, _install_stub)


def _install_stub(home: Path) -> None:
    server = home / "pytriton" / "tritonserver"
    stub = server / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}" / \
        "triton_python_backend_stub"
    shutil.copy(stub, server / "backends" / "python" / stub.name)  # (its rpath holds there too)
    for exe in (server / "bin" / "tritonserver", server / "backends" / "python" / stub.name):
        exe.chmod(0o755)


def backends(home: Path) -> Path:
    """The backend directory: Triton's Python backend and the stand-in backends (`STAND_IN_BACKENDS`)."""
    root = home / "pytriton" / "tritonserver" / "backends"
    with wheels.locked("server"):
        for name in STAND_IN_BACKENDS:
            (root / name).mkdir(exist_ok=True)
            if not (root / name / "model.py").exists() or \
                    (root / name / "model.py").read_bytes() != STAND_IN.read_bytes():
                shutil.copy(STAND_IN, root / name / "model.py")
    return root


def environment(requirements: list[str]) -> Path:
    """A virtual environment made with `pip install` of exactly these requirement lines (cached by them)."""
    lines = sorted(set(requirements))
    key = hashlib.sha256(json.dumps([sys.version, lines]).encode()).hexdigest()[:12]
    env = wheels.cache() / f"env-{key}"
    with wheels.locked(f"env-{key}"):
        if not (env / ".complete").exists():
            shutil.rmtree(env, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, capture_output=True, timeout=300)
            (env / "requirements.txt").write_text("\n".join(lines) + "\n")
            done = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q",
                                   "--disable-pip-version-check", "-r", str(env / "requirements.txt")],
                                  capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"making the Python backend's environment failed: {done.stderr[-2000:]}")
            (env / ".complete").write_text("\n".join(lines))
    return env


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@dataclass
class Server:
    url: str  # host:port of the HTTP endpoint
    repository: Path
    log: Path
    proc: subprocess.Popen
    requirements: list[str] = field(default_factory=list)  # what its Python backend's environment was made from

    def _request(self, method: str, path: str, body: dict | None = None, timeout: float = 120) -> tuple[int, str]:
        req = urllib.request.Request(f"http://{self.url}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def load(self, model: str) -> None:
        """Load (or reload) `model` from the repository; AssertionError with Triton's reason when it fails."""
        status, text = self._request("POST", f"/v2/repository/models/{model}/load", {})
        assert status == 200, f"Triton did not load '{model}': {text}\n{self.log.read_text()[-3000:]}"

    def ready(self, model: str) -> bool:
        return self._request("GET", f"/v2/models/{model}/ready")[0] == 200

    def client(self):
        import tritonclient.http as http
        return http.InferenceServerClient(self.url, network_timeout=120, connection_timeout=60)


def server_environment(env: Path) -> dict[str, str]:
    """The server's variables: its Python backend's stub finds `env` through PATH (it ignores PYTHONPATH) and the base
    libpython through LD_LIBRARY_PATH."""
    variables = {**os.environ, "PATH": f"{env / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                 "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [sysconfig.get_config_var("LIBDIR"),
                                                                  os.environ.get("LD_LIBRARY_PATH")]))}
    variables.pop("PYTHONPATH", None)
    return variables


EXIT_TIMEOUT_S = 5  # tritonserver --exit-timeout-secs

@contextlib.contextmanager
def triton(repository: Path, env: Path, log: Path, grace: float = EXIT_TIMEOUT_S + 5) -> Iterator[Server]:
    """tritonserver on `repository` (models loaded explicitly: `Server.load`), its Python models in `env`. On leaving,
    however the block ends, the server and every process it started are gone (`stop`; `grace`: how long Triton may
    take to unload its models before the rest is killed)."""
    server = start(repository, env, log)
    try:
        yield server
    finally:
        stop(server.proc, grace)


def start(repository: Path, env: Path, log: Path) -> Server:
    """tritonserver on `repository`, answering; in a session of its own, stopped with it by `stop` (at the latest when
    this interpreter exits). `triton` stops it when its block ends."""
    home = server_home()
    root = backends(home)
    http_port, grpc_port, metrics_port = _free_ports(3)
    variables = server_environment(env)
    with open(log, "wb") as out:  # a file, not a pipe: a full pipe would stop the server
        proc = watch(subprocess.Popen(
            [str(home / "pytriton" / "tritonserver" / "bin" / "tritonserver"), "--model-repository", str(repository),
             "--backend-directory", str(root), "--model-control-mode", "explicit", "--exit-on-error", "false",
             "--http-address", "127.0.0.1", "--http-port", str(http_port), "--grpc-address", "127.0.0.1",
             "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port), "--allow-metrics", "false",
             # what a stop waits for the models to unload (30 s by default: the Python stubs took all of it)
             "--exit-timeout-secs", str(EXIT_TIMEOUT_S)],
            stdout=out, stderr=subprocess.STDOUT, env=variables, start_new_session=True))
    made_from = (env / "requirements.txt").read_text().split() if (env / "requirements.txt").exists() else []
    server = Server(f"127.0.0.1:{http_port}", repository, log, proc, made_from)
    try:
        deadline = time.monotonic() + 120
        while not (_up(http_port) and server._request("GET", "/v2/health/live", timeout=5)[0] == 200):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver did not start: {log.read_text()[-3000:]}")
            time.sleep(0.3)
    except BaseException:
        stop(proc)
        raise
    return server


# ------------------------------------------------------------------------- nothing left running, whatever happens

@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    session: int
    state: str  # /proc's: Z is a zombie (dead, not yet reaped)
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return Path(self.argv[0]).name if self.argv else ""


def processes() -> list[Process]:
    """Every process on this machine that is not a zombie, from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:  # it ended meanwhile
            continue
        state, ppid, _group, session = stat[stat.rindex(")") + 2:].split()[:4]  # the name, in (), may hold anything
        if state not in ("Z", "X"):
            argv = tuple(a.decode(errors="replace") for a in cmdline.split(b"\0") if a)
            found.append(Process(int(entry.name), int(ppid), int(session), state, argv))
    return found


def session(sid: int) -> list[Process]:
    """What is left of the session `sid` (a server's: its shell, the server, the Python backend's stubs)."""
    return [p for p in processes() if p.session == sid]


def stubs(repository: Path) -> list[Process]:
    """The Python backend's stubs serving a model of `repository`, wherever they are (a stub's arguments start with
    its model.py), whoever their parent now is."""
    roots = {str(Path(repository)), str(Path(repository).resolve())}
    return [p for p in processes() if p.name == STUB and len(p.argv) > 1 and
            any(p.argv[1].startswith(root + os.sep) for root in roots)]


_RUNNING: dict[int, subprocess.Popen] = {}  # started and not yet stopped: what `stop_all` ends at exit


def watch(proc: subprocess.Popen) -> subprocess.Popen:
    """`proc`, started with `start_new_session=True`, to be stopped with its whole session by `stop` (at the latest
    when this interpreter exits)."""
    assert os.getsid(proc.pid) == proc.pid, "a server to stop with its session must be started in a new session"
    _RUNNING[proc.pid] = proc
    return proc


def stop(proc: subprocess.Popen, grace: float = EXIT_TIMEOUT_S + 5) -> None:
    """Stop `proc` and everything in its session: SIGTERM to its process group, up to `grace` s for it to exit, then
    SIGKILL to whatever of the session is left (stubs ignore SIGTERM and outlive a server that died or hung loading
    them), until none of it remains. RuntimeError if something of it survives SIGKILL for 30 s."""
    sid = proc.pid
    if proc.returncode is not None and not session(sid):  # stopped already: its id may be another's by now
        _RUNNING.pop(sid, None)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    deadline = time.monotonic() + 30
    while True:
        # a session id stays allocated while anything is in the session: this never names another's processes
        left = session(sid)
        if not left:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"still running after SIGKILL: {left}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sid, signal.SIGKILL)
        for p in left:  # one that left the process group (not the session)
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        time.sleep(0.1)
        proc.poll()  # reap it once killed (its session's other processes are init's to reap)
    proc.wait(timeout=10)
    _RUNNING.pop(proc.pid, None)


@atexit.register
def stop_all() -> None:
    """Every server not stopped yet, at once (the interpreter is exiting: pytest ended, or a test process died of an
    exception outside any test)."""
    for proc in list(_RUNNING.values()):
        with contextlib.suppress(Exception):
            stop(proc, grace=5)


def _up(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


# ------------------------------------------------------------------------------------------ a release, served

def released(store: Path, repo: Path, target: int = 0) -> tuple[dict, dict[str, Path]]:
    """The newest release in `store`: its models for one target copied into the server's repository `repo` as a
    machine without a GPU must have them (the one edit: KIND_GPU -> KIND_CPU, which Triton requires with no GPU
    present), the shipped variant's ONNX placed beside the engine for the stand-in backend. Returns the target's
    report and model name -> the ONNX it serves."""
    import hashlib as _hashlib

    key = json.loads((store / "release" / "last.json").read_text())["key"]
    report = json.loads((store / "release" / key / "report.json").read_text())["targets"][target]
    for name in report["models"]:
        shutil.rmtree(repo / name, ignore_errors=True)
        shutil.copytree(store / "release" / key / report["repository"] / name, repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace("kind: KIND_GPU", "kind: KIND_CPU"))
    digest = report["chosen"]["engine_sha256"]
    plans = [p for p in store.glob("*/*/engines/*/engine.plan")
             if _hashlib.sha256(p.read_bytes()).hexdigest() == digest]
    assert plans, f"the shipped engine {report['chosen']['name']} is not in {store}"
    cell = json.loads((plans[0].parent / "spec.json").read_text())
    variant = plans[0].parent / "variant.onnx"
    onnx = variant if variant.exists() else Path(cell["model"])
    model = next(m for m in report["models"] if not m.endswith(("_preprocess", "_ensemble")))
    shutil.copy(onnx, repo / model / str(report["version"]) / "model.onnx")
    return report, {model: onnx}


def requirements(model_dir: Path) -> list[str]:
    """The lines of a released model's requirements.txt (what its card says to install)."""
    return [ln.strip() for ln in (model_dir / "requirements.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")]


def check_engine_model(server: Server, name: str, onnx: Path, contract: dict) -> list[str]:
    """Requests to the released engine model at batch 1, at max_batch_size and one above it (refused), and at each
    profile's min and max shapes: each answer equal to ONNX Runtime's on the shipped variant's ONNX. Returns what
    was checked, one line each."""
    import numpy as np
    import onnxruntime as ort
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException, triton_to_np_dtype

    # one intra-op thread, as the stand-in backend runs it: equal bit for bit needs the same thread partitioning (a
    # two-thread session once differed from it on one request to ppocr-det's variant)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(onnx), options, providers=["CPUExecutionProvider"])
    client = server.client()
    batch = contract["max_batch_size"]
    inputs = {t["name"]: t for t in contract["inputs"]}
    outputs = [t["name"] for t in contract["outputs"]]
    rng = np.random.default_rng(0)
    checked = []

    def ask(shapes: dict[str, list[int]]):
        feeds = {n: rng.random(s).astype(triton_to_np_dtype(inputs[n]["data_type"].removeprefix("TYPE_")))
                 for n, s in shapes.items()}
        request = []
        for n, a in feeds.items():
            item = http.InferInput(n, list(a.shape), inputs[n]["data_type"].removeprefix("TYPE_"))
            item.set_data_from_numpy(a)
            request.append(item)
        answer = client.infer(name, request, outputs=[http.InferRequestedOutput(o) for o in outputs])
        return feeds, answer

    def refused(shapes: dict[str, list[int]], reason: str, line: str) -> None:
        try:
            ask(shapes)
        except InferenceServerException as exc:
            assert reason in str(exc), exc
            checked.append(line)
        else:
            raise AssertionError(f"served, though it should be refused: {line}")

    for profile in contract["profiles"]:
        cap = (lambda shape: [min(shape[0], batch), *shape[1:]]) if batch > 0 else list
        points = {"min": {n: list(r[0]) for n, r in profile["shapes"].items()},
                  "max": {n: cap(r[2]) for n, r in profile["shapes"].items()}}
        if batch > 0:
            points["batch 1"] = {n: [1, *r[1][1:]] for n, r in profile["shapes"].items()}
            points[f"max_batch_size {batch}"] = {n: [batch, *r[1][1:]] for n, r in profile["shapes"].items()}
        for what, shapes in points.items():
            feeds, answer = ask(shapes)
            expected = session.run(outputs, feeds)
            for o, e in zip(outputs, expected):
                got = answer.as_numpy(o)
                assert got.shape == e.shape and np.array_equal(got, e), (what, o, got.shape, e.shape)
            checked.append(f"{profile['name']} {what}: {shapes}")
        if batch > 0:
            refused({n: [batch + 1, *r[1][1:]] for n, r in profile["shapes"].items()}, "batch-size must be <=",
                    f"{profile['name']} batch {batch + 1}: refused by Triton")
        for n, (lo, opt, hi) in profile["shapes"].items():  # a dimension Triton lets through (-1 in its config)
            declared = ([-1] if batch > 0 else []) + inputs[n]["dims"]
            free = [i for i, d in enumerate(declared) if d == -1 and (i > 0 or batch == 0) and lo[i] > 1]
            for i in free[:1]:
                shapes = {m: list(r[1]) for m, r in profile["shapes"].items()}
                shapes[n][i] = lo[i] - 1
                refused(shapes, "outside the engine's profile",
                        f"{profile['name']} {n} dimension {i} = {lo[i] - 1}: refused by the engine")
    return checked


def run_request_example(server: Server, script: str, where: Path, *args: str) -> str:
    """The card's request example, run as a user would (its own process), against `server`; its output."""
    path = where / "request_example.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRITON_URL": server.url})
    assert done.returncode == 0, f"the card's request example failed: {done.stdout}{done.stderr}"
    return done.stdout


def stub_backend_utils(monkeypatch) -> type:
    """A stand-in of `triton_python_backend_utils` (the module Triton's Python backend gives a model.py), enough
    to run a generated model.py in this process: it proves the model's own code, not Triton. Returns its Tensor."""
    import types

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

        def as_numpy(self):
            return self.array

    stub = types.ModuleType("triton_python_backend_utils")
    stub.Tensor, stub.TritonError = Tensor, str
    stub.get_input_tensor_by_name = lambda request, name: request[name]
    stub.InferenceResponse = lambda output_tensors, error=None: (output_tensors, error)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    return Tensor

