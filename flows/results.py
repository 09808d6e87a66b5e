"""What a run hands back, as models: a stage result's verdict for deployment (read from its manifest's metrics) and
the flow's result per stage. The flow returns them as JSON (Prefect's result storage, a deployment's caller);
`trtflow run`, `plan` and the watcher read them back through these models only."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from trtflow.events import Event
from trtflow.flows.manifest import Manifest
from trtflow.pipelines.kinds import kind_named
from trtflow.stages.release.triton.versions import Held, Release

if TYPE_CHECKING:
    from trtflow.flows.runner import StageOutcome


class Verdict(BaseModel):
    """What a stage's result decided for deployment: a validate stage's candidates that pass and those never to
    deploy, optional variants it left out (variant -> why) and their candidates; a release stage's versions and the
    targets it kept at their previous version. Empty for other kinds."""
    shipped: list[str] = []
    not_shipped: list[str] = []
    excluded: dict[str, str] = {}
    left_out: list[str] = []
    releases: list[Release] = []
    held: list[Held] = []

    @classmethod
    def of(cls, manifest: Manifest) -> Verdict:
        """From the result's metrics (the names above; others are the stage's own): the parts the kind's row says
        its metrics carry (`Kind.verdict`); metrics of these names from another kind are no verdict."""
        row = kind_named(manifest.kind)
        parts = {k: v for k, v in manifest.metrics.items() if row is not None and k in row.verdict}
        try:
            return cls.model_validate(parts)
        except ValidationError:
            return cls()


class Announced(BaseModel):
    """An event a stage's kind announced after it ran (emitted by the stage's task): its name, the resource's id,
    the version it announces (a release's)."""
    event: str
    resource: str
    version: int | None = None


class StageReport(Verdict):
    """The flow's result for one stage."""
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
