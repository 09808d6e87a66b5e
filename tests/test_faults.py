"""Faults inside a stage (issue #11, items 7-10 and 14): a native crash, a timeout, processes a stage started, a
SIGTERM to `trtflow run`, an exception from the user's own code. Each ends in one line naming the stage, with
nothing left behind: no staging directory, no process."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.test_runner import plan_of, run_all
from trtflow import procfs
from trtflow.errors import StageError, TransientStageError
from trtflow.flows import cli
from trtflow.flows.store import LocalStore
from trtflow.pipelines.loader import load_pipeline

ONE = """
version: 1
name: faults
model: models/cls.onnx
stages:
  s: {{kind: "tests.stage_fns:{fn}", outputs: {{model: onnx}}, params: {params}{extra}}}
"""


def alive(pid: int) -> bool:
    found = procfs.stat(pid)
    return found is not None and found.state != b"Z"


def wait_gone(pids, seconds: float = 10) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (found := procfs.stat(d.name)) is not None:
            children.setdefault(found.parent, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def store_entries(path: Path, stage: str) -> list[str]:
    return sorted(p.name for p in (load_pipeline(path).store_root / stage).iterdir())


@pytest.mark.parametrize("how, ended", [("exit", "exited with code 3"), ("segfault", "was killed by SIGSEGV")])
def test_a_crash_without_timeout_is_one_line_and_leaves_no_staging(write_yaml, capsys, how, ended):
    path = write_yaml(ONE.format(fn="crash", params=f"{{how: {how}}}", extra=""))
    with pytest.raises(TransientStageError) as info:
        run_all(path)
    assert str(info.value) == f"stage 's' crashed (its process {ended}; its last output: about to crash)"
    assert store_entries(path, "s") == ["last.json"]
    assert plan_of(path)["s"] == ("run", f"its last run failed: {info.value}")
    if how == "segfault":
        assert "Segmentation fault" in info.value.failure.log, "the crash's Python stack is kept for --verbose"


@pytest.mark.parametrize("timeout", ["", ", timeout: 60"])
def test_a_user_exception_is_one_line_naming_the_stage(write_yaml, timeout):
    path = write_yaml(ONE.format(fn="raise_value_error", params="{}", extra=timeout))
    with pytest.raises(TransientStageError) as info:
        run_all(path)
    assert str(info.value) == ("stage 's' failed unexpectedly: ValueError: the user's own bug "
                               "(run with --verbose for the traceback)")
    assert "raise ValueError" in info.value.failure.traceback


@pytest.mark.slow
@pytest.mark.parametrize("detach", [False, True], ids=["its group", "detached with setsid"])
def test_a_timeout_kills_what_the_stage_started(write_yaml, tmp_path, detach):
    pidfile = tmp_path / "pid"
    path = write_yaml(ONE.format(fn="spawn_and_sleep", params=f"{{pidfile: '{pidfile}', detach: {detach}}}",
                                 extra=", timeout: 3s"))
    with pytest.raises(TransientStageError, match=r"stage 's' timed out after 3 s"):
        run_all(path)
    grandchild = int(pidfile.read_text())
    assert wait_gone([grandchild], 1) == [], "the process the stage started was killed with it"
    assert store_entries(path, "s") == ["last.json"]


def test_a_process_a_stage_detached_ends_with_the_stage(write_yaml, tmp_path):
    """Issue #27: a process a stage started with `setsid` outlived the run (a new session is out of reach of the
    stage's process group)."""
    pidfile = tmp_path / "pid"
    path = write_yaml(ONE.format(fn="spawn_and_sleep", params=f"{{pidfile: '{pidfile}', detach: true, seconds: 0}}",
                                 extra=""))
    assert run_all(path) == {"s": "ran"}
    assert wait_gone([int(pidfile.read_text())], 1) == []


@pytest.mark.slow
def test_sigterm_is_one_line_and_leaves_no_process(write_yaml, tmp_path):
    pidfile = tmp_path / "pid"
    path = write_yaml(ONE.format(fn="spawn_and_sleep", params=f"{{pidfile: '{pidfile}'}}", extra=""))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-m", "trtflow.flows.cli", "run", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    while not pidfile.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert pidfile.exists(), proc.communicate()
    ours = descendants(proc.pid)
    assert int(pidfile.read_text()) in ours
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert err.strip().splitlines() == ["error: terminated (SIGTERM); nothing half-written was kept"]
    assert wait_gone(ours) == [], "no process of ours (stage, its children, Prefect's server) outlives the run"
    assert [p for p in store_entries(path, "s") if p.startswith(".tmp-")] == []
    # the stage was stopped with the run, it did not fail: its Prefect task ends Cancelled (was Failed, "crashed")
    api = os.environ["PREFECT_API_URL"]
    runs = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"name": {"like_": f"@{path.parent.name}-"}}},
                      timeout=30).json()
    tasks = httpx.post(f"{api}/task_runs/filter", json={"flow_runs": {"id": {"any_": [r["id"] for r in runs]}}},
                       timeout=30).json()
    assert [t["state_type"] for t in tasks] == ["CANCELLED"], [t["state"] for t in tasks]


@pytest.mark.slow
def test_a_truncated_jpeg_is_one_line_and_libjpeg_stays_off_the_console(workdir, capfd):
    import cv2
    import yaml

    from tests.assets import ROOT
    example = ROOT / "examples" / "squeezenet-cls"
    (workdir / "data").mkdir()
    ok, jpeg = cv2.imencode(".jpg", cv2.imread(str(example / "data" / "chelsea.png")))
    (workdir / "data" / "cat.jpg").write_bytes(jpeg.tobytes()[: len(jpeg) // 2])
    spec = yaml.safe_load((example / "pipeline.yaml").read_text())
    parity = {**spec["stages"]["parity"], "images": "data/*.jpg"}
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": "jpeg", "model": "models/cls.onnx",
                                    "stages": {"parity": parity}}))
    with pytest.raises(StageError) as info:
        run_all(path)
    message = str(info.value)
    assert message.startswith("parity: cannot read image ") and "cat.jpg" in message and "\n" not in message
    captured = capfd.readouterr()
    assert "JPEG" not in captured.err + captured.out, "libjpeg's own lines went to the stage's log"
    assert "Premature end of JPEG" in info.value.failure.log or "Corrupt JPEG" in info.value.failure.log


def test_errors_never_cite_a_staging_path_that_is_gone(write_yaml):
    path = write_yaml(ONE.format(fn="fail_naming_its_output", params="{}", extra=""))
    with pytest.raises(StageError) as info:
        run_all(path)
    assert ".tmp-" not in str(info.value)
    assert str(info.value) == "s: cannot finish (the output directory of stage 's', removed)/half.onnx"


def test_a_model_that_is_not_onnx_is_one_line_naming_the_stage(write_yaml, workdir):
    path = write_yaml("version: 1\nname: x\nmodel: ../../../../../../../../etc/passwd\nstages:\n"
                      "  p: {kind: prepare}\n")
    with pytest.raises(StageError) as info:
        run_all(path)
    assert str(info.value).startswith("p: /etc/passwd is not a valid ONNX model (truncated or corrupt)")
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_onnx_runtime_error_lines_stay_off_the_console(write_yaml, workdir, capfd):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([3], np.int64), "shape")  # [1, 4] cannot become [3]: fails in Run
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), workdir / "models" / "bad.onnx")
    path = write_yaml("version: 1\nname: ort\nmodel: models/bad.onnx\nstages:\n"
                      "  p: {kind: prepare, preflight: 'off'}\n")
    with pytest.raises(StageError) as info:
        run_all(path)
    assert str(info.value).startswith("p: ") and "\n" not in str(info.value)
    captured = capfd.readouterr()
    assert "[E:onnxruntime" not in captured.err + captured.out
    assert "[E:onnxruntime" in info.value.failure.log, "ONNX Runtime's own line is kept for --verbose"


@contextlib.contextmanager
def small_disk(path: Path, megabytes: int) -> Iterator[Path]:
    """A real file system of `megabytes` at `path` (a tmpfs; needs root, as on CI's machines)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Fill `disk` until `leave` bytes are free; returns the filler (delete it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, shutil.disk_usage(disk).free - leave))
    return filler


@pytest.mark.slow
@pytest.mark.parametrize("leave, expected", [
    (300_000, "error: stage 's': no space left on the device writing its output in {store}/s; {free} free there "
              "(free some space, or give a store elsewhere with --store)"),
    (0, "error: the artifact store: no space left on the device writing {store}; {free} free there (free some "
        "space, or give a store elsewhere with --store)"),
], ids=["stage output", "the store's own files"])
def test_a_full_disk_is_one_line_naming_the_path_and_the_space_left(write_yaml, tmp_path, capsys, leave, expected):
    """Issue #27: a store on a nearly full disk failed with `JSONDecodeError` or `OSError: [Errno 28]` as an
    unexpected error (and was retried). Now: one line, the path and the free space, exit 1; nothing half-written
    kept, and the run after space was freed completes."""
    path = write_yaml(ONE.format(fn="copy_model", params="{}", extra=", inputs: {model: source}"))
    with small_disk(tmp_path / "disk", 8) as disk:
        store = disk / "store"
        if leave:  # a store made before the disk filled up; with no space left, its marker cannot be written
            LocalStore(store).ensure_writable()
        filler = fill(disk, leave)
        started = time.monotonic()
        assert cli.main(["run", str(path), "--store", str(store)]) == 1
        assert time.monotonic() - started < 30
        (line,) = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        said = re.search(r"; ([0-9.]+ kB|[0-9]+ bytes) free there", line)
        assert said and line == expected.format(store=store, free=said.group(1)), line
        free = float(said.group(1).split()[0]) * (1e3 if "kB" in said.group(1) else 1)
        assert abs(free - shutil.disk_usage(disk).free) < 20_000, "the space left once the partial output was removed"
        assert [p for p in store.glob("s/*") if p.name != "last.json"] == [], "nothing half-written kept"
        filler.unlink()
        assert cli.main(["run", str(path), "--store", str(store)]) == 0
