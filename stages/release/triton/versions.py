"""The versions released so far, per model name and target: one record per version,
`<store>/shared/releases/<model>/<target>/<version>.json`, created once and never rewritten.

A release of the engine released last keeps its version; any other engine gets the next one, so a model's versions
only increase (Triton serves the highest by default) and no version ever names two engines. The stage proposes the
version; the runner creates its record with the store's atomic primitive (`StageResult.claims`: O_EXCL locally, a
conditional write on S3) before the release is published, and where another machine took that version meanwhile
for another engine, the stage runs again and counts from that record. Outside the stage key, like benchmark
baselines. A ledger that cannot be read stops the release: counting again from 1 would give one version to two
engines.

A version is new (announced: `trtflow.release.created`) until a release of it is published, whichever run claimed
it: a run killed between the claim and the publication leaves the version to the run that finally publishes it.
Once the release is published, the runner creates the version's mark (`StageResult.after_publish`), once as well:
`releases/<model>/<target>.published/<version>.json`. `since.json` there, created before the first claim that will
be marked, tells the versions before it apart: a trtflow that marked none released them, and they were published.
A trtflow without marks never lists that folder (it is beside the target's, not in it).

Stores written before this layout hold one file per model and target, `releases/<model>/<target>.json`: it is read
(never written) so that versions go on from it.
"""
from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtflow import files, paths
from trtflow.artifact import CLAIM_BYTES, Claim
from trtflow.decisions import Decision
from trtflow.errors import StageError
from trtflow.events import Event, StageRan
from trtflow.pipelines.params.release import RELEASES
from trtflow.records import first_problem
from trtflow.stages.release.triton.contract import Contract

_M = TypeVar("_M", bound=BaseModel)
MAX_VERSION = 2**63 - 1  # Triton's versions are int64
RECORD = re.compile(r"([1-9][0-9]{0,18})\.json")  # a positive number without a leading zero, as Triton loads it
Version = Field(ge=1, le=MAX_VERSION)


class Released(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # "7" or 7.0 is not a version Triton would load
    version: int = Version
    owner: str = Field(pattern=r"^[0-9a-f]{64}$")  # sha256 of the engine file
    candidate: str
    created: str
    contract: Contract | None = None  # what clients of this version may send and get back (None: before contracts)


class Published(BaseModel):
    """The mark that a release of `version` was published (owner: its engine), created once after the result was."""
    model_config = ConfigDict(extra="forbid", strict=True)
    version: int = Version
    owner: str = Field(pattern=r"^[0-9a-f]{64}$")
    published: str


class Since(BaseModel):
    """The first version whose publication is marked. Any run may create it (the first one's stays): one owner."""
    model_config = ConfigDict(extra="forbid", strict=True)
    owner: Literal["ledger"] = "ledger"
    since: int = Version


SINCE = "since.json"


class LedgerError(StageError):
    """The versions released so far cannot be read: nothing is released."""

    def __init__(self, where: Path | str, why: str):
        super().__init__(f"release: {where}: unreadable release ledger ({why}); nothing was released, so that no "
                         f"version is given to two engines",
                         hint="restore the file from the store's other machines or a backup; remove it only if "
                              "that version was never deployed")


class Ledger(BaseModel):
    releases: list[Released] = []
    since: int | None = None  # the first version whose publication is marked (None: no version's is)
    published: dict[int, str] = {}  # the marked versions: version -> the engine its mark names

    def latest(self) -> Released | None:
        """The latest version claimed, published or not: the next version counts from it."""
        return max(self.releases, key=lambda r: r.version) if self.releases else None

    def was_published(self, release: Released) -> bool:
        """Whether a release of this version was published: its mark names its engine, or it is older than the
        marks."""
        if self.since is None or release.version < self.since:
            return True
        return self.published.get(release.version) == release.owner

    def last_published(self) -> Released | None:
        """The latest version whose release was published: the one clients know, and the contract's baseline."""
        return max((r for r in self.releases if self.was_published(r)), key=lambda r: r.version, default=None)

    def owners(self) -> dict[str, int]:
        """Engine digest -> the last published version that shipped it."""
        return {r.owner: r.version for r in sorted(self.releases, key=lambda r: r.version) if self.was_published(r)}

    def version_for(self, engine_digest: str, contract_changed: bool = False) -> tuple[int, bool]:
        """(the version to ship this engine as, whether it is new: no release of it was published before): the
        latest version if it holds this engine and the serving contract it was claimed with did not change (new
        where the run that claimed it died before publishing it), else one more than the latest (an engine
        released long ago comes back as a new version: a lower one would not be served; a config that changes
        what clients may send is a new version too)."""
        if not self.releases:
            return 1, True
        latest = self.latest()
        assert latest is not None
        if latest.owner == engine_digest and not contract_changed:
            return latest.version, not self.was_published(latest)
        if latest.version >= MAX_VERSION:
            raise StageError(f"release: version {latest.version} is the largest Triton takes: no next version",
                             hint="release under a new triton.model_name")
        return latest.version + 1, True


def folder(model: str, target: str) -> str:
    """The ledger's directory, relative to the store's `shared/` (both names are checked names)."""
    return RELEASES.path(model, target)


def marks(model: str, target: str) -> str:
    """The directory of its publication marks (a target's name has no dot: no target's folder is named so)."""
    return f"{folder(model, target)}.published"


def read(shared: Path, model: str, target: str) -> Ledger:
    """Every version released of `model` for `target`, and which were published; LedgerError when any record
    cannot be read."""
    rel = folder(model, target)
    found = _legacy(shared, f"{rel}.json")
    for path, version in _records(shared, rel):
        found.append(_entry(Released, path, version))
    ledger = Ledger(releases=found)
    for path, version in _records(shared, marks(model, target), also=SINCE):
        if version is None:
            ledger.since = _entry(Since, path, None).since
        else:
            ledger.published[version] = _entry(Published, path, version).owner
    return ledger


def _records(shared: Path, rel: str, also: str = "") -> list[tuple[Path, int | None]]:
    """The records of directory `rel` with the version each one's name says (None: `also`)."""
    try:
        directory = paths.under(shared, f"{rel}/record").parent  # no symlink on the way to it
    except paths.OutsidePath as exc:
        raise LedgerError(shared / rel, str(exc)) from None
    if directory.is_symlink():
        raise LedgerError(directory, "a symlink where the ledger's directory belongs")
    try:
        names = sorted(os.listdir(directory)) if directory.is_dir() else []
    except OSError as exc:
        raise LedgerError(directory, exc.strerror or str(exc)) from None
    found: list[tuple[Path, int | None]] = []
    for name in names:
        if name.startswith("."):  # a record being written
            continue
        m = RECORD.fullmatch(name)
        if m is None and name != also:
            raise LedgerError(directory / name, "not a version's record: <positive number>.json")
        found.append((directory / name, int(m.group(1)) if m else None))
    return found


def _entry(model: type[_M], path: Path, version: int | None) -> _M:
    try:
        entry = model.model_validate(files.read_json(path, CLAIM_BYTES, follow=False))
    except (OSError, ValueError) as exc:  # (pydantic's ValidationError is a ValueError)
        raise LedgerError(path, _why(exc)) from None
    said = getattr(entry, "version", None)
    if version is not None and said != version:
        raise LedgerError(path, f"it says version {said}")
    return entry


def _why(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return first_problem(exc)
    return (str(exc).splitlines() or [type(exc).__name__])[0] or type(exc).__name__


def _legacy(shared: Path, rel: str) -> list[Released]:
    """The one-file ledger of stores written before records per version."""
    try:
        path = paths.under(shared, rel)
    except paths.OutsidePath as exc:
        raise LedgerError(shared / rel, str(exc)) from None
    if not path.exists() and not path.is_symlink():
        return []
    try:
        data = files.read_json(path, CLAIM_BYTES, follow=False)
        entries = data["releases"]
        return [Released(version=e["version"], owner=e["engine"], candidate=e["candidate"], created=e["created"])
                for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LedgerError(path, _why(exc)) from None


def claim(model: str, target: str, version: int, engine_digest: str, candidate: str,
          contract: Contract | None = None) -> Claim:
    return _record(f"{folder(model, target)}/{version}.json", Released(version=version, owner=engine_digest,
                                                                       candidate=candidate, contract=contract,
                                                                       created=_now()))


def records(ledger: Ledger, model: str, target: str, version: int, engine_digest: str, candidate: str,
            contract: Contract | None) -> tuple[list[Claim], list[Claim]]:
    """What releasing a new `version` creates in the store's shared/: before the result is published, its record
    (after the ledger's `since.json`, where it has none yet); after, the mark that it was published."""
    before = [] if ledger.since is not None else [_record(f"{marks(model, target)}/{SINCE}", Since(since=version))]
    mark = Published(version=version, owner=engine_digest, published=_now())
    return (before + [claim(model, target, version, engine_digest, candidate, contract)],
            [_record(f"{marks(model, target)}/{version}.json", mark)])


def _record(path: str, record: Released | Published | Since) -> Claim:
    return Claim(path=path, data=(record.model_dump_json(indent=2) + "\n").encode(), owner=record.owner)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class _Record(BaseModel):
    # every field is written, so a field renamed on one side is missing on the other: an error, not a silent null;
    # what a later stage version adds survives
    model_config = ConfigDict(extra="allow")


class Release(_Record):
    """A version a release stage shipped for one target (`new`: no release of it was published before).
    `contract_changes`: what clients of `previous_version` (the latest one published before it) find different."""
    model: str
    target: str
    version: int
    new: bool
    engine: str
    engine_sha256: str
    repository: str
    previous_version: int | None
    contract_changes: list[str]
    rolls_back_to: int | None  # the earlier version whose engine this one ships again (select.rollback)


class Held(_Record):
    """A target whose previous version stays the one served, the variant it shipped left out."""
    model: str
    target: str
    version: int
    engine: str | None
    why: str


class RecordError(StageError):
    """A release result's record of its versions does not read: nothing is announced or reused from it."""

    def __init__(self, why: str):
        super().__init__(f"release: the result's record of the versions it released does not read ({why})",
                         hint="run the release stage again with --force (the record was written by another "
                              "trtflow, or the store's copy was changed)")


class Versions(BaseModel):
    """The one record of what a release result made or kept, per target (its metrics' `versions`): what the flow
    announces (EVENTS), what a reuse is checked against (OUTDATED), the decisions the command line prints."""
    model_config = ConfigDict(extra="forbid")

    released: list[Release] = []
    held: list[Held] = []

    @classmethod
    def of(cls, metrics: dict) -> Versions:
        """The record in a release result's metrics; a result without one, or with one that does not read, is an
        error naming the field."""
        try:
            return cls.model_validate(metrics["versions"])
        except KeyError:
            raise RecordError("no 'versions'") from None
        except ValidationError as exc:
            raise RecordError(first_problem(exc, "versions")) from None

    def metrics(self) -> dict:
        return {"versions": self.model_dump(mode="json")}

    def decisions(self) -> list[Decision]:
        """Per target: the version released, or the previous version held."""
        return ([Decision(action="released", subject=r.target, model=r.model, version=r.version, engine=r.engine)
                 for r in self.released]
                + [Decision(action="held", subject=h.target, model=h.model, version=h.version, engine=h.engine,
                            why=h.why) for h in self.held])


RELEASE_EVENT = "trtflow.release.created"


def announce(ran: StageRan) -> list[Event]:
    """The release kind's events: one per new version a release stage published (a version published before makes
    none): what a deployment that rolls engines out to Triton acts on."""
    return [Event(RELEASE_EVENT, f"trtflow.release.{ran.pipeline.parent.name}.{ran.stage}.{r.target}",
                  {"trtflow.pipeline": str(ran.pipeline), "trtflow.stage": ran.stage, "trtflow.model": r.model,
                   "trtflow.target": r.target},
                  {"version": r.version, "engine": r.engine, "engine_sha256": r.engine_sha256,
                   "repository": str(ran.directory / r.repository), "card": str(ran.directory / "card"),
                   "key": ran.key, "previous_version": r.previous_version, "contract_changes": r.contract_changes,
                   "rolls_back_to": r.rolls_back_to},
                  version=r.version, say=f"released {r.model} version {r.version} for {r.target}" + (
                      f", rolling back to version {r.rolls_back_to}'s engine" if r.rolls_back_to else ""))
            for r in Versions.of(ran.metrics).released if r.new]


def outdated(metrics: dict, shared: Path) -> str | None:
    """The release kind's check of a result about to be reused: why it is no longer current, or None. A result
    presents the versions it released or kept; where a later version of the same model and target was published
    since (by another configuration of the pipeline), reusing it would present an older version as current: the
    stage runs again, and the release decides (select.rollback)."""
    record = Versions.of(metrics)
    shown = [(r.model, r.target, r.version) for r in [*record.released, *record.held]]
    for model, target, version in shown:
        try:
            latest = read(shared, model, target).last_published()
        except StageError as exc:
            return str(exc)
        if latest is not None and latest.version > version:
            return (f"version {latest.version} of '{model}' for target '{target}' was released since this result "
                    f"(version {version})")
    return None
