"""The records a run hands back are read through their models: a result's verdict from its manifest's metrics, the
flow's result per stage from the JSON it returns (as older flow runs stored it, too)."""
from __future__ import annotations

from pathlib import Path

from trtflow.flows.cli.run import _say_verdict
from trtflow.flows.manifest import Manifest
from trtflow.flows.results import StageReport, Verdict
from trtflow.flows.runner import StageOutcome

HELD = {"model": "cls", "target": "native", "version": 1, "engine": "fp16.b4.native",
        "why": "optional variant 'fp16', which this run left out"}
RELEASED = {"model": "cls", "target": "tiny", "version": 3, "new": True, "engine": "fp32.b1.tiny",
            "engine_sha256": "ab" * 32, "repository": "triton/tiny"}


def _manifest(kind: str, metrics: dict) -> Manifest:
    return Manifest.model_validate({"key": "k" * 32, "status": "ok", "kind": kind, "metrics": metrics, "outputs": {
        "engines": {"path": "engines", "type": "engines", "digest": "d"}, "report": {"path": "r.json", "digest": "e"}}})


def test_a_release_results_verdict_and_the_flow_result_round_trip_through_json(capsys):
    manifest = _manifest("release", {"releases": [RELEASED], "held": [HELD]})
    verdict = Verdict.of(manifest)
    assert [(h.target, h.version) for h in verdict.held] == [("native", 1)] and verdict.releases[0].new
    outcome = StageOutcome("release", "release", manifest.key, "ran", Path("/store/release/k"), manifest, "never run",
                           1.23456, 0.5)
    sent = StageReport.of_outcome(outcome).model_dump(mode="json")
    assert sent["held"] == [HELD] and sent["releases"] == [RELEASED] and sent["seconds"] == 1.235
    assert sent["engines"] == ["/store/release/k/engines"]
    back = StageReport.model_validate(sent)
    _say_verdict(back.stage, back)
    assert "kept version 1 of cls for target native (release): optional variant 'fp16'" in capsys.readouterr().out
    # another kind's metrics of the same names are not a release's verdict
    assert Verdict.of(_manifest("validate", {"held": [HELD], "excluded": {"int8": "misreads"}})).held == []


def test_a_flow_result_stored_by_an_earlier_trtflow_is_read():
    stored = {"stage": "check", "status": "reused", "key": "k" * 32, "directory": "/s/check/k", "seconds": 0.1,
              "work_seconds": 0.0, "reason": "nothing changed", "engines": [], "shipped": ["fp32.b1"],
              "not_shipped": ["fp16.b1"], "excluded": {"int8": "misreads"}, "left_out": ["int8.b1"],
              "releases": [], "held": []}
    report = StageReport.model_validate(stored)
    assert report.model_dump(mode="json") == stored
