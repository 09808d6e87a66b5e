"""Native work (ONNX Runtime, TensorRT) in a child Python process, so a crash, a hang or a write into the current
directory ends there. Every such child follows one convention: the pre-flight, the ONNX Runtime probe, the
quantization pre-processing, the TensorRT version probe and each engine build are

    python -m MODULE REQUEST.json RESPONSE.json

The parent writes the request (a pydantic model) with `call`; the child's `serve` reads it, does the work (files
it makes go beside the request) and writes the response (another model) atomically. No response means the child
died before it could answer: the parent has its exit code and stderr. A child killed from outside (the OOM killer,
a user, a scheduler) gave no answer at all: `call` raises `Killed`, a transient error (retried, never a result).
(Stages themselves run through `flows/isolate.py`: a fork server and a pipe, which carries their progress and
their exceptions.)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, TypeVar

from pydantic import BaseModel

from trtflow.errors import TransientStageError
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


def call(module: str, request: BaseModel, response_type: type[Response], folder: Path, timeout: float,
         cwd: Path | None = None, names: tuple[str, str] = ("request.json", "response.json"),
         what: str | None = None) -> tuple[Response | None, subprocess.CompletedProcess]:
    """Run `module` on `request` (written into `folder`); the child's response (None when it gave none: it
    crashed) and the finished process. Raises subprocess.TimeoutExpired after `timeout` seconds (the child is
    killed), and `Killed` when something else killed it before it answered (`what` names it there)."""
    request_path, response_path = (folder / names[0]).resolve(), (folder / names[1]).resolve()
    request_path.write_text(request.model_dump_json(indent=2) + "\n")
    response_path.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", module, str(request_path), str(response_path)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, preexec_fn=die_with_parent)
    if not response_path.exists():
        signal_name = killed_by(proc.returncode)
        if signal_name is not None:
            raise Killed(f"{what or f'the {module} process'} was killed ({signal_name}) before it answered; that "
                         f"says nothing about the model: run again")
        return None, proc
    return response_type.model_validate_json(response_path.read_text()), proc


def serve(request_type: type[Request], work: Callable[[Request, Path], BaseModel]) -> int:
    """The child's side (its `__main__`): `work(request, folder)` with the request's folder; the response is
    written only once it is whole."""
    request_path, response_path = Path(sys.argv[1]), Path(sys.argv[2])
    response = work(request_type.model_validate_json(request_path.read_text()), request_path.parent)
    staged = response_path.with_name(f".{response_path.name}.partial")
    staged.write_text(response.model_dump_json(indent=2, exclude_none=True) + "\n")
    os.replace(staged, response_path)
    return 0


def last_line(proc: subprocess.CompletedProcess) -> str:
    """The last line the child wrote on stderr (a Python error, a library's complaint), else its exit code."""
    return (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
