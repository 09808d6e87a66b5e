"""What a built-in kind's stage module gives the flow, as one typed object: its `CODE`.

`run(params, inputs, out_dir)` does the work; `report` is the class its output `report` must load as (what the
stages after it read it as), checked in the stage's own process before the result returns, so a bad report fails the
stage that wrote it and the command never imports a stage module to check one; `events` is what the flow announces
after a stage of the kind ran; `outdated` says why a published result about to be reused no longer holds. A field
misspelled or left out is an error where the module is imported, never a check silently off (the flow reaches a
kind's code only through this object: `flows/implementation.py`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from pydantic import BaseModel

    from trtflow.artifact import Inputs, StageResult
    from trtflow.events import Event, StageRan


@dataclass(frozen=True)
class StageCode:
    run: Callable[[Any, "Inputs", Path], "StageResult"]
    report: type["BaseModel"] | None = None
    events: Callable[["StageRan"], list["Event"]] | None = None
    # (the result's metrics, the store's shared/ folder) -> why it no longer holds, or None
    outdated: Callable[[dict[str, Any], Path], str | None] | None = None

    def __call__(self, params: Any, inputs: "Inputs", out_dir: Path) -> "StageResult":
        result = self.run(params, inputs, out_dir)
        self.check_report(result)
        return result

    def check_report(self, result: Any) -> None:
        """The kind's report is what its class says, or the stage fails before anything is published."""
        from pydantic import ValidationError

        from trtflow import files
        from trtflow.artifact import StageResult
        from trtflow.errors import StageError
        from trtflow.records import first_problem
        from trtflow.text import first_line

        path = result.outputs.get("report") if isinstance(result, StageResult) else None
        if self.report is None or path is None:
            return
        try:
            self.report.model_validate_json(files.read_bounded(path, files.RECORD_BYTES))
        except (ValidationError, OSError, ValueError) as exc:
            what = first_problem(exc) if isinstance(exc, ValidationError) else first_line(exc)
            raise StageError(f"the stage wrote a report its kind's {self.report.__name__} refuses ({what})",
                             hint="a bug in trtflow: please report it with the stage's log") from None
