"""The contract every stage implements, with no Prefect and no TensorRT in sight.

A stage is a plain function ``run(params, inputs, out_dir) -> StageResult``: it reads only ``inputs`` (`Inputs`: slot
-> `Artifact`, or a list of them where the slot takes many), writes only under ``out_dir`` and returns what it
wrote.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtflow.decisions import Decision


@dataclass(frozen=True)
class Artifact:
    """One file (or directory) produced by a stage or given as the pipeline's source."""

    path: Path
    type: str  # "onnx", "preprocess", "engines", "ranges", "json", ...
    digest: str  # sha256 of the content (for a model with external data: of all its files)
    origin: str = ""  # the stage that produced it ("source" for the pipeline's model)


@dataclass(frozen=True)
class Provenance:
    """One result a stage's inputs came from, directly or not: the stage, its key in the store and the digests of
    its outputs, and which earlier outputs it read ('stage.output' per slot). The pipeline's model is the entry
    `source`, with no key and the model's digest."""

    stage: str
    kind: str
    key: str
    outputs: dict[str, str]  # output -> digest
    inputs: dict[str, list[str]] = field(default_factory=dict)  # slot -> ["stage.output", ...]


class Inputs(dict):
    """A stage's inputs by slot name: an `Artifact`, or a list of them for a slot that takes many (and for the
    files a data glob matched). A plain dict to a user's own stage; the typed accessors say what a slot holds.
    `lineage`: every result the inputs came from, down to the source model (not part of the key: the digests of
    the inputs are)."""

    lineage: tuple[Provenance, ...] = ()

    def one(self, slot: str) -> Artifact:
        value = self[slot]
        if isinstance(value, list):
            raise TypeError(f"input slot '{slot}' holds {len(value)} artifacts, not one")
        return value

    def optional(self, slot: str) -> Artifact | None:
        return self.one(slot) if slot in self else None

    def without(self, slots: tuple[str, ...]) -> "Inputs":
        """These inputs less `slots`, with their lineage (a plain dict copy would drop it)."""
        kept = Inputs({slot: value for slot, value in self.items() if slot not in slots})
        kept.lineage = self.lineage
        return kept

    def many(self, slot: str) -> list[Artifact]:
        """The artifacts of a slot that takes many (or a data glob); [] when the slot is not wired."""
        value = self.get(slot, [])
        return value if isinstance(value, list) else [value]


OWNER = "owner"  # the key of a claimed record naming the run's result it belongs to
CLAIM_BYTES = 2**20  # a claimed record (a release's version) is a few hundred bytes; larger is not one of trtflow's


@dataclass(frozen=True)
class Claim:
    """A record the result is only valid with, created once in the store's `shared/` and never replaced (a
    release's version): `data` is a JSON object whose `"owner"` is `owner`. The runner creates it with the store's
    atomic primitive before the result is published; where another run holds the same path for another owner, the
    stage runs again and sees that record. (`StageResult.after_publish`: the same kind of record, created once the
    result is published.)"""

    path: str  # relative to the store's shared/
    data: bytes
    owner: str

    def held_by_another(self, theirs: bytes) -> bool:
        """Whether the record at `path` (`theirs`, as read) is another owner's: any that is not a JSON object
        naming this claim's owner."""
        try:
            record = json.loads(theirs)
        except ValueError:
            return True
        return not isinstance(record, dict) or record.get(OWNER) != self.owner


@dataclass
class StageResult:
    outputs: dict[str, Path]  # output name -> path under out_dir
    summary: str = ""  # Markdown shown as the stage's Prefect artifact
    metrics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    # records that say the result was published (a released version's mark), created once it is: what the next
    # runs go by, where a run claimed and died before publishing
    after_publish: list[Claim] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)  # what it decided for deployment (trtflow/decisions.py)
