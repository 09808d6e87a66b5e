"""Every error trtflow shows the user: one line saying what is wrong and what to do (a traceback only with
--verbose), and the exit code the CLI ends with. The CLI and Prefect's retry condition each test one type:
`TrtflowError`. Anything else escaping a stage is a bug, reported as such.

An error is a failure as one frozen value (Prefect's `State`, DVC's exception per situation): made once where the
fact is known — the stage refusing its input, its process crashing or timing out, an exception it did not mean, its
verdict — with a typed cause; the layers above only add fields (`TrtflowError.tell`): the runner the stage's name and
kind, the published result's directory and the paths it moved, the schedule the stages that also failed or did not
run because of it. One function words it (`Failure.line`): the console, the stage's Prefect artifact and its
`trtflow.stage.failed` event all say that line. The error carries its failure across processes and Prefect's retry
boundary; nothing edits the message an error was made with."""
from __future__ import annotations

import os
import signal
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from trtflow.artifact import StageResult


def ending(returncode: int | None) -> str:
    """How a process ended, for a message: 'exited with code 3', 'was killed by SIGSEGV'."""
    if returncode is not None and returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


@dataclass(frozen=True)
class Refused:
    """An error raised on purpose: what is wrong, and what to do."""
    message: str
    hint: str | None = None

    def text(self, stage: str) -> str:
        said = f"{self.message} ({self.hint})" if self.hint else self.message
        if stage and f"'{stage}'" not in said and not said.startswith(f"{stage}:"):
            said = f"{stage}: {said}"
        return said


@dataclass(frozen=True)
class Unexpected:
    """The stage raised what it did not mean to (a bug, or the environment): its type and first line."""
    type: str
    first_line: str

    def text(self, stage: str) -> str:
        return (f"stage '{stage}' failed unexpectedly: {self.type}: {self.first_line} "
                f"(run with --verbose for the traceback)")


@dataclass(frozen=True)
class Crash:
    """The stage's process ended without answering: how (`ending`) and its last line of output."""
    ending: str
    last_output: str = ""

    def text(self, stage: str) -> str:
        last = f"; its last output: {self.last_output}" if self.last_output else ""
        return f"stage '{stage}' crashed (its process {self.ending}{last})"


@dataclass(frozen=True)
class Timeout:
    """The stage did not finish within its `timeout:`."""
    seconds: float

    def text(self, stage: str) -> str:
        return (f"stage '{stage}' timed out after {self.seconds:g} s (raise 'timeout:' in the pipeline file if the "
                f"work is expected to take longer)")


@dataclass(frozen=True)
class FailedVerdict:
    """The stage did its work and judged it a failure: the verdict's line, and its report's summary (Markdown)."""
    message: str
    summary: str = ""

    def text(self, stage: str) -> str:
        return Refused(self.message).text(stage)


Cause = Union[Refused, Unexpected, Crash, Timeout, FailedVerdict]


@dataclass(frozen=True)
class Failure:
    """A stage's failure (or any error the user can act on, `stage` then empty). `log`: what the stage's process
    printed; `traceback`: where it raised (both for --verbose); `directory`: its published result (a failed
    verdict's report); `moved`: paths the cause names that no longer exist -> what to say instead."""
    cause: Cause
    stage: str = ""
    kind: str = ""
    log: str = ""
    traceback: str = ""
    directory: str = ""
    moved: tuple[tuple[str, str], ...] = ()
    also_failed: tuple[str, ...] = ()
    not_run: tuple[str, ...] = ()

    def line(self) -> str:
        """The one line every surface says."""
        said = self.cause.text(self.stage)
        for path, instead in self.moved:
            said = said.replace(path, instead)
        if self.directory:
            said += f" (details: {os.path.join(self.directory, 'summary.md')})"
        if self.also_failed:
            said += f"; also failed: {', '.join(self.also_failed)}"
        if self.not_run:
            said += f"; not run because of it: {', '.join(self.not_run)}"
        return said

    def payload(self) -> dict[str, Any]:
        """The failure as JSON for an event: its line, its cause's type and fields, where it happened (not the log
        nor the traceback: they stay in the stage's directory and on --verbose)."""
        return {"line": self.line(), "cause": type(self.cause).__name__,
                **{f"cause_{k}": v for k, v in asdict(self.cause).items() if k != "summary"},
                "stage": self.stage, "kind": self.kind, "directory": self.directory,
                "also_failed": list(self.also_failed), "not_run": list(self.not_run)}



class TrtflowError(Exception):
    """Root of the errors the user can act on. Never retried (but TransientStageError): the same input fails
    the same way. `hint` says what to do, shown in parentheses after the message. `failure`: the error as a value
    (above), its cause made from the message and hint unless the place that knew more made it
    (`of`); the layers above add fields with `tell`, and `str()` is its one line."""

    exit_code = 1
    hint: str | None = None

    def __init__(self, message: str = "", *, hint: str | None = None):
        self.hint = hint
        super().__init__(message)

    @property
    def failure(self) -> Failure:
        made = self.__dict__.get("_failure")
        return made if made is not None else Failure(self._cause())

    def _cause(self) -> Any:
        return Refused(str(self.args[0]) if self.args else "", self.hint)

    @classmethod
    def of(cls, failure: Failure) -> TrtflowError:
        """An error of this class carrying `failure` (made where the fact was known), its line as its message."""
        error = cls(failure.line())
        error._failure = failure
        return error

    def __str__(self) -> str:
        return self.failure.line()

    def tell(self, **fields: Any) -> None:
        """Add what a layer above knows (`Failure`'s fields) to the error."""
        self._failure = replace(self.failure, **fields)

    def __reduce__(self):
        # A stage's errors reach the parent pickled (flows/isolate.py). Pickle's default calls the class with
        # `args` (the message), which a constructor of its own (`LedgerError(where, why)`) refuses: every error is
        # rebuilt without its constructor instead, with its args and attributes as they were.
        return (rebuilt, (type(self), self.args), self.__dict__)


class SpecError(TrtflowError):
    """The pipeline file, an override or a command-line argument is wrong: names the file, line and key path."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 path: tuple | None = None, hint: str | None = None):
        self.message, self.file, self.line, self.path, self.hint = message, file, line, path, hint
        Exception.__init__(self, self.format())

    def _cause(self) -> Any:
        return Refused(self.format())

    def format(self) -> str:
        hint = f" ({self.hint})" if self.hint else ""
        if self.line == 0:  # the value came from --set, not from a line of the file
            where = f"--set {format_path(self.path)}: " if self.path else "--set: "
            return f"{where}{self.message}{hint}"
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        key = f"{format_path(self.path)}: " if self.path else ""
        return f"{where}{key}{self.message}{hint}"


class StoreError(TrtflowError):
    """The artifact store cannot be used (not writable, unreadable)."""

    exit_code = 2


class PrefectUnavailable(TrtflowError):
    """Prefect's API server (the temporary one, or PREFECT_API_URL's) cannot be reached."""

    exit_code = 3


class StageError(TrtflowError):
    """A stage cannot do its work with what it was given (bad model, bad parameters, missing data)."""

    exit_code = 1


class TransientStageError(StageError):
    """The stage crashed, timed out or raised what it did not mean to: it may not happen again, so Prefect's
    `retries:` apply (unlike every other TrtflowError)."""


class StageStopped(StageError):
    """The stage's process was stopped because the run was (cancelled, interrupted, its server lost): not a
    failure of the stage. Its Prefect task ends Cancelled."""


class StageFailed(StageError):
    """The stage did its work and its verdict is failure (e.g. parity out of tolerance).

    Unlike a plain StageError its result (the report saying why) is published for inspection, marked failed,
    so it is never reused as a success.
    """

    def __init__(self, message: str, result: StageResult):
        super().__init__(message)
        self.result = result

    def _cause(self) -> Any:
        summary = getattr(self.__dict__.get("result"), "summary", "")
        return FailedVerdict(str(self.args[0]) if self.args else "", summary)


def rebuilt(cls: type[TrtflowError], args: tuple, state: dict | None = None) -> TrtflowError:
    """An error of class `cls` with these `args` and attributes, its constructor not called."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state or {})
    return error


def format_path(path: tuple | None) -> str:
    """("stages", "build", "profiles", 0) -> "stages.build.profiles[0]"."""
    out = ""
    for part in path or ():
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
