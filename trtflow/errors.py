"""Every error trtflow shows the user: one line saying what is wrong and what to do (a traceback only with
--verbose), and the exit code the CLI ends with. The CLI and Prefect's retry condition each test one type:
`TrtflowError`. Anything else escaping a stage is a bug, reported as such."""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trtflow.failure import FailedVerdict, Failure, Refused

if TYPE_CHECKING:
    from trtflow.artifact import StageResult


class TrtflowError(Exception):
    """Root of the errors the user can act on. Never retried (but TransientStageError): the same input fails
    the same way. `hint` says what to do, shown in parentheses after the message. `failure`: the error as a value
    (trtflow/failure.py), its cause made from the message and hint unless the place that knew more made it
    (`with_failure`); the layers above add fields with `tell`, and `str()` is its one line."""

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

    def with_failure(self, failure: Failure) -> TrtflowError:
        """This error, carrying `failure` (made where the fact was known)."""
        self._failure = failure
        return self

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
