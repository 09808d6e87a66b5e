"""Issue #70 Build 3: a released version is one typed record (`versions.Versions`, the release result's metrics'
`versions`), which the events, the reuse check and the decisions the command line prints all read; a record that
does not read is an error naming the field, never a silent empty list (an event deployments roll out on, lost)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtflow.errors import StageError
from trtflow.events import StageRan
from trtflow.flows.implementation import resolve
from trtflow.pipelines.params.release import ReleaseStage
from trtflow.stages.release.triton.versions import RELEASE_EVENT, RecordError, Versions

# a release result's record as this trtflow writes it (stages/release/stage.py `_versions`): renaming a field on
# either side makes this stored record unreadable, and this test fail, before any event goes missing
STORED = json.loads("""{"versions": {
  "released": [{"model": "cls", "target": "native", "version": 3, "new": true, "engine": "fp16.b4.native",
                "engine_sha256": "ab", "repository": "triton", "previous_version": 2,
                "contract_changes": ["max_batch_size 32 -> 16"], "rolls_back_to": null}],
  "held": [{"model": "cls", "target": "sm86", "version": 1, "engine": "int8.b4.sm86", "why": "optional variant lost"}]
}}""")


def _ran(metrics: dict, tmp_path: Path) -> StageRan:
    return StageRan(tmp_path / "pipeline.yaml", "release", "k" * 32, tmp_path / "out", metrics)


def test_the_stored_record_reads_into_the_event_the_decisions_and_the_reuse_check(tmp_path):
    code = resolve(ReleaseStage(kind="release"))  # what the flow calls: the kind's CODE
    (event,) = code.events(_ran(STORED, tmp_path))
    assert event.event == RELEASE_EVENT and event.version == 3
    assert event.payload["engine_sha256"] == "ab" and event.payload["previous_version"] == 2
    assert event.payload["contract_changes"] == ["max_batch_size 32 -> 16"]
    assert event.payload["repository"] == str(tmp_path / "out" / "triton")
    decisions = Versions.of(STORED).decisions()
    assert [(d.action, d.subject, d.version, d.engine) for d in decisions] == [
        ("released", "native", 3, "fp16.b4.native"), ("held", "sm86", 1, "int8.b4.sm86")]
    assert code.outdated(STORED, tmp_path / "shared") is None  # no later version in an empty ledger
    assert Versions.of(STORED).metrics() == STORED  # written back as it was read


def _renamed(record: dict, kind: str, old: str, new: str) -> dict:
    entry = dict(record["versions"][kind][0])
    entry[new] = entry.pop(old)
    return {"versions": {**record["versions"], kind: [entry]}}


@pytest.mark.parametrize(("metrics", "named"), [
    (_renamed(STORED, "released", "engine_sha256", "sha256"), r"versions.released.0.engine_sha256: Field required"),
    (_renamed(STORED, "released", "rolls_back_to", "rollback_of"), r"released.0.rolls_back_to: Field required"),
    (_renamed(STORED, "held", "why", "reason"), r"held.0.why: Field required"),
    ({"versions": {**STORED["versions"], "released": [{**STORED["versions"]["released"][0], "version": "three"}]}},
     r"released.0.version: Input should be a valid integer"),
    ({"versions": {"releases": []}}, r"versions.releases: Extra inputs are not permitted"),
    ({"releases": STORED["versions"]["released"]}, r"no 'versions'"),  # the record of an older trtflow
])
def test_a_record_that_does_not_read_fails_the_release_stage_that_reads_it(tmp_path, metrics, named):
    """The events after the stage ran and the check before its result is reused are the release stage's own: each
    raises a StageError naming the field (the flow fails that stage with the line), none returns nothing."""
    code = resolve(ReleaseStage(kind="release"))
    for read in (lambda: code.events(_ran(metrics, tmp_path)), lambda: code.outdated(metrics, tmp_path / "shared")):
        with pytest.raises(RecordError, match=named) as caught:
            read()
        assert isinstance(caught.value, StageError)
        assert "run the release stage again with --force" in caught.value.failure.line()
