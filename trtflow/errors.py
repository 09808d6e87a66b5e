"""Every error trtflow shows the user: one line saying what is wrong and what to do (a traceback only with
--verbose), and the exit code the CLI ends with. The CLI and Prefect's retry condition each test one type:
`TrtflowError`. Anything else escaping a stage is a bug, reported as such."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trtflow.artifact import StageResult


@dataclass(frozen=True)
class Said:
    """What the layers above a stage add to its error's one line, as typed fields (the message the error was made
    with is never edited): the stage it happened in, paths it names that no longer exist (path -> what to say
    instead), where its published report is, and the stages of the run that also failed or did not run because
    of it."""
    stage: str = ""
    moved: tuple[tuple[str, str], ...] = ()
    details: str = ""
    also_failed: tuple[str, ...] = ()
    not_run: tuple[str, ...] = ()

    def render(self, message: str) -> str:
        if self.stage and f"'{self.stage}'" not in message and not message.startswith(f"{self.stage}:"):
            message = f"{self.stage}: {message}"
        for path, instead in self.moved:
            message = message.replace(path, instead)
        if self.details:
            message += f" (details: {self.details})"
        if self.also_failed:
            message += f"; also failed: {', '.join(self.also_failed)}"
        if self.not_run:
            message += f"; not run because of it: {', '.join(self.not_run)}"
        return message


class TrtflowError(Exception):
    """Root of the errors the user can act on. Never retried (but TransientStageError): the same input fails
    the same way. `hint` says what to do, shown in parentheses after the message. `child_traceback` holds the
    traceback of an error raised in a stage's process (for --verbose). `said`: what the runner and the flow added
    (`tell`), rendered into the one line by `str()`."""

    exit_code = 1
    child_traceback = ""
    child_log = ""  # what a stage's process printed (its own and native libraries' lines)
    hint: str | None = None
    said = Said()

    def __init__(self, message: str = "", *, hint: str | None = None):
        self.hint = hint
        super().__init__(f"{message} ({hint})" if hint else message)

    def __str__(self) -> str:
        text = super().__str__()
        return self.said.render(text) if self.args and isinstance(self.args[0], str) else text

    def tell(self, **fields: Any) -> None:
        """Add what a layer above the stage knows (`Said`'s fields) to the error's one line."""
        self.said = replace(self.said, **fields)

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

    directory: Any = None  # the published result's directory, once the runner published it

    def __init__(self, message: str, result: StageResult):
        super().__init__(message)
        self.result = result


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
