"""The runner and the artifact store, without Prefect: keys, reuse, staleness reasons, atomic publishing."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import stage_fns
from trtflow.errors import StageError
from trtflow.flows import keys
from trtflow.flows.runner import Runner
from trtflow.flows.store import LocalStore, StoreError
from trtflow.pipelines.loader import load_pipeline

PIPE = """
version: 1
name: chain
model: models/cls.onnx
stages:
  a: {kind: "tests.stage_fns:copy_model", outputs: {model: onnx}, inputs: {model: source}, params: {tag: one}}
  b: {kind: "tests.stage_fns:copy_model", outputs: {model: onnx}, inputs: {model: a}}
  c: {kind: "tests.stage_fns:count_bytes", outputs: {report: json}, inputs: {model: b}}
  side: {kind: "tests.stage_fns:count_bytes", outputs: {report: json}, inputs: {model: source}}
"""


def run_all(path: Path, overrides=None, force=None, stages=None) -> dict[str, str]:
    runner = Runner(load_pipeline(path, overrides))
    runner.store.ensure_writable()
    produced, statuses = {}, {}
    for name in runner.select(stages):
        outcome = runner.run_stage(name, produced, force)
        produced[name] = outcome.manifest
        statuses[name] = outcome.status
    return statuses


def plan_of(path: Path, overrides=None, force=None) -> dict[str, tuple[str, str]]:
    return {i.name: (i.action, i.reason) for i in Runner(load_pipeline(path, overrides)).plan(force=force)}


def test_second_run_reuses_everything(write_yaml):
    path = write_yaml(PIPE)
    assert plan_of(path) == {"a": ("run", "never run"), "b": ("run", "upstream a will run"),
                             "c": ("run", "upstream b will run"), "side": ("run", "never run")}
    stage_fns.CALLS.clear()
    assert set(run_all(path).values()) == {"ran"}
    assert len(stage_fns.CALLS) == 4
    stage_fns.CALLS.clear()
    assert set(run_all(path).values()) == {"reused"}
    assert stage_fns.CALLS == []
    assert {k: v[0] for k, v in plan_of(path).items()} == dict.fromkeys("abc", "reuse") | {"side": "reuse"}


def test_a_change_from_a_default_is_explained_with_the_default(write_yaml):
    """Defaults stay out of the key (flows/keys.py), but `plan` still says what the value was."""
    path = write_yaml(PIPE)
    run_all(path)
    action, reason = plan_of(path, ['stages.a.version="2"'])["a"]
    assert action == "run" and reason.endswith('params changed: version "1" -> "2"'), reason


def test_param_change_reruns_stage_and_dependents_only(write_yaml):
    path = write_yaml(PIPE)
    run_all(path)
    plan = plan_of(path, ["stages.a.params.tag=two"])
    assert plan["a"] == ("run", 'params changed: params.tag "one" -> "two"')
    assert plan["b"][0] == "run" and plan["c"][0] == "run" and plan["side"][0] == "reuse"
    assert run_all(path, ["stages.a.params.tag=two"]) == {"a": "ran", "b": "ran", "c": "ran", "side": "reused"}
    # going back to the old value finds the old results: the store is content-addressed
    assert set(run_all(path).values()) == {"reused"}


def test_a_changed_list_item_is_named_by_its_key_path(write_yaml):
    """Issue #39: a changed `deploy:` item printed both whole lists (about 4 KB on one line); now the key path
    of each changed leaf, its values cut short, at most keys.SHOWN_CHANGES of them."""
    steps = [{"read": "rgb"}, {"resize": {"size": 224, "interpolation": "bilinear"}}, {"scale": 1 / 255},
             {"normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}] + \
        [{"note": "x" * 200}] * 20

    def pipe(deploy: list) -> str:
        return PIPE.replace("params: {tag: one}", f"params: {{tag: one, deploy: {json.dumps(deploy)}}}")

    path = write_yaml(pipe(steps))
    run_all(path)
    bigger = json.loads(json.dumps(steps))
    bigger[1]["resize"]["size"] = 256
    write_yaml(pipe(bigger))
    assert plan_of(path)["a"] == ("run", "params changed: params.deploy[1].resize.size 224 -> 256")
    longer = json.loads(json.dumps(steps))
    longer[0] = {"read": "bgr", "note": "y" * 200}
    longer += [{"pad": {"size": [48, 192]}}]
    write_yaml(pipe(longer + [{"note": str(i)} for i in range(10)]))
    _, reason = plan_of(path)["a"]
    cut = '"' + "y" * 58 + "…"
    assert reason.startswith(f"params changed: params.deploy[0].note (absent) -> {cut}, "
                             'params.deploy[0].read "rgb" -> "bgr", params.deploy[24] inserted '
                             '({"pad": {"size": [48, 192]}}), params.deploy[25] inserted ({"note": "0"}), '), reason
    assert reason.endswith(", and 5 more") and len(reason) < 600, reason
    # issue #51: deleting one step showed as five changes (every later step compared with its neighbour)
    write_yaml(pipe(steps[:1] + steps[2:]))
    assert plan_of(path)["a"] == ("run", 'params changed: params.deploy[1] removed '
                                         '({"resize": {"interpolation": "bilinear", "size": 224}})')
    write_yaml(pipe(steps[:2] + [{"center_crop": 224}] + steps[2:]))
    assert plan_of(path)["a"] == ("run", 'params changed: params.deploy[2] inserted ({"center_crop": 224})')


def test_a_block_added_is_shown_as_written():
    """A tolerance block added by --set was shown with every unset option of its model as null."""
    added = keys.diff({"tolerances": {}}, {"tolerances": {"y": {"cosine": None, "iou": 0.99, "max_abs": None}}})
    assert added == ['tolerances.y (absent) -> {"iou": 0.99}']
    assert keys.diff({"a": 1}, {"a": 1, "b": None}) == []


def test_forced_rerun_with_identical_output_keeps_dependents(write_yaml):
    path = write_yaml(PIPE)
    run_all(path)
    assert plan_of(path, force=["a"])["a"] == ("run", "forced")
    assert run_all(path, force=["a"]) == {"a": "ran", "b": "reused", "c": "reused", "side": "reused"}


def test_changed_model_file_is_noticed(write_yaml, workdir):
    path = write_yaml(PIPE)
    run_all(path)
    with open(workdir / "models" / "cls.onnx", "ab") as f:
        f.write(b"\0")
    plan = plan_of(path)
    assert plan["a"] == ("run", "input 'model' changed") and plan["side"] == ("run", "input 'model' changed")


def test_editing_the_stage_function_invalidates(write_yaml, workdir, monkeypatch):
    mod = workdir / "userstage.py"
    mod.write_text("from trtflow import StageResult\n"
                   "def go(params, inputs, out_dir):\n"
                   "    (out_dir / 'r.json').write_text('1')\n"
                   "    return StageResult(outputs={'report': out_dir / 'r.json'})\n")
    monkeypatch.syspath_prepend(str(workdir))
    path = write_yaml("""
        version: 1
        name: user
        model: models/cls.onnx
        stages:
          mine: {kind: "userstage:go", outputs: {report: json}}
        """)
    assert run_all(path) == {"mine": "ran"}
    assert run_all(path) == {"mine": "reused"}
    import importlib
    import sys
    mod.write_text(mod.read_text().replace("write_text('1')", "write_text('2')"))
    importlib.reload(sys.modules["userstage"])
    assert "stage implementation changed" in plan_of(path)["mine"][1]


def test_failed_stage_publishes_nothing(write_yaml):
    path = write_yaml(PIPE.replace("tests.stage_fns:copy_model\", outputs: {model: onnx}, inputs: {model: a}",
                                   "tests.stage_fns:fail\", outputs: {model: onnx}, inputs: {model: a}"))
    with pytest.raises(StageError, match="planted failure"):
        run_all(path)
    store = load_pipeline(path).store_root
    assert [p.name for p in (store / "b").iterdir()] == ["last.json"], "no staging directory or result left behind"
    assert plan_of(path)["b"] == ("run", "its last run failed: b: planted failure")
    assert (store / "a" / "last.json").exists()


def test_crash_in_child_process_is_a_clear_error(write_yaml):
    path = write_yaml(PIPE.replace("tests.stage_fns:copy_model\", outputs: {model: onnx}, inputs: {model: a}",
                                   "tests.stage_fns:die\", timeout: 60, outputs: {model: onnx}, inputs: {model: a}"))
    with pytest.raises(StageError, match=r"stage 'b' crashed \(its process exited with code 17\)"):
        run_all(path)
    assert [p.name for p in (load_pipeline(path).store_root / "b").iterdir()] == ["last.json"]


def test_timeout_kills_the_stage(write_yaml):
    path = write_yaml("""
        version: 1
        name: slow
        model: models/cls.onnx
        stages:
          nap: {kind: "tests.stage_fns:sleep", timeout: 1s, params: {seconds: 60}}
        """)
    with pytest.raises(StageError, match=r"stage 'nap' timed out after 1 s"):
        run_all(path)


def test_missing_declared_output(write_yaml):
    path = write_yaml("""
        version: 1
        name: liar
        model: models/cls.onnx
        stages:
          x: {kind: "tests.stage_fns:no_outputs", outputs: {model: onnx}}
        """)
    with pytest.raises(StageError, match="did not produce its declared output"):
        run_all(path)


def test_half_written_result_is_never_a_cache_hit(write_yaml):
    path = write_yaml(PIPE)
    run_all(path)
    runner = Runner(load_pipeline(path))
    last = runner.store.last("a")
    directory = runner.store.path("a", last.key)
    # a run killed between writing outputs and the manifest: as if the manifest never got written
    (directory / "manifest.json").unlink()
    assert plan_of(path)["a"] == ("run", "its published result is missing or incomplete")
    assert run_all(path)["a"] == "ran"
    # a truncated output under a complete manifest is not trusted either
    model = directory / "model.onnx"
    model.write_bytes(model.read_bytes()[:10])
    assert plan_of(path)["a"][0] == "run"


def test_manifest_contents(write_yaml):
    path = write_yaml(PIPE)
    run_all(path)
    runner = Runner(load_pipeline(path))
    key = runner.store.last("b").key
    m = json.loads((runner.store.path("b", key) / "manifest.json").read_text())
    assert m["status"] == "ok" and m["key"] == key and m["stage"] == "b"
    out = m["outputs"]["model"]
    assert out["path"] == "model.onnx" and out["type"] == "onnx" and out["size"] > 500_000
    assert m["inputs"]["model"]["digest"] == json.loads(
        (runner.store.path("a", runner.store.last("a").key) / "manifest.json").read_text()
    )["outputs"]["model"]["digest"]
    assert m["key_parts"]["params"]["params"] == {}, "left at its default ({}): in the key with it"
    assert m["metrics"]["bytes"] == out["size"]
    assert (runner.store.path("b", key) / "summary.md").read_text().startswith("copied")


def test_unwritable_store(write_yaml, workdir):
    blocker = workdir / "not-a-dir"
    blocker.write_text("")
    store = LocalStore(blocker / "store")
    with pytest.raises(StoreError, match=r"cannot write the artifact store at .*not-a-dir/store"):
        store.ensure_writable()


def test_unknown_stage_selected(write_yaml):
    from trtflow.errors import SpecError
    runner = Runner(load_pipeline(write_yaml(PIPE)))
    with pytest.raises(SpecError, match=r"--stage bb: no such stage .*did you mean 'b'"):
        runner.select(["bb"])
    assert runner.select(["c"]) == ["a", "b", "c"]


def test_digest_cache_is_used(write_yaml, workdir):
    path = write_yaml(PIPE)
    run_all(path)
    cache = json.loads((workdir / ".trtflow" / "digests.json").read_text())
    assert str((workdir / "models" / "cls.onnx").resolve()) in cache
    assert os.path.getsize(workdir / ".trtflow" / "digests.json") < 10_000


@pytest.mark.parametrize("timeout", ["", ", timeout: 60"])
def test_failed_verdict_keeps_its_report_but_is_never_reused(write_yaml, timeout):
    path = write_yaml(f"""
        version: 1
        name: verdict
        model: models/cls.onnx
        stages:
          check: {{kind: "tests.stage_fns:verdict_fail", outputs: {{report: json}}{timeout}}}
        """)
    from trtflow.errors import StageFailed
    with pytest.raises(StageFailed, match=r"checked, and it is wrong \(details: .*summary.md\)") as info:
        run_all(path)
    failure = info.value.failure
    assert (failure.stage, failure.kind) == ("check", "tests.stage_fns:verdict_fail"), failure
    assert failure.cause.summary == "# why it failed", "the verdict carries its report's summary"
    directory = Path(failure.directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["status"] == "failed" and (directory / "summary.md").read_text() == "# why it failed"
    action, why = plan_of(path)["check"]
    assert action == "run" and why.startswith("its last run failed: check: checked, and it is wrong (details: ")
    with pytest.raises(StageFailed):
        run_all(path)


def test_the_store_in_a_model_repo_is_ignored_by_git(write_yaml, workdir):
    """`.trtflow/` sat in the model repo's `git status`: the store writes its own .gitignore when it is made."""
    import shutil
    import subprocess

    path = write_yaml(PIPE)
    run_all(path)
    store = workdir / ".trtflow"
    assert (store / ".gitignore").read_text().splitlines()[-1] == "*"
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(workdir)], check=True)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=workdir,
                                capture_output=True, text=True, check=True).stdout
        assert status and ".trtflow" not in status, status


def test_a_report_its_kinds_class_refuses_fails_the_stage_that_wrote_it(tmp_path):
    """Issue #52: reports pass between kinds as JSON; a built-in kind's report is checked against its class (its
    stage module's CODE, in the stage's own process) before it returns, so a bad one fails its own stage, not a
    later one, and the command never imports a stage module to check a report."""
    from trtflow.artifact import StageResult
    from trtflow.errors import StageError
    from trtflow.flows.implementation import _StageRun, stage_code
    from trtflow.stage_code import StageCode
    from trtflow.stages.benchmark.report import BenchmarkReport

    assert stage_code("trtflow.stages.benchmark.stage").report is BenchmarkReport
    (tmp_path / "report.json").write_text('{"cells": "not a list"}')
    wrote = StageCode(lambda *a: StageResult(outputs={"report": tmp_path / "report.json"}), report=BenchmarkReport)
    with pytest.raises(StageError, match=r"wrote a report its kind's BenchmarkReport refuses \(tool: Field required"):
        wrote(None, None, tmp_path)
    with pytest.raises(TypeError, match=r"trtflow.flows.runner has no CODE = StageCode\(run, ...\)"):
        _StageRun("trtflow.flows.runner")(None, None, tmp_path)  # a module without one is an error, not no check


def test_a_run_that_loses_a_claim_runs_again_and_gives_up_in_the_end(write_yaml, monkeypatch):
    """The runner's claim step on its own (issue #52): another run took a record this result needs (a release's
    version): the stage runs again from it, saying so; CLAIM_ATTEMPTS losses in a row are a transient error and
    nothing of theirs is published."""
    from trtflow.errors import TransientStageError
    from trtflow.flows import runner as runner_mod

    path = write_yaml("""
        version: 1
        name: claims
        model: models/cls.onnx
        stages:
          rec: {kind: "tests.stage_fns:claiming", outputs: {note: file}}
        """)
    lost = iter(["version 1 of 'm' was claimed by another run", None])
    monkeypatch.setattr(runner_mod, "claim_all", lambda store, claims: next(lost) if claims else None)
    stage_fns.CALLS.clear()
    runner = Runner(load_pipeline(path))
    runner.store.ensure_writable()
    said: list[str] = []
    outcome = runner.run_stage("rec", {}, log=said.append)
    assert outcome.status == "ran" and stage_fns.CALLS == ["claiming", "claiming"]
    assert said == ["version 1 of 'm' was claimed by another run: running 'rec' again"]
    monkeypatch.setattr(runner_mod, "claim_all", lambda store, claims: "taken" if claims else None)
    with pytest.raises(TransientStageError, match=rf"rec: {runner_mod.CLAIM_ATTEMPTS} runs in a row lost a record "
                                                  r"of the store's shared/ to other runs \(taken\) \(run again\)"):
        runner.run_stage("rec", {}, force=["rec"])
    assert stage_fns.CALLS == ["claiming"] * (2 + runner_mod.CLAIM_ATTEMPTS)
    assert runner.store.lookup("rec", outcome.key).manifest is not None  # the first result stands alone
