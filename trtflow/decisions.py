"""What a stage's result decided for deployment, as typed records every layer reads the same way: a stage returns
them (`StageResult.decisions`), the runner stores them in the result's manifest, and the flow hands them back,
prints and sends them without knowing which kind decided."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

Action = Literal["ship", "replace", "exclude", "release", "hold"]


class Decision(BaseModel):
    """One decision: `ship` a candidate (it passed); `replace` a candidate (never to deploy: a repaired engine
    passes in its place); `exclude` a variant (optional, it failed: not benchmarked or released); `release` a
    version of `model` for the target `subject`; `hold` the target's previous version (the variant that shipped
    it was left out)."""
    action: Action
    subject: str
    why: str = ""
    model: str | None = None
    version: int | None = None
    engine: str | None = None


def of(decisions: list[Decision], action: Action) -> list[Decision]:
    return [d for d in decisions if d.action == action]


def sentences(stage: str, decisions: list[Decision]) -> list[str]:
    """What the decisions mean for deployment, one line each (Rich markup-free plain text): the candidates
    replaced, the variants left out, the targets kept at their previous version."""
    lines = []
    replaced = [d.subject for d in of(decisions, "replace")]
    if replaced:
        lines.append(f"not to deploy (failed {stage}; each replaced by a repaired engine that passes): "
                     f"{', '.join(replaced)}")
    lines += [f"left out optional variant {d.subject} (failed {stage}; not benchmarked or released): {d.why}"
              for d in of(decisions, "exclude")]
    lines += [f"kept version {d.version} of {d.model} for target {d.subject} ({stage}): {d.why}"
              for d in of(decisions, "hold")]
    return lines
