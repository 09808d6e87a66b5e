"""The CLI's contract for bad input: one line on stderr, a non-zero exit code, no traceback, nothing written."""
from __future__ import annotations

import json

import pytest

from trtflow.flows import cli


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("error: ")
    return lines[0]


BAD = {
    "yaml syntax": ("stages: {prepare: {kind: prepare}\n", "YAML syntax error"),
    "unknown key": ("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n  p: {kind: prepare, opset: 17}\n",
                    "unknown key 'opset'"),
    "wrong type": ("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n  p: {kind: prepare, simplify: maybe}\n",
                   "stages.p.simplify: Input should be a valid boolean"),
    "missing model": ("version: 1\nname: x\nmodel: models/gone.onnx\nstages:\n  p: {kind: prepare}\n",
                      "model file 'models/gone.onnx' not found"),
    "unknown kind": ("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n  p: {kind: prep}\n",
                     "unknown stage kind 'prep'"),
    "missing reference": ("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n"
                          "  p: {kind: prepare, inputs: {model: nothere}}\n",
                          "reference to a stage that does not exist: 'nothere'"),
    "cycle": ("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n"
              "  a: {kind: 'm:f', outputs: {model: onnx}, inputs: {model: b}}\n"
              "  b: {kind: 'm:f', outputs: {model: onnx}, inputs: {model: a}}\n",
              "the stages form a cycle"),
}


@pytest.mark.parametrize("command", ["validate", "plan", "run"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_pipeline_is_one_line(capsys, write_yaml, workdir, case, command):
    body, expected = BAD[case]
    path = write_yaml(body)
    code, out, err = run_cli(capsys, command, str(path))
    assert code == 2
    line = one_error_line(err)
    assert expected in line and str(path.name) in line
    assert not (workdir / ".trtflow").exists(), "a failed validation must not create the store"


def test_verbose_shows_traceback(capsys, write_yaml):
    path = write_yaml(BAD["unknown key"][0])
    code, out, err = run_cli(capsys, "validate", str(path), "--verbose")
    assert code == 2 and "Traceback" in err and "unknown key 'opset'" in err


def test_unwritable_store_is_one_line(capsys, write_yaml, workdir):
    path = write_yaml("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n  p: {kind: prepare}\n")
    (workdir / "blocker").write_text("")
    code, out, err = run_cli(capsys, "run", str(path), "--store", str(workdir / "blocker" / "store"))
    assert code == 2
    assert "cannot write the artifact store" in one_error_line(err)


def test_bad_set_and_unknown_stage(capsys, write_yaml):
    path = write_yaml("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n  p: {kind: prepare}\n")
    code, _, err = run_cli(capsys, "plan", str(path), "--set", "stages.p.target_opset=latest")
    assert code == 2 and "--set stages.p.target_opset:" in one_error_line(err)
    code, _, err = run_cli(capsys, "run", str(path), "--stage", "q")
    assert code == 2 and "--stage q: no such stage" in one_error_line(err)
    code, _, err = run_cli(capsys, "plan", str(path), "--force", "pp")
    assert code == 2 and "did you mean 'p'" in one_error_line(err)


def test_validate_and_schema(capsys, write_yaml, tmp_path):
    path = write_yaml("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n  p: {kind: prepare}\n"
                      "  b: {kind: build}\n")
    code, out, err = run_cli(capsys, "validate", str(path))
    assert code == 0 and "is valid" in out and "models <- p.model" in out
    code, out, _ = run_cli(capsys, "schema")
    assert code == 0 and json.loads(out)["title"] == "trtflow pipeline"


def test_plan_covers_every_kind(capsys, write_yaml):
    path = write_yaml("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n  p: {kind: prepare, preflight: off}\n"
                      "  e: {kind: build}\n  b: {kind: benchmark}\n")
    code, out, _ = run_cli(capsys, "plan", str(path))
    assert code == 0 and "never run" in out and "3 to run, 0 reused" in out


PREFECT_DOWN = {
    # the temporary server given no time to start: what a busy machine sees when Prefect's 20 s run out
    "temporary server": ({"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0"},
                         "Prefect's temporary server did not start within 0 s"),
    "PREFECT_API_URL": ({"PREFECT_API_URL": "http://127.0.0.1:9/api"},
                        "Failed to reach API at http://127.0.0.1:9/api/ (PREFECT_API_URL): start that server"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(PREFECT_DOWN))
def test_prefect_unreachable_is_one_line(write_yaml, workdir, case):
    import os
    import subprocess
    import sys

    path = write_yaml("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n  p: {kind: prepare}\n")
    env_vars, message = PREFECT_DOWN[case]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | env_vars
    env["PREFECT_HOME"] = str(workdir / ".prefect")
    proc = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "run", str(path)], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert message in one_error_line(proc.stderr)
    assert not (workdir / ".trtflow" / "p").exists() or not any((workdir / ".trtflow" / "p").iterdir())


@pytest.mark.tensorrt
def test_plan_check_and_json_for_schedulers(capsys, write_yaml, monkeypatch):
    """`plan --check` exits 3 when something would run and 0 when nothing would; `--json` names the environment
    fields that changed (here a TensorRT upgrade, simulated by the fingerprint: no second TensorRT installs here)."""
    from tests.test_runner import run_all
    from trtflow.flows import runner as runner_module
    from trtflow.stages.trt.records import TensorRT
    path = write_yaml("version: 1\nname: x\nmodel: models/cls.onnx\nstages:\n"
                      "  mine: {kind: 'tests.stage_fns:copy_model', outputs: {model: onnx}, env_dependent: true}\n")
    code, _, _ = run_cli(capsys, "plan", str(path), "--check")
    assert code == 3
    run_all(path)
    code, out, _ = run_cli(capsys, "plan", str(path), "--check", "--json")
    assert code == 0 and [s["action"] for s in json.loads(out)["stages"]] == ["reuse"]

    real = runner_module.fingerprint

    def upgraded(facets):
        env = real(facets)
        return env.model_copy(update={"tensorrt": TensorRT(flavour="tensorrt", version="99.0.0")}) if env else env
    monkeypatch.setattr(runner_module, "fingerprint", upgraded)
    code, out, _ = run_cli(capsys, "plan", str(path), "--check", "--json")
    (stage,) = json.loads(out)["stages"]
    assert code == 3 and stage["action"] == "run" and stage["reason"].startswith("environment changed: ")
    assert [c for c in stage["environment_changed"] if c.startswith("tensorrt.version ")] == [
        f"tensorrt.version {json.dumps(getattr(real(('tensorrt',)).tensorrt, 'version', None))} -> \"99.0.0\""]


def test_check_env_records_reports_and_keeps_an_unsent_change(capsys, tmp_path, monkeypatch):
    """First call records; the same environment is unchanged (exit 0); a changed one is reported field by field
    (exit 3). When the event cannot be sent (no Prefect server configured) the change is not recorded, so the next
    check reports it again."""
    from prefect.settings import PREFECT_API_URL

    state = tmp_path / "env.json"
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    # (and out of Prefect's settings context, which an earlier in-process `trtflow run` in this worker may hold)
    monkeypatch.setattr(PREFECT_API_URL, "value", lambda *a, **k: None)
    code, out, _ = run_cli(capsys, "check-env", "--state", str(state))
    assert code == 0 and "recorded this machine's environment" in out and state.is_file()
    code, out, _ = run_cli(capsys, "check-env", "--state", str(state), "--json")
    assert code == 0 and json.loads(out)["changed"] == []

    record = json.loads(state.read_text())
    record["fingerprint"]["platform"] = {"os": "Linux", "arch": "aarch64"}
    state.write_text(json.dumps(record))
    code, _, err = run_cli(capsys, "check-env", "--state", str(state))
    assert code == 1 and "PREFECT_API_URL is not set" in err and "Traceback" not in err
    assert json.loads(state.read_text()) == record, "nothing recorded: the change is reported again next time"
    code, out, _ = run_cli(capsys, "check-env", "--state", str(state), "--no-event")
    assert code == 3 and 'platform.arch "aarch64" -> ' in out
    code, _, _ = run_cli(capsys, "check-env", "--state", str(state), "--no-event")
    assert code == 0, "recorded by the previous call"


def test_init_deploy_labels_the_deployment_as_check_env_labels_its_events(capsys, tmp_path, monkeypatch):
    """The trigger matches the resource check-env's event names, for this machine: by construction, from the same
    function (the shipped trigger matched `a100` while check-env sent `nvidia-a100-sxm4-80gb`)."""
    import yaml

    from trtflow.flows import machine

    monkeypatch.setenv("TRTFLOW_MACHINE", "rig-3")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "init-deploy")
    target = tmp_path / "prefect-rig-3.yaml"
    assert code == 0 and target.is_file(), out
    (dep,) = yaml.safe_load(target.read_text())["deployments"]
    event = machine.check(tmp_path / "none.json").event()
    trigger = dep["triggers"][0]
    assert dep["entrypoint"] == "trtflow.flows.watch:watch_flow" and trigger["expect"] == [event["event"]]
    assert all(event["resource"][k] == v for k, v in trigger["match"].items()), (trigger, event)
    assert dep["work_pool"]["name"] == f"trtflow-{event['resource']['trtflow.gpu-kind']}"
    assert dep["work_pool"]["work_queue_name"] == "rig-3" and dep["parameters"]["machine"] == "rig-3"
    code, _, err = run_cli(capsys, "init-deploy")
    assert code == 2 and "exists" in err
    code, _, err = run_cli(capsys, "init-deploy", "--machine", "a b", "-o", "x.yaml")
    assert code == 2 and "--machine 'a b'" in err


# --- a pipeline file is code: what it runs is shown, and checked before anything is handed to it (issue #27) -----

def test_validate_and_plan_list_the_code_a_pipeline_runs(write_yaml, workdir, capsys):
    path = write_yaml(f"""
        version: 1
        name: code
        model: models/cls.onnx
        stages:
          mine: {{kind: "tests.stage_fns:copy_model", outputs: {{model: onnx}}}}
          build: {{kind: build, inputs: {{models: mine}}, profiles: {{p: {{x: {{min: [1, 3, 48, 192], opt: [1, 3, 48, 192], max: [1, 3, 48, 192]}}}}}}}}
          benchmark: {{kind: benchmark, trtexec: {workdir}/tools/trtexec}}
        """)
    assert cli.main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "runs this code besides trtflow's" in out
    assert "mine: tests.stage_fns:copy_model (a function of yours: the stage itself)" in out
    assert f"benchmark: trtexec: {workdir}/tools/trtexec (a program)" in out
    assert "reads files outside" not in out
    assert cli.main(["plan", str(path), "--json"]) == 0
    stages = {s["stage"]: s["executes"] for s in json.loads(capsys.readouterr().out)["stages"]}
    assert stages == {"mine": ["tests.stage_fns:copy_model (a function of yours: the stage itself)"], "build": [],
                      "benchmark": [f"trtexec: {workdir}/tools/trtexec (a program)"]}


@pytest.mark.parametrize("ref, where", [("runpy:run_path", "training"), ("os:remove", "stage")])
def test_a_standard_library_function_is_never_handed_the_files(write_yaml, workdir, capsys, ref, where):
    """`callable: runpy:run_path` would execute a data file, `kind: os:remove` delete the model: both refused before
    any file reaches them."""
    (workdir / "data").mkdir()
    planted = workdir / "data" / "line.png"  # a "picture" that is a Python script
    planted.write_text(f"open({str(workdir / 'PWNED')!r}, 'w').write('ran')\n")
    stage = (f"""p: {{kind: parity, images: "data/*.png", deploy: [{{read: rgb}}, {{layout: chw}}],
                   training: {{callable: "{ref}"}}}}""" if where == "training"
             else f"""p: {{kind: "{ref}", outputs: {{model: onnx}}}}""")
    path = write_yaml(f"""
        version: 1
        name: stdlib
        model: models/cls.onnx
        stages:
          {stage}
        """)
    code = cli.main(["run", str(path)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 1 and len(err) == 1 and f"'{ref}' is in Python's standard library" in err[0], err
    assert not (workdir / "PWNED").exists() and planted.exists() and (workdir / "models" / "cls.onnx").exists()


def test_validate_names_data_read_from_outside_the_pipelines_directory(write_yaml, workdir, capsys):
    path = write_yaml("""
        version: 1
        name: globs
        model: models/cls.onnx
        stages:
          fp16: {kind: precision, data: {images: "data/*.png"}}
          int8: {kind: calibrate, data: {images: "../elsewhere/*.png"}}
          again: {kind: calibrate, data: {tensors: "/srv/private/**/*.npy"}}
        """)
    assert cli.main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    listed = out[out.index("reads files outside"):]
    assert "int8: ../elsewhere/*.png" in listed and "again: /srv/private/**/*.npy" in listed, out
    assert "fp16" not in listed, "data/ is inside the pipeline's directory"


@pytest.mark.slow
def test_a_user_stage_beside_the_pipeline_file_is_importable(write_yaml, workdir, tmp_path, prefect_api):
    """`kind: userstages.slow:run` in the model repo validated, then failed at plan and run with "cannot import"
    unless PYTHONPATH was set by hand. The pipeline file's directory is importable (never shadowing an installed
    package), at validate, plan and run, whatever the working directory."""
    from tests.assets import trtflow

    package = workdir / "repo_stages_2611"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "slow.py").write_text(
        "from trtflow import StageResult\n\n"
        "def run(params, inputs, out_dir):\n"
        "    (out_dir / 'note.json').write_text('{}')\n"
        "    return StageResult(outputs={'note': out_dir / 'note.json'})\n")
    path = write_yaml("""
        version: 1
        name: userstage
        model: models/cls.onnx
        stages:
          mine: {kind: "repo_stages_2611.slow:run", outputs: {note: json}}
        """)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for command in (["validate", str(path)], ["plan", str(path)], ["run", str(path)]):
        done = trtflow(*command, cwd=elsewhere)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    # issue #52: the folder is on sys.path only while its code is imported (and in the stage's own process)
    import sys

    from trtflow.flows.implementation import resolve
    from trtflow.pipelines.loader import load_pipeline

    before = list(sys.path)
    loaded = load_pipeline(path)
    assert sys.path == before
    assert resolve(loaded.spec.stages["mine"]).run.__module__ == "repo_stages_2611.slow"
    assert sys.path == before


@pytest.mark.parametrize("command", ["schema", "reference"])
def test_every_dash_o_goes_through_the_safe_writer(capsys, tmp_path, command):
    """Issue 49, item 10: `schema -o` / `reference -o` overwrote a file, wrote through a dangling link and raised
    IsADirectoryError: they refuse each with one line (exit 2) and write nothing, as init does; --force overwrites
    a file, never through a link."""
    existing = tmp_path / "existing"
    existing.write_text("mine")
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "link").symlink_to(elsewhere)
    for target, words in ((existing, "exists"), (tmp_path / "link", "symbolic link"), (tmp_path, "directory")):
        for force in ([], ["--force"]):
            if force and target == existing:
                continue
            assert cli.main([command, *force, "-o", str(target)]) == 2
            error = capsys.readouterr().err.strip()
            assert error.startswith("error: ") and words in error and len(error.splitlines()) == 1, error
    assert existing.read_text() == "mine" and not elsewhere.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []
    assert cli.main([command, "--force", "-o", str(existing)]) == 0
    assert existing.read_text() != "mine" and existing.stat().st_mode & 0o777 == 0o644
