"""A failure is one value (issue #52): made where the fact is known with a typed cause, added to by the runner and
the schedule, and worded by one function — the console's line, the stage's Prefect artifact and its
`trtflow.stage.failed` event say the same words."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.test_layout import ROOT
from trtflow import markdown as md
from trtflow.errors import Crash, FailedVerdict, Failure, Refused, StageError, Timeout, Unexpected

PIPELINE = """
version: 1
name: failing
model: models/cls.onnx
stages:
  s: {kind: "tests.stage_fns:crash", outputs: {model: onnx}, params: {how: segfault}}
  after: {kind: "tests.stage_fns:copy_model", inputs: {model: s.model}, outputs: {model: onnx}}
"""


def test_each_cause_and_what_the_layers_add_make_one_line():
    crash = Failure(Crash("was killed by SIGSEGV", "about to crash"), stage="s", kind="k")
    assert crash.line() == "stage 's' crashed (its process was killed by SIGSEGV; its last output: about to crash)"
    assert Failure(Timeout(3.0), stage="s").line().startswith("stage 's' timed out after 3 s (raise 'timeout:'")
    assert Failure(Unexpected("ValueError", "bad"), stage="s").line() == \
        "stage 's' failed unexpectedly: ValueError: bad (run with --verbose for the traceback)"
    told = Failure(Refused("/tmp/stg/x.onnx is empty", "export it again"), stage="s",
                   moved=(("/tmp/stg", "(removed)"),), also_failed=("t",), not_run=("u", "v"))
    assert told.line() == ("s: (removed)/x.onnx is empty (export it again); also failed: t; "
                           "not run because of it: u, v")
    verdict = Failure(FailedVerdict("parity: 3 of 8 images differ", "# why"), stage="parity", directory="/store/p/k")
    assert verdict.line() == "parity: 3 of 8 images differ (details: /store/p/k/summary.md)"
    assert verdict.payload()["cause"] == "FailedVerdict" and "cause_summary" not in verdict.payload()


def test_an_error_is_its_failure_and_telling_it_never_edits_its_message():
    error = StageError("the model has no inputs", hint="export it with its inputs")
    assert error.args == ("the model has no inputs",) and error.failure.cause == \
        Refused("the model has no inputs", "export it with its inputs")
    error.tell(stage="prepare", kind="prepare", not_run=("build",))
    assert str(error) == ("prepare: the model has no inputs (export it with its inputs); not run because of it: "
                          "build")
    assert error.args == ("the model has no inputs",) and error.failure.kind == "prepare"


def _artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                               sort=ArtifactSort.CREATED_DESC, limit=1)
    return asyncio.run(read())


@pytest.mark.slow
def test_a_crash_says_one_line_on_the_console_in_its_artifact_and_in_its_event(workdir, prefect_api):
    from trtflow.flows.pipeline_flow import FAILED_EVENT, artifact_key
    from trtflow.flows.runner import make_runner

    (workdir / "pipeline.yaml").write_text(PIPELINE.lstrip())
    done = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "run", "pipeline.yaml"], cwd=workdir,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    line = lines[0].removeprefix("error: ")
    assert line == ("stage 's' crashed (its process was killed by SIGSEGV; its last output: about to crash); "
                    "not run because of it: after"), line

    (artifact,) = _artifact(artifact_key(make_runner(str(workdir / "pipeline.yaml"), [], None), "s"))
    # the artifact is written when the stage fails, before the schedule knows what else did not run
    stage_line = line.removesuffix("; not run because of it: after")
    assert artifact.data == f"**failed** · stage {md.code('s')} ({md.text('tests.stage_fns:crash')}) · " \
                            f"{md.text(stage_line)}", artifact.data

    deadline, seen = time.monotonic() + 30, []
    while time.monotonic() < deadline and not seen:
        answer = httpx.post(f"{prefect_api}/events/filter", timeout=10, json={
            "filter": {"event": {"name": [FAILED_EVENT]}, "resource": {"id": [f"trtflow.stage.{workdir.name}.s"]}},
            "limit": 5})
        answer.raise_for_status()
        seen = [e["payload"] for e in answer.json()["events"]]
        time.sleep(0.5)
    (payload,) = seen
    assert payload["line"] == stage_line
    assert (payload["cause"], payload["cause_ending"], payload["stage"], payload["kind"]) == \
        ("Crash", "was killed by SIGSEGV", "s", "tests.stage_fns:crash"), payload
