"""Call a stage function in a child process of its own, with or without `timeout:`.

Stage work is native code (ONNX Runtime, TensorRT parsers and builders, the user's own code), and a crash there
(a segfault, `os._exit`) must fail the stage with one line, not kill the pipeline silently. Prefect's task
timeout cannot interrupt blocking native code either. So every stage runs in a process of its own (forked from a
fork server that preloaded the common imports, with the caller's environment of the moment) that

- leads its own process group: a timeout, Ctrl-C or SIGTERM kills the stage *and* whatever it started;
- dies with its parent (Linux `PR_SET_PDEATHSIG`), so a killed `trtflow run` leaves nothing behind;
- writes its stdout/stderr (libjpeg's and ONNX Runtime's own lines, TensorRT's) to a log: streamed line by line
  to the caller's `output` (Prefect's task log; bounded), kept as `stage.log` in the stage's directory, shown on
  the console only with --verbose;
- reports progress back over its pipe, to the same listeners as in-process work.

`TRTFLOW_IN_PROCESS=1` runs stages in the calling process instead, for a debugger (no timeout, no isolation).
"""
from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from trtflow import phases, procfs, progress, settings
from trtflow.disk import disk_error
from trtflow.errors import (
    Crash,
    Failure,
    StageStopped,
    Timeout,
    TransientStageError,
    TrtflowError,
    Unexpected,
    ending,
    rebuilt,
)
from trtflow.parent_death import die_with_parent
from trtflow.usercode import search_path


# The stage's protocol: its request is a `StageCall`; its process answers over a pipe with `Progress` messages
# and then one `Returned` or `Raised` (a pickle: a stage's result and its exceptions are Python objects).
@dataclass(frozen=True)
class StageCall:
    """A stage's request: the function (imported by name in the child) and its arguments."""
    function: Callable[..., Any]
    args: tuple


@dataclass(frozen=True)
class Progress:
    """A progress report on the way (trtflow.progress's listeners get it in the parent)."""
    what: str
    done: float
    total: float | None


@dataclass(frozen=True)
class Returned:
    value: Any
    load_seconds: float = 0.0  # unpickling the call: importing the stage's module and what it imports
    call_seconds: float = 0.0  # the stage function itself


@dataclass(frozen=True)
class Raised:
    error: BaseException
    traceback: str


IN_PROCESS = settings.IN_PROCESS.name

# Stages start from a fork server that has imported these once per trtflow process (a spawned interpreter
# importing them costs about 0.5 s per stage). Nothing here starts threads or touches a GPU at import. A run that
# knows which stages it will run has the fork server import their kinds' modules and libraries too (`warm_up`:
# only those, so that a run reusing most stages imports nothing it does not use). A built-in kind's `run` arrives
# as its module's name (flows/implementation.py `_StageRun`), unpickled with flows/implementation.py.
PRELOAD = ["trtflow.parent_death", "trtflow.flows.isolate", "numpy", "onnx", "trtflow.pipelines.kinds",
           "trtflow.artifact", "trtflow.flows.implementation", "trtflow.flows.fork_imports"]
FORK_SERVER_IMPORTS = "TRTFLOW_FORK_SERVER_IMPORTS"  # the modules `fork_imports` imports, comma-separated


class _Supervisor:
    """What this trtflow process knows about its stage processes: the fork server they start from and the ones
    running now (several flows and stages run side by side, in threads; a signal handler stops them all). A fork
    server belongs to a process, so there is one supervisor per process (`_SUPERVISOR`), and it is the only state
    this module keeps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._context: Any = None
        self._spawner: threading.Thread | None = None
        self._spawns: queue.SimpleQueue[tuple[threading.Event, list[BaseException]]] = queue.SimpleQueue()
        self._live: dict[int, tuple[str, int]] = {}  # process group -> the stage's tag and start time
        self._start = threading.Lock()  # one child started at a time (`_main_not_reimported`)
        self.stopping = threading.Event()  # kill_all was called: a stage process that dies now was stopped

    def context(self) -> Any:
        """multiprocessing's forkserver context, its fork server running (started again after it died)."""
        with self._lock:
            if self._context is None:
                ctx = multiprocessing.get_context("forkserver")
                ctx.set_forkserver_preload(PRELOAD)
                self._context = ctx
            if self._spawner is None:
                # The fork server dies when the thread that forked it ends (parent_death), and the thread that
                # first runs a stage is one of Prefect's task threads, which end with their flow run: it is
                # started from a thread that lives as long as this process.
                self._spawner = threading.Thread(target=self._spawn_loop, name="trtflow-fork-server-parent",
                                                 daemon=True)
                self._spawner.start()
        done, errors = threading.Event(), []
        self._spawns.put((done, errors))
        done.wait()
        if errors:
            raise errors[0]
        return self._context

    def _spawn_loop(self) -> None:
        from multiprocessing import forkserver

        while True:
            done, errors = self._spawns.get()
            try:
                forkserver.ensure_running()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                errors.append(exc)
            finally:
                done.set()

    def start(self, proc: Any, tag: str, since: int) -> None:
        with self._start, _main_not_reimported():
            try:
                proc.start()
            except (EOFError, ConnectionError):
                # the fork server died since `context` found it running (killed: the OOM killer, a kill of its
                # group): started again, the stage starts from the new one (a failed start leaves `proc` unstarted)
                self.context()
                proc.start()
        with self._lock:
            self._live[proc.pid] = (tag, since)

    def ended(self, pid: int) -> None:
        with self._lock:
            self._live.pop(pid, None)

    def kill_all(self) -> None:
        self.stopping.set()
        with self._lock:
            groups = list(self._live.items())
        for pgid, (tag, since) in groups:
            _kill_group(pgid, tag, since)


_SUPERVISOR = _Supervisor()


def warm_up(imports: Sequence[str] = ()) -> None:
    """Start the fork server now: it imports PRELOAD and `imports` (the modules of the stages about to run) on
    another core while this process goes on (a run imports Prefect meanwhile), instead of when the first stage
    starts. Called before the run starts threads of its own: `imports` goes in this process's environment only
    while the fork server is started (a few ms), so that it reaches nothing else."""
    if settings.IN_PROCESS.get():
        return
    os.environ[FORK_SERVER_IMPORTS] = ",".join(imports)
    try:
        _SUPERVISOR.context()
    finally:
        os.environ.pop(FORK_SERVER_IMPORTS, None)


def kill_all() -> None:
    """Kill every running stage and what it started (Ctrl-C or SIGTERM in the main thread, a cancelled flow run):
    each stage's own thread then sees its process gone and unwinds, removing its staging (StageStopped)."""
    _SUPERVISOR.kill_all()


def resume() -> None:
    """After a kill_all: stages that die from now on crashed (a process that runs pipelines again)."""
    _SUPERVISOR.stopping.clear()


def _child(conn, call: bytes, sys_path: list[str], log: str, environ: dict[str, str]) -> None:
    os.setpgrp()
    die_with_parent()  # the fork server's death, which follows trtflow's
    os.environ.clear()  # the environment of now, not of when the fork server started
    os.environ.update(environ)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()  # a native crash's Python stack, into the log
    sys.path[:] = sys_path
    try:
        t0 = time.perf_counter()
        request: StageCall = pickle.loads(call)
        t1 = time.perf_counter()
        with progress.listening(lambda what, done, total: conn.send(Progress(what, done, total)), alone=True):
            value = request.function(*request.args)
            conn.send(Returned(value, t1 - t0, time.perf_counter() - t1))
    except BaseException as exc:  # report everything, including the user's own exceptions
        text = traceback.format_exc()
        conn.send_bytes(raised(exc, text))
    finally:
        phases.flush()
        conn.close()


def raised(exc: BaseException, text: str) -> bytes:
    """What the stage's process sends for `exc` (its traceback `text`): `Raised`, pickled as the pipe pickles it, in
    the first of `_sendable`'s forms that the parent can unpickle too (unpickling calls an exception's class with
    its args again: `Foo(message)` was a TypeError in the parent for `Foo(where, why)`); else a RuntimeError naming
    it."""
    for error in _sendable(exc):
        try:
            data = bytes(ForkingPickler.dumps(Raised(error, text)))
            ForkingPickler.loads(data)
            return data
        except Exception:  # noqa: BLE001, S112 - it does not cross whole: the next, plainer form
            continue
    return bytes(ForkingPickler.dumps(Raised(RuntimeError(f"{type(exc).__name__}: {exc}"), text)))


def _sendable(exc: BaseException) -> Iterator[BaseException]:
    """`exc` in the forms it may cross the pipe in, best first: whole; then, for a trtflow error whose attributes or
    class do not pickle, the nearest class of it that does, with its message, exit code and the attributes that
    pickle (still the refusal it was: never retried as an unexpected error)."""
    yield exc
    if isinstance(exc, TrtflowError):
        kept = {k: v for k, v in vars(exc).items() if _pickles(v)}
        kept["exit_code"], kept["_failure"] = exc.exit_code, exc.failure
        for cls in type(exc).__mro__:
            if issubclass(cls, TrtflowError):
                yield rebuilt(cls, (str(exc.args[0]) if exc.args else "",), kept)


def _pickles(value: Any) -> bool:
    """Whether `value` pickles and unpickles (a class whose constructor wants more than its args fails the second)."""
    try:
        pickle.loads(pickle.dumps(value))
    except Exception:  # noqa: BLE001 - whatever pickle raises on it
        return False
    return True


STAGE_TAG = "TRTFLOW_STAGE_TAG"  # in the environment of a stage's process and of everything it starts


def _kill_group(pgid: int, tag: str, since: int) -> None:
    """Kill the stage whose process leads group `pgid`, what it started, and what it detached from its group
    (`setsid`, a daemon's double fork): those are found by the `tag` their environment inherited, and by having
    started at `since` (`procfs.now_ticks()` when the stage started) or later."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _kill_tagged(f"{STAGE_TAG}={tag}".encode(), since)


def _kill_tagged(tag: bytes, since: int) -> None:
    """SIGKILL every process of this user, started at `since` or later, whose environment carries `tag` (a scan of
    /proc: a few ms). Another user's process carrying the tag (root reads every environment) is none of the stage's
    doing, nor is one started before the stage (its pid reused). A process that cleared its environment is not
    found: docs/store.md (Faults) says so."""
    me, uid = os.getpid(), os.getuid()
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else []:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or not ours
            continue
        if tag not in environ.split(b"\0") or _owner(pid) != uid or (procfs.started(pid) or -1) < since:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _owner(pid: int) -> int | None:
    """The real uid of process `pid` (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _last_line(text: str) -> str:
    """The stage's last line of output before Python's fatal-error report (which --verbose shows whole)."""
    lines = [ln.strip() for ln in text.split("Fatal Python error:")[0].splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def unexpected(exc: BaseException, name: str, child_traceback: str = "") -> TransientStageError:
    """An exception a stage did not mean to raise (a bug, or the environment): one line naming the stage."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return TransientStageError.of(Failure(Unexpected(type(exc).__name__, first), stage=name,
                                          traceback=child_traceback or "".join(traceback.format_exception(exc))))


def _disk_error(exc: BaseException, name: str, keep: Path | None) -> TrtflowError | None:
    """A full disk (or quota, or read-only file system) while the stage wrote its outputs: said as such."""
    where = keep.parent if keep is not None else Path(tempfile.gettempdir())
    return disk_error(exc, where, f"stage '{name}'", shown=f"its output in {where.parent}")


STAGE_LOG = "stage.log"  # the stage's own output, in its directory
OUTPUT_LINES = 500  # at most this many lines of a stage's output go to `output` (the log file keeps all)
OUTPUT_LINE_CHARS = 2000


class _Tail(threading.Thread):
    """Follows the child's log file and hands each new line to `output` (the first OUTPUT_LINES of them)."""

    def __init__(self, log: Path, output: Callable[[str], None], name: str):
        super().__init__(name=f"trtflow-{name}-output", daemon=True)
        self.log, self.output = log, output
        self.done = threading.Event()
        self.sent = 0

    def run(self) -> None:
        with open(self.log, "rb") as fh:
            pending = b""
            while True:
                finished = self.done.is_set()
                chunk = fh.read()
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._send(line.decode(errors="replace").rstrip())
                if finished:
                    if pending:
                        self._send(pending.decode(errors="replace").rstrip())
                    return
                if not chunk:
                    self.done.wait(0.2)

    def _send(self, line: str) -> None:
        if not line.strip():
            return
        self.sent += 1
        if self.sent <= OUTPUT_LINES:
            self.output(line[:OUTPUT_LINE_CHARS])
        elif self.sent == OUTPUT_LINES + 1:
            self.output(f"(more output: the stage's {STAGE_LOG})")


@contextlib.contextmanager
def _main_not_reimported() -> Iterator[None]:
    """multiprocessing prepares each child by importing the caller's main script again (as `__mp_main__`): a script
    that calls `pipeline_flow` at top level without an `if __name__ == "__main__":` guard ran its pipeline again in
    every stage's process. Stage functions are imported by name, never from the main script, so the children are
    started with the main module's file and spec hidden (multiprocessing reads them from `__main__` and offers no
other way to say so), one start at a time."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        if "__file__" in saved:
            del main.__dict__["__file__"]
        if "__spec__" in saved:
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


def call_stage(func: Callable[..., Any], args: tuple, timeout: float | None, name: str,
               output: Callable[[str], None] | None = None, keep: Path | None = None) -> Any:
    """`func(*args)` in an isolated child. Errors a stage raises on purpose (TrtflowError) come back as they
    are; anything else, a crash and a timeout come back as a TransientStageError naming the stage. An error
    carries the child's traceback and its own output (its `failure`'s) for --verbose. `output`
    gets the child's output line by line as it comes (bounded); `keep`: where its whole output is copied when
    there was any (the stage's output directory)."""
    if settings.IN_PROCESS.get():
        return _in_process(func, args, name, keep)
    started = time.perf_counter()
    call = pickle.dumps(StageCall(func, args))
    ctx = _SUPERVISOR.context()
    parent, child = ctx.Pipe(duplex=False)
    fd, log_name = tempfile.mkstemp(prefix=f"trtflow-{name}-", suffix=".log")
    os.close(fd)
    log = Path(log_name)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    proc = ctx.Process(target=_child, args=(child, call, search_path(), log_name,
                                            {**os.environ, STAGE_TAG: tag}),
                       name=f"trtflow-{name}", daemon=True)
    since = procfs.now_ticks()  # the stage's start: whatever carries its tag started then or later
    tail = _Tail(log, output, name) if output is not None else None
    text = ""
    try:
        if tail is not None:
            tail.start()
        _SUPERVISOR.start(proc, tag, since)
        child.close()
        message = _answer(parent, proc, timeout, name, log, tag, since)
        proc.join()
    finally:
        text = _wind_up(parent, proc, tag, since, tail, log, keep)
    if isinstance(message, Raised):
        exc, trace = message.error, message.traceback
        error = exc if isinstance(exc, TrtflowError) else _disk_error(exc, name, keep) or unexpected(exc, name, trace)
        error.tell(traceback=trace, log=text)
        raise error
    phases.add("stage processes: imports", message.load_seconds)
    phases.add("stage work (the stage functions)", message.call_seconds)
    phases.add("stage processes: start, arguments, end",
               time.perf_counter() - started - message.load_seconds - message.call_seconds)
    return message.value


def _in_process(func: Callable[..., Any], args: tuple, name: str, keep: Path | None) -> Any:
    """The stage called in this process (settings.IN_PROCESS: tests, debuggers), its errors worded as a child's."""
    try:
        return func(*args)
    except TrtflowError:
        raise
    except Exception as exc:
        raise _disk_error(exc, name, keep) or unexpected(exc, name) from exc


def _answer(parent: Any, proc: Any, timeout: float | None, name: str, log: Path, tag: str, since: int) -> Any:
    """The child's answer (its value or what it raised), its progress reported on the way; a timeout, a stop and a
    crash raised as errors naming the stage."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not parent.poll(wait):
            _kill_group(proc.pid, tag, since)
            proc.join()
            raise TransientStageError.of(Failure(Timeout(timeout), stage=name))
        try:
            message = parent.recv()
        except EOFError:
            proc.join()
            if _SUPERVISOR.stopping.is_set():
                raise StageStopped(f"stage '{name}' was stopped with the run") from None
            text = log.read_text(errors="replace")
            raise TransientStageError.of(Failure(Crash(ending(proc.exitcode), _last_line(text)), stage=name,
                                                 log=text)) from None
        if not isinstance(message, Progress):
            return message
        progress.report(message.what, message.done, message.total)


def _wind_up(parent: Any, proc: Any, tag: str, since: int, tail: _Tail | None, log: Path, keep: Path | None) -> str:
    """After the child, however it ended: what it left running killed, its output read (and copied to `keep`
    where there was any) and its temporary log removed. The output."""
    parent.close()
    if proc.pid is not None:
        _kill_group(proc.pid, tag, since)  # anything the stage started and left running
        proc.join()
        _SUPERVISOR.ended(proc.pid)
    if tail is not None:
        tail.done.set()
        tail.join(10)
    text = ""
    try:
        text = log.read_text(errors="replace")
        if keep is not None and text.strip() and keep.parent.is_dir():
            keep.write_text(text)
    except OSError:
        pass
    log.unlink(missing_ok=True)
    return text


__all__ = ["call_stage", "kill_all", "resume", "unexpected", "IN_PROCESS"]
