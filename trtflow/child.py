"""Work in a child process, so a crash, a hang or a write into the current directory ends there: the parent hands
the child a typed request, the child answers with a typed response, written only once it is whole; no answer means
the child died, and how its process ended (`ending`) is what the parent says.

- Native work (the pre-flight, the ONNX Runtime probe, the quantization pre-processing, the TensorRT version probe,
  each engine build, the built-in harness) is `python -m MODULE REQUEST.json RESPONSE.json`: `call` writes the
  request (a pydantic model), the child's `serve` reads it, works (files it makes go beside the request) and
  writes the response (another model) atomically. `call` returns a typed outcome its callers match on:
  `Answered` (the response), `Crashed` (it ended without one: evidence about the input, worded by `ending`) or
  `TimedOut`. A child killed from outside (the OOM killer, a user, a scheduler) gave no answer at all and says
  nothing about the input: `call` raises `Killed`, a transient error (retried, never a result).
- A program that is not ours (trtexec, nvidia-smi, a user's command for `trtflow reduce`) is `run`: it ends
  `Exited` (its code, its output) or `TimedOut` (it and everything it started killed); killed from outside, `Killed`
  as above.
- A stage is not run here but by `flows/isolate.py`: forked from a fork server that preloaded the common imports,
  it answers over a pipe with Python objects (its result, its exceptions).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, TypeVar, Union

from pydantic import BaseModel

from trtflow.errors import TransientStageError, ending
from trtflow.parent_death import die_with_parent

Request = TypeVar("Request", bound=BaseModel)
Response = TypeVar("Response", bound=BaseModel)

# How a process ends when something outside kills it. SIGSEGV, SIGABRT, SIGBUS, SIGFPE and SIGILL are the native
# library crashing on its input: evidence about the input, which the caller judges.
KILLED = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})


class Killed(TransientStageError):
    """A child was killed from outside before it answered: no answer, so never a result."""


def killed_by(returncode: int | None) -> str | None:
    """The signal's name when `returncode` says the process was killed from outside, else None."""
    if returncode is None or -returncode not in KILLED:
        return None
    return signal.Signals(-returncode).name


@dataclass(frozen=True)
class Answered(Generic[Response]):
    """The child answered: its response, and what it wrote on stderr."""
    response: Response
    stderr: str = ""


@dataclass(frozen=True)
class Crashed:
    """The child ended without an answer, on its own (a native crash, an exception): how, and its stderr."""
    returncode: int
    stderr: str = ""

    @property
    def signal(self) -> str | None:
        """The signal it died of (SIGSEGV, ...), if one."""
        return ending(self.returncode).removeprefix("was killed by ") if self.returncode < 0 else None

    @property
    def last_line(self) -> str:
        """The last line it wrote on stderr (a Python error, a library's complaint), else how it ended."""
        return (self.stderr.strip().splitlines() or [ending(self.returncode)])[-1]

    def text(self) -> str:
        """'was killed by SIGSEGV: <its last line>', 'exited with code 1: <its last line>'."""
        last = self.stderr.strip().splitlines()
        return ending(self.returncode) + (f": {last[-1]}" if last else "")


@dataclass(frozen=True)
class TimedOut:
    """The child did not answer within `seconds`, and was killed."""
    seconds: float

    def text(self) -> str:
        return f"did not finish within {self.seconds:g} s (killed)"


Outcome = Union[Answered[Response], Crashed, TimedOut]


def call(module: str, request: BaseModel, response_type: type[Response], folder: Path, timeout: float,
         cwd: Path | None = None, names: tuple[str, str] = ("request.json", "response.json"),
         what: str | None = None, env: dict[str, str] | None = None) -> Outcome[Response]:
    """Run `module` on `request` (written into `folder`): what came of it (see the module). Raises `Killed` when
    something else killed the child before it answered (`what` names it there). `env`: variables set in the child's
    environment, over this process's (the dynamic loader reads some only when a process starts)."""
    request_path, response_path = (folder / names[0]).resolve(), (folder / names[1]).resolve()
    request_path.write_text(request.model_dump_json(indent=2) + "\n")
    response_path.unlink(missing_ok=True)
    ended = run([sys.executable, "-m", module, str(request_path), str(response_path)], timeout, cwd=cwd,
                what=what or f"the {module} process", before="answered", env=env)
    if isinstance(ended, TimedOut):
        return ended
    if not response_path.exists():
        return Crashed(ended.returncode, ended.stderr)
    return Answered(response_type.model_validate_json(response_path.read_text()), ended.stderr)


@dataclass(frozen=True)
class Exited:
    """A program ended on its own: its exit code (negative: the signal it died of) and what it printed (stdout and
    stderr; empty where `run` was given a log file)."""
    returncode: int
    stdout: str = ""
    stderr: str = ""

    def text(self) -> str:
        """'exited with code 2: <its last line>', 'was killed by SIGSEGV'."""
        last = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return ending(self.returncode) + (f": {last[-1][:200]}" if last else "")


def run(argv: list[str], timeout: float, *, cwd: Path | None = None, log: Path | None = None,
        what: str | None = None, before: str = "finished", env: dict[str, str] | None = None) -> Exited | TimedOut:
    """A program run to its end, in a session of its own that dies with this process: `Exited`, or `TimedOut`
    after `timeout` s (it and everything it started killed). `log`: a file that gets its stdout and stderr
    (interleaved, as a terminal would show them) instead of the result. Raises `Killed` when something else killed
    it (`what` names it there); OSError when it cannot be started. `env`: variables set over this process's."""
    sink = open(log, "w") if log is not None else None  # noqa: SIM115 - closed below, whatever happens
    try:
        proc = subprocess.Popen(argv, cwd=cwd, text=True, start_new_session=True, preexec_fn=die_with_parent,
                                stdout=sink or subprocess.PIPE, stderr=subprocess.STDOUT if sink else subprocess.PIPE,
                                env={**os.environ, **env} if env else None)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return TimedOut(timeout)
    finally:
        if sink is not None:
            sink.close()
    signal_name = killed_by(proc.returncode)
    if signal_name is not None:
        raise Killed(f"{what or argv[0]} was killed ({signal_name}) before it {before}; that says nothing about "
                     f"its input: run again")
    return Exited(proc.returncode, stdout or "", stderr or "")


def serve(request_type: type[Request], work: Callable[[Request, Path], BaseModel]) -> int:
    """The child's side (its `__main__`): `work(request, folder)` with the request's folder; the response is
    written only once it is whole."""
    request_path, response_path = Path(sys.argv[1]), Path(sys.argv[2])
    response = work(request_type.model_validate_json(request_path.read_text()), request_path.parent)
    staged = response_path.with_name(f".{response_path.name}.partial")
    staged.write_text(response.model_dump_json(indent=2, exclude_none=True) + "\n")
    os.replace(staged, response_path)
    return 0

