"""What a stage's result decided for deployment, as typed records every layer reads the same way: a stage returns
them (`StageResult.decisions`), the runner stores them in the result's manifest, and the flow hands them back,
prints and sends them without knowing which kind decided."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

Action = Literal["shipped", "replaced", "excluded", "released", "held"]


class Decision(BaseModel):
    """One decision: a candidate `shipped` (it passed) or `replaced` (never to deploy: a repaired engine passes in
    its place); a variant `excluded` (optional, it failed: not benchmarked or released); a version of `model`
    `released` for the target `subject`, or the target's previous version `held` (the variant that shipped it was
    left out)."""
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
    replaced = [d.subject for d in of(decisions, "replaced")]
    if replaced:
        lines.append(f"not to deploy (failed {stage}; each replaced by a repaired engine that passes): "
                     f"{', '.join(replaced)}")
    lines += [f"left out optional variant {d.subject} (failed {stage}; not benchmarked or released): {d.why}"
              for d in of(decisions, "excluded")]
    lines += [f"kept version {d.version} of {d.model} for target {d.subject} ({stage}): {d.why}"
              for d in of(decisions, "held")]
    return lines
