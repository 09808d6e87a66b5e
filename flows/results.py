"""What a run hands back, as models: a stage result's verdict for deployment (read from its manifest's metrics) and
the flow's result per stage. The flow returns them as JSON (Prefect's result storage, a deployment's caller);
`trtflow run`, `plan` and the watcher read them back through these models only."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, ValidationError

from trtflow.flows.manifest import Manifest

if TYPE_CHECKING:
    from trtflow.flows.runner import StageOutcome


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")  # what a later stage version adds survives


class Release(_Record):
    """A version a release stage made or kept for one target (`new`: it made it)."""
    model: str
    target: str
    version: int
    new: bool = False
    engine: str | None = None
    engine_sha256: str | None = None
    repository: str = ""


class Held(_Record):
    """A target whose previous version stays the one served: the variant it shipped was left out."""
    model: str
    target: str
    version: int
    engine: str | None = None
    why: str = ""


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
        """From the result's metrics (the names above; others are the stage's own). Releases and held targets are
        a release stage's only; metrics of these names in another shape (a user stage's) are no verdict."""
        try:
            verdict = cls.model_validate(manifest.metrics)
        except ValidationError:
            return cls()
        return verdict if manifest.kind == "release" else verdict.model_copy(update={"releases": [], "held": []})


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

    @classmethod
    def of_outcome(cls, outcome: StageOutcome) -> StageReport:
        m = outcome.manifest
        return cls(stage=outcome.name, status=outcome.status, key=outcome.key, directory=str(outcome.directory),
                   seconds=round(outcome.seconds, 3), work_seconds=round(outcome.work_seconds, 3),
                   reason=outcome.reason,
                   engines=[str(outcome.directory / out.path) for out in m.outputs.values() if out.type == "engines"],
                   **Verdict.of(m).model_dump())
