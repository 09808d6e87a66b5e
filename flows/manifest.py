"""A published result's manifest (`manifest.json` beside its files), with one reader and one writer: the runner
makes it, the stores publish, verify and serve it, `plan` and the flow read it. Reading is also a check: a file
that is not a manifest of the key it sits under, or that names a path outside its own directory, is no manifest
(it may come from a shared bucket anyone can write to)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from trtflow.decisions import Decision
from trtflow.flows.keys import Environment, KeyParts
from trtflow.paths import safe_relpath
from trtflow.records import Recorded

MANIFEST = "manifest.json"


def _inside(rel: str) -> str:
    if not safe_relpath(rel):
        raise ValueError(f"{rel!r} is not a path inside the result's directory")
    return rel


class OutputRecord(BaseModel):
    """One output of the stage: where it is in the result's directory, its artifact type and content digest."""
    path: str
    type: str = "file"
    digest: str
    size: int | None = None

    _path_inside = field_validator("path")(_inside)


class FileRecord(BaseModel):
    """One file of the result as published: what `check_files` compares (mtime and ctime are the publishing
    machine's; absent in manifests of older trtflow versions, so the file is hashed)."""
    model_config = ConfigDict(extra="allow")

    size: int
    sha256: str
    mtime_ns: int | None = None
    ctime_ns: int | None = None


class InputRecord(BaseModel):
    """One artifact the stage read: where it was, its type and content digest."""
    model_config = ConfigDict(extra="allow")

    path: str = ""
    type: str = ""
    digest: str = ""


class PipelineRef(Recorded):
    """The pipeline a result was made by."""
    name: str | None = None
    file: str | None = None


class Timings(Recorded):
    started: str | None = None  # ISO 8601, UTC
    work_seconds: float | None = None  # inside the stage's own function


class RunEnvironment(Recorded):
    """Where the result was made: Python, the platform, and the environment fingerprint its key holds."""
    python: str | None = None
    platform: str | None = None
    fingerprint: Environment | None = None


class Manifest(BaseModel):
    model_config = ConfigDict(extra="allow")  # what a later trtflow adds survives a round trip

    key: str
    status: str  # "ok", or "failed" (a verdict worth keeping, never reused as a success)
    outputs: dict[str, OutputRecord]
    stage: str = ""
    kind: str = ""
    key_parts: KeyParts = KeyParts()
    pipeline: PipelineRef = PipelineRef()
    inputs: dict[str, InputRecord | list[InputRecord]] = {}
    metrics: dict[str, Any] = {}
    decisions: list[Decision] = []  # what the result decided for deployment (the stage's StageResult.decisions)
    warnings: list[str] = []
    timings: Timings = Timings()
    environment: RunEnvironment = RunEnvironment()
    files: dict[str, FileRecord] | None = None  # relative path -> its record
    blobs: str | None = None  # a shared store's writer directory holding the files

    @field_validator("files")
    @classmethod
    def _files_inside(cls, files: dict[str, FileRecord] | None) -> dict[str, FileRecord] | None:
        for rel in files or {}:
            _inside(rel)
        return files

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def parse(cls, data: Any, key: str) -> "Manifest | None":
        """The manifest of `key` in `data` (read from JSON); None when it is not one."""
        if not isinstance(data, dict) or data.get("key") != key:
            return None
        try:
            return cls.model_validate(data)
        except ValidationError:
            return None

    def to_json(self) -> dict[str, Any]:
        # (a field left empty stays out: a manifest written before it existed reads and writes back unchanged)
        empty = {name for name in ("blobs", "decisions") if not getattr(self, name)}
        return self.model_dump(mode="json", exclude=empty)
