"""The versions released so far, per model name and target: `<store>/shared/releases/<model>/<target>.json`.

A release of an engine released before keeps that release's version; any other engine gets the next one, so the
versions of a model increase with each engine shipped (Triton serves the highest by default). Outside the stage
key, like benchmark baselines: a shared store syncs it to every machine (the last writer wins if two machines
release the same model and target at once).
"""
from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ValidationError

from trtflow import files


class Released(BaseModel):
    version: int
    engine: str  # sha256 of the engine file
    candidate: str
    created: str


class Ledger(BaseModel):
    releases: list[Released] = []

    def version_for(self, engine_digest: str) -> tuple[int, bool]:
        """(the version of this engine, whether it is new)."""
        for r in self.releases:
            if r.engine == engine_digest:
                return r.version, False
        return max((r.version for r in self.releases), default=0) + 1, True


def ledger_file(shared: Path, model: str, target: str) -> Path:
    return shared / "releases" / model / f"{target}.json"


def read(path: Path) -> tuple[Ledger, str | None]:
    """The ledger, and a warning when the file exists but cannot be read (versions then start again at 1)."""
    if not path.exists() and not path.is_symlink():
        return Ledger(), None
    try:
        return Ledger.model_validate(files.read_json(path, files.RECORD_BYTES, follow=False)), None
    except (OSError, ValueError, ValidationError, files.NotAFile) as exc:
        return Ledger(), f"{path}: unreadable release ledger ({exc}); versions counted from 1"


def record(path: Path, ledger: Ledger, version: int, engine_digest: str, candidate: str) -> None:
    if any(r.version == version for r in ledger.releases):
        return
    ledger.releases.append(Released(version=version, engine=engine_digest, candidate=candidate,
                                    created=datetime.now(timezone.utc).isoformat(timespec="seconds")))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(ledger.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)
