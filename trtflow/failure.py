"""A failure as one frozen value (Prefect's `State`, DVC's exception per situation): made once where the fact is
known — the stage refusing its input, its process crashing or timing out, an exception it did not mean, its
verdict — with a typed cause; the layers above only add fields (`replace`): the runner the stage's name and kind,
the published result's directory and the paths it moved, the schedule the stages that also failed or did not run
because of it. One function words it (`Failure.line`): the console, the stage's Prefect artifact and its
`trtflow.stage.failed` event all say that line.

A `TrtflowError` carries its failure (`TrtflowError.failure`) across processes and Prefect's retry boundary;
nothing edits the message an error was made with."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Union


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
    """The stage's process ended without answering: how (`trtflow.child.ending`) and its last line of output."""
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
