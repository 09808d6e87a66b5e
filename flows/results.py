"""What a run hands back, as models: a stage result's verdict for deployment (its manifest's decisions) and
the flow's result per stage. The flow returns them as JSON (Prefect's result storage, a deployment's caller);
`trtflow run`, `plan` and the watcher read them back through these models only."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from trtflow.decisions import Decision
from trtflow.events import Event
from trtflow.flows.manifest import Manifest

if TYPE_CHECKING:
    from trtflow.flows.runner import StageOutcome


class Verdict(BaseModel):
    """What a stage's result decided for deployment (its manifest's decisions; none for most kinds)."""
    decisions: list[Decision] = []

    @classmethod
    def of(cls, manifest: Manifest) -> Verdict:
        return cls(decisions=manifest.decisions)


class Announced(BaseModel):
    """An event a stage's kind announced after it ran (emitted by the stage's task): its name, the resource's id,
    the version it announces (a release's)."""
    event: str
    resource: str
    version: int | None = None


class StageReport(Verdict):
    """The flow's result for one stage (fields a flow run of an earlier trtflow returned are kept as they were)."""
    model_config = ConfigDict(extra="allow")
    stage: str
    status: str  # "ran" | "reused"
    key: str
    directory: str
    seconds: float
    work_seconds: float
    reason: str
    engines: list[str] = []  # the stage's outputs of type `engines`
    announced: list[Announced] = []  # the events its kind announced (a stage that ran)

    @classmethod
    def of_outcome(cls, outcome: StageOutcome, events: list[Event] = ()) -> StageReport:
        m = outcome.manifest
        return cls(stage=outcome.name, status=outcome.status, key=outcome.key, directory=str(outcome.directory),
                   seconds=round(outcome.seconds, 3), work_seconds=round(outcome.work_seconds, 3),
                   reason=outcome.reason,
                   engines=[str(outcome.directory / out.path) for out in m.outputs.values() if out.type == "engines"],
                   announced=[Announced(event=e.event, resource=e.resource_id, version=e.version) for e in events],
                   **Verdict.of(m).model_dump())
