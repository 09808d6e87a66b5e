"""The Prefect events trtflow emits, as values: what a stage kind's row declares it announces after a stage of that
kind ran (`Kind.events`), and what the watcher emits for rebuilt engines. Made here, emitted by the flows
(`flows/pipeline_flow.emit`: Prefect is theirs)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StageRan:
    """What a kind's `events` gets: the pipeline file, the stage that ran, its key, where its result is published
    and the metrics its run reported."""
    pipeline: Path
    stage: str
    key: str
    directory: Path
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    """A Prefect event: its name, the resource's id and other labels, the payload; `engine` is the engine file of an
    engine's event, `version` the version an event announces (a release's), `say` a line for the run's log."""
    event: str
    resource_id: str
    labels: dict[str, str]
    payload: dict[str, Any]
    engine: str | None = None
    version: int | None = None
    say: str = ""
