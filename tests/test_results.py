"""The records a run hands back are read through their models: a result's verdict from its manifest's metrics, the
flow's result per stage from the JSON it returns (as older flow runs stored it, too)."""
from __future__ import annotations

from pathlib import Path

from trtflow.flows.cli.run import _say_verdict
from trtflow.flows.manifest import Manifest
from trtflow.flows.results import StageReport, Verdict
from trtflow.flows.runner import StageOutcome

HELD = {"action": "held", "subject": "native", "model": "cls", "version": 1, "engine": "fp16.b4.native",
        "why": "optional variant 'fp16', which this run left out"}
RELEASED = {"action": "released", "subject": "tiny", "model": "cls", "version": 3, "engine": "fp32.b1.tiny", "why": ""}


def _manifest(kind: str, metrics: dict, decisions: list | None = None) -> Manifest:
    return Manifest.model_validate({"key": "k" * 32, "status": "ok", "kind": kind, "metrics": metrics,
                                    "decisions": decisions or [], "outputs": {
        "engines": {"path": "engines", "type": "engines", "digest": "d"}, "report": {"path": "r.json", "digest": "e"}}})


def test_a_results_decisions_and_the_flow_result_round_trip_through_json(capsys):
    """The flow layer reads what a stage decided as typed decisions, whichever kind made them (issue #52): no
    field of its own per kind, and a kind's metrics are its own."""
    manifest = _manifest("release", {"releases": [{"version": 3}]}, [RELEASED, HELD])
    verdict = Verdict.of(manifest)
    assert [(d.action, d.subject, d.version) for d in verdict.decisions] == [("released", "tiny", 3),
                                                                           ("held", "native", 1)]
    outcome = StageOutcome("release", "release", manifest.key, "ran", Path("/store/release/k"), manifest, "never run",
                           1.23456, 0.5)
    sent = StageReport.of_outcome(outcome).model_dump(mode="json")
    assert sent["decisions"] == [RELEASED, HELD] and sent["seconds"] == 1.235
    assert sent["engines"] == ["/store/release/k/engines"]
    back = StageReport.model_validate(sent)
    _say_verdict(back.stage, back)
    assert "kept version 1 of cls for target native (release): optional variant 'fp16'" in capsys.readouterr().out
    assert Verdict.of(_manifest("validate", {"held": [HELD], "excluded": {"int8": "misreads"}})).decisions == []


def test_a_flow_result_stored_by_an_earlier_trtflow_is_read():
    stored = {"stage": "check", "status": "reused", "key": "k" * 32, "directory": "/s/check/k", "seconds": 0.1,
              "work_seconds": 0.0, "reason": "nothing changed", "engines": [], "shipped": ["fp32.b1"],
              "not_shipped": ["fp16.b1"], "excluded": {"int8": "misreads"}, "left_out": ["int8.b1"],
              "releases": [], "held": []}
    report = StageReport.model_validate(stored)
    # (announced events and decisions came later; the fields it had are kept as they were)
    assert report.model_dump(mode="json") == {**stored, "announced": [], "decisions": []}


# a manifest and two last.json records as trtflow wrote them before these were models (field for field)
OLD_MANIFEST = {
    "key": "0123456789abcdef" * 2, "status": "ok", "stage": "b", "kind": "tests.stage_fns:count_bytes",
    "key_parts": {"format": 2, "kind": "tests.stage_fns:count_bytes", "version": "1+abc", "params": {},
                  "inputs": {"model": "ab" * 32, "images": ["cd" * 32, "ef" * 32]}, "env": None},
    "pipeline": {"name": "p", "file": "/repo/pipeline.yaml"},
    "inputs": {"model": {"path": "/repo/.trtflow/a/" + "1" * 32 + "/model.onnx", "type": "onnx", "digest": "ab" * 32},
               "images": [{"path": "/repo/data/1.png", "type": "file", "digest": "cd" * 32},
                          {"path": "/repo/data/2.png", "type": "file", "digest": "ef" * 32}]},
    "outputs": {"report": {"path": "report.json", "type": "json", "digest": "12" * 32, "size": 18}},
    "metrics": {"bytes": 585535}, "warnings": [], "timings": {"started": "2026-01-01T00:00:00+00:00",
                                                             "work_seconds": 0.01},
    "environment": {"python": "3.11.7", "platform": "Linux", "fingerprint": None},
    "files": {"report.json": {"size": 18, "sha256": "12" * 32, "mtime_ns": 1, "ctime_ns": 2},
              "summary.md": {"size": 0, "sha256": "e3" * 32, "mtime_ns": 3, "ctime_ns": 4}},
}
OLD_LAST_FAILED = {"key": "0123456789abcdef" * 2, "parts": {**OLD_MANIFEST["key_parts"], "code": {"m:f": "0a" * 8}},
                   "params": {"tag": "one", "seconds": None}, "status": "failed", "error": "b: planted failure"}
OLD_LAST_BEFORE_PARAMS = {"key": "f" * 32, "parts": {"format": 1, "kind": "prepare", "version": "1",
                                                     "params": {"simplify": True}, "inputs": {}, "env": {"cpu": "x"}}}


def test_stored_manifests_and_last_records_of_earlier_versions_read_and_write_back_unchanged():
    from trtflow.flows.keys import LastRun

    manifest = Manifest.parse(OLD_MANIFEST, OLD_MANIFEST["key"])
    assert manifest is not None and manifest.files["summary.md"].ctime_ns == 4
    assert manifest.inputs["images"][1].digest == "ef" * 32 and manifest.key_parts.env is None
    assert manifest.to_json() == OLD_MANIFEST
    for record in (OLD_LAST_FAILED, OLD_LAST_BEFORE_PARAMS):
        last = LastRun.parse(record)
        assert last is not None and last.to_json() == record
    assert LastRun.parse(OLD_LAST_FAILED).error == "b: planted failure"
    assert LastRun.parse(OLD_LAST_BEFORE_PARAMS).params is None  # `plan` falls back to the key's parameters
    assert LastRun.parse({"parts": {}}) is None and LastRun.parse(["key"]) is None


def test_a_claimed_record_is_another_runs_unless_it_names_the_claims_owner():
    from trtflow.artifact import Claim

    claim = Claim(path="releases/m/native/1.json", data=b'{"owner": "' + b"a" * 64 + b'"}', owner="a" * 64)
    assert not claim.held_by_another(claim.data)
    assert not claim.held_by_another(b'{"version": 1, "owner": "' + b"a" * 64 + b'", "candidate": "x"}')
    for theirs in (b'{"owner": "' + b"b" * 64 + b'"}', b"{}", b'["owner"]', b"not json", b"\xff"):
        assert claim.held_by_another(theirs), theirs
