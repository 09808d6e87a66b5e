"""Bad input and faults, round three (issue #37): a model without an ONNX opset, a killed child process (the
TensorRT pre-flight, engine builds, ONNX Runtime helpers), the tag killer's owner and start-time checks,
`init-deploy` through a symbolic link, `check-env` against an unreachable server."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.test_cli import one_error_line, run_cli
from tests.test_faults import descendants
from tests.test_prepare_stage import run_prepare
from trtflow.errors import StageError, TransientStageError

# ------------------------------------------------------------------------------------- item 9: no ONNX opset


def _no_opset_model(path: Path, domains: tuple[str, ...] = ()) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]))
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(d, 1) for d in domains)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("case", ["zero bytes", "no opset_import", "only a custom domain"])
def test_a_model_without_an_onnx_opset_is_bad_input_in_one_line(tmp_path, case):
    """Issue #37 item 9: a zero-byte model was `failed unexpectedly: TypeError: '>' not supported between
    'NoneType' and 'int'` (the opset check on a model with no default-domain opset)."""
    path = tmp_path / "m.onnx"
    if case == "zero bytes":
        path.write_bytes(b"")
        expected = "m.onnx is not a valid ONNX model: the file is empty"
    else:
        _no_opset_model(path, ("com.example",) if case == "only a custom domain" else ())
        expected = "m.onnx is not a valid ONNX model: it imports no ONNX (ai.onnx) opset"
    with pytest.raises(StageError) as info:
        run_prepare(path, tmp_path / "out", preflight="off")
    assert type(info.value) is StageError and str(info.value).startswith(expected), str(info.value)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------ item 10: a killed child is no result

def _dying_interpreter(tmp_path: Path, how: str) -> Path:
    """An executable that stands in for the interpreter a child runs in: it kills itself (`how` = a signal's
    name) or sleeps (`how` = "hang"); the child is a real process either way."""
    script = tmp_path / f"python-{how}"
    script.write_text("#!/bin/sh\nsleep 30\n" if how == "hang" else f"#!/bin/sh\nkill -{how} $$\n")
    script.chmod(0o755)
    return script


@pytest.fixture
def dying_child(tmp_path, monkeypatch):
    """`dying_child(module, how)`: the children of `module` (`trtflow.child.call`'s) die as `how` says; the
    others run as they are."""
    from trtflow import child

    real = child.call

    def arm(module: str, how: str) -> None:
        def call(mod, *args, **kwargs):
            if mod != module:
                return real(mod, *args, **kwargs)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(sys, "executable", str(_dying_interpreter(tmp_path, how)))
                return real(mod, *args, **kwargs)
        monkeypatch.setattr(child, "call", call)
    return arm


@pytest.mark.tensorrt
@pytest.mark.parametrize("signal_name", ["KILL", "TERM"])
def test_a_killed_preflight_is_a_crash_never_a_report(dying_child, signal_name):
    """Issue #37 item 10: a pre-flight killed from outside was a report `{"ran": false, "reason": "... exit code
    -9"}`, which the FP16 stage published as a skipped trial build at the clean run's key."""
    from tests.assets import PPOCR
    from trtflow.stages.trt.preflight import run_preflight

    dying_child("trtflow.stages.trt.preflight", signal_name)
    with pytest.raises(TransientStageError, match=f"the TensorRT pre-flight was killed \\(SIG{signal_name}\\)"):
        run_preflight(PPOCR, {"x": [1, 3, 48, 192]})


@pytest.mark.tensorrt
def test_a_preflight_that_times_out_is_a_crash_never_a_report(dying_child):
    from tests.assets import PPOCR
    from trtflow.stages.trt.preflight import run_preflight

    dying_child("trtflow.stages.trt.preflight", "hang")
    with pytest.raises(TransientStageError, match="the TensorRT pre-flight did not finish within 0.5 s"):
        run_preflight(PPOCR, timeout=0.5)


@pytest.mark.tensorrt
def test_a_preflight_that_crashes_on_the_model_is_still_its_report(dying_child):
    """A parser that crashes (SIGSEGV) says something about the model: that stays the pre-flight's report."""
    from tests.assets import PPOCR
    from trtflow.stages.trt.preflight import run_preflight

    dying_child("trtflow.stages.trt.preflight", "SEGV")
    report = run_preflight(PPOCR)
    assert report.ran is False and "the TensorRT parser process was killed by SIGSEGV" in report.reason, report.reason


def _harness(tmp_path: Path) -> None:
    from trtflow.stages.ort import harness

    harness.benchmark(tmp_path / "m.onnx", {"x": np.zeros((1, 4), np.float32)}, 0, 0.1, None, 1, tmp_path / "h",
                      tmp_path / "h.log")


def _quant_prep(tmp_path: Path) -> None:
    from trtflow.stages.ort import quant_prep

    src = _no_opset_model(tmp_path / "src.onnx")
    quant_prep.pre_process(src, tmp_path / "dst.onnx", tmp_path)


def _build_cell(tmp_path: Path) -> None:
    from trtflow.stages.trt.building import build_cells
    from trtflow.stages.trt.records import Backend, Cell

    cell = Cell(name="m.p.native", variant="m", precision="fp32", model=str(tmp_path / "m.onnx"), profiles=[],
                target="native", backend=Backend(flavour="tensorrt-rtx", module="tensorrt_rtx", version="1"),
                options={})
    (tmp_path / "engines").mkdir()
    build_cells([cell], tmp_path / "engines", 1)


KILLED_CHILDREN = {
    "build worker": ("trtflow.stages.trt.build_worker", _build_cell, "the build of engine m.p.native"),
    "benchmark harness": ("trtflow.stages.ort.harness", _harness, r"the built-in harness \(ONNX Runtime\)"),
    "quantization pre-processing": ("trtflow.stages.ort.quant_prep", _quant_prep,
                                    "ONNX Runtime's quantization pre-processing"),
}


@pytest.mark.parametrize("case", list(KILLED_CHILDREN))
def test_every_killed_child_is_a_crash_never_a_result(tmp_path, dying_child, case):
    """A build cell killed from outside was a failed cell (published), the harness's a failed measurement, the
    quantization pre-processing's a model "quantized as is"."""
    module, use, what = KILLED_CHILDREN[case]
    dying_child(module, "KILL")
    with pytest.raises(TransientStageError, match=f"{what} was killed \\(SIGKILL\\) before it answered"):
        use(tmp_path)


PREFLIGHT_PIPELINE = """
version: 1
name: killpreflight
model: models/cls.onnx
stages:
  fp16: {kind: precision, to: fp16, inputs: {model: source}}
"""


@pytest.mark.slow
@pytest.mark.tensorrt
def test_a_sigkilled_preflight_in_a_real_run_publishes_nothing(workdir):
    """The run as the issue saw it: the FP16 stage in its own process, its pre-flight child SIGKILLed by pid. The
    stage fails as a crash and the store serves nothing for it (before: the run passed and published a result whose
    trial build never happened, reused by every later run)."""
    from tests.test_runner import run_all
    from trtflow.flows.store import LocalStore

    path = workdir / "pipeline.yaml"
    path.write_text(PREFLIGHT_PIPELINE)
    killer = _PreflightKiller()
    killer.start()
    try:
        with pytest.raises(TransientStageError, match=r"the TensorRT pre-flight was killed \(SIGKILL\)"):
            run_all(path, ["artifacts=store"])
    finally:
        killer.done.set()
        killer.join()
    assert killer.killed, "the pre-flight child was never seen"
    store = LocalStore(workdir / "store")
    last = store.last("fp16")
    assert last is not None and "was killed (SIGKILL)" in last.error
    assert store.lookup("fp16", last.key).manifest is None, "the run's key serves a result"
    assert list((workdir / "store").glob("fp16/*/manifest.json")) == []


class _PreflightKiller(threading.Thread):
    """SIGKILLs every pre-flight child process of this test as soon as it appears."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done, self.killed = threading.Event(), 0

    def run(self) -> None:
        while not self.done.wait(0.01):
            for pid in descendants(os.getpid()):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"trtflow.stages.trt.preflight" in cmdline:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        self.killed += 1
                    except ProcessLookupError:
                        pass


# --------------------------------------------------------------- item 14: the tag killer's owner and start time

def _tagged(tag: str, **kwargs) -> subprocess.Popen:
    from trtflow.flows.isolate import STAGE_TAG

    return subprocess.Popen(["sleep", "60"], env={**os.environ, STAGE_TAG: tag}, **kwargs)


def _alive(proc: subprocess.Popen) -> bool:
    time.sleep(0.1)
    return proc.poll() is None


@pytest.mark.skipif(os.getuid() != 0, reason="needs root, to start a process as another user (nobody)")
def test_the_tag_killer_spares_another_users_process_and_an_older_one():
    """Issue #37 item 14: a process of another user carrying a stage's exact tag was SIGKILLed (root reads every
    environment). Only this user's processes started since the stage count; this user's own one is killed."""
    from trtflow import procfs
    from trtflow.flows import isolate

    tag = f"{os.getpid()}-round3test"
    older = _tagged(tag)  # started before the stage: its pid reused, not the stage's doing
    time.sleep(0.05)
    since = procfs.now_ticks()
    time.sleep(0.05)
    other = _tagged(tag, preexec_fn=lambda: os.setuid(65534))
    ours = _tagged(tag)
    try:
        time.sleep(0.1)
        isolate._kill_tagged(f"{isolate.STAGE_TAG}={tag}".encode(), since)
        assert ours.wait(5) == -signal.SIGKILL
        assert _alive(other), "another user's process was killed"
        assert _alive(older), "a process started before the stage was killed"
    finally:
        for proc in (older, other, ours):
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------ item 13: init-deploy and symlinks

@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("dangling", [True, False])
def test_init_deploy_never_writes_through_a_symlink(capsys, tmp_path, monkeypatch, dangling, force):
    """Issue #37 item 13: `init-deploy -o x.yaml` wrote through a dangling symlink at x.yaml."""
    monkeypatch.chdir(tmp_path)
    pointee = tmp_path / "elsewhere.txt"
    if not dangling:
        pointee.write_text("keep me\n")
    (tmp_path / "x.yaml").symlink_to(pointee)
    code, _, err = run_cli(capsys, "init-deploy", "-o", "x.yaml", "--machine", "m", "--gpu-kind", "cpu",
                             *(["--force"] if force else []))
    assert code == 2 and "x.yaml is a symbolic link" in one_error_line(err), err
    assert (tmp_path / "x.yaml").is_symlink()
    assert (pointee.read_text() == "keep me\n") if not dangling else not pointee.exists()


def test_init_deploy_still_writes_a_new_file_and_overwrites_only_with_force(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ("init-deploy", "-o", "x.yaml", "--machine", "m", "--gpu-kind", "cpu")
    assert run_cli(capsys, *argv)[0] == 0 and "m" in (tmp_path / "x.yaml").read_text()
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and "x.yaml exists" in one_error_line(err)
    assert run_cli(capsys, *argv, "--force")[0] == 0


# ------------------------------------------------------------------- item 15: check-env against no server

@pytest.mark.slow
def test_check_env_with_an_unreachable_server_prints_one_line(tmp_path):
    """Issue #37 item 15: Prefect's own "Unable to connect ..." warning came before trtflow's `error:` line."""
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"TRTFLOW_STATE_DIR": str(tmp_path / "state"), "PREFECT_HOME": str(tmp_path / ".prefect"),
            "TRTFLOW_MACHINE": "m"}
    command = [sys.executable, "-m", "trtflow.flows.cli", "check-env"]
    first = subprocess.run([*command, "--no-event"], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    record = tmp_path / "state" / "environment.json"
    kept = json.loads(record.read_text())
    kept["fingerprint"]["python"] = "0.0"  # as if the machine changed since
    record.write_text(json.dumps(kept))
    env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stdout.strip() == ""
    assert "could not send trtflow.environment.changed" in one_error_line(done.stderr)


def test_a_child_call_is_one_typed_outcome(dying_child, tmp_path):
    """Issue #52: a child's end is a value its callers match on, worded once (`child.ending`): answered, crashed
    (its signal, its last line), timed out; killed from outside raises (no answer says nothing about the input)."""
    from trtflow import child
    from trtflow.stages.trt.env import VersionRequest, VersionResponse

    def ask(timeout: float = 60):
        return child.call("trtflow.stages.trt.env", VersionRequest(module="json"), VersionResponse, tmp_path, timeout,
                          what="the version probe")

    assert isinstance(ask(), child.Answered)
    dying_child("trtflow.stages.trt.env", "SEGV")
    crashed = ask()
    assert isinstance(crashed, child.Crashed) and crashed.signal == "SIGSEGV"
    assert crashed.text().startswith("was killed by SIGSEGV")
    dying_child("trtflow.stages.trt.env", "hang")
    late = ask(0.5)
    assert isinstance(late, child.TimedOut) and late.text() == "did not finish within 0.5 s (killed)"
    dying_child("trtflow.stages.trt.env", "KILL")
    with pytest.raises(child.Killed, match=r"the version probe was killed \(SIGKILL\) before it answered"):
        ask()
