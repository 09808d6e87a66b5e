"""A real Prefect flow run (on the test run's Prefect server, see conftest.py): tasks, artifacts, reuse."""
from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from tests import stage_fns
from trtflow.flows import cli

PIPE = """
version: 1
name: flowdemo
model: models/cls.onnx
stages:
  a: {kind: "tests.stage_fns:copy_model", outputs: {model: onnx}, params: {tag: one}}
  b: {kind: "tests.stage_fns:count_bytes", outputs: {report: json}, inputs: {model: a}, retries: 2}
"""


@pytest.fixture
def prefect_server(prefect_api: str) -> str:
    return prefect_api


def _artifacts(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    async def read():  # newest first
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                               sort=ArtifactSort.CREATED_DESC)
    return asyncio.run(read())


def _key(path, stage: str) -> str:
    from trtflow.flows.pipeline_flow import artifact_key
    from trtflow.flows.runner import make_runner
    return artifact_key(make_runner(str(path), [], None), stage)


def _task_runs(path: Path):
    """The task runs of the flow runs of this test's pipeline (flow runs are named `<pipeline>@<repo>-...`; the
    server is shared by the whole test run)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    async def read():
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"@{path.parent.name}-")))
            return await client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [r.id for r in runs]}))
    return asyncio.run(read())


@pytest.mark.slow
def test_run_twice_through_prefect(prefect_server, write_yaml, capsys):
    path = write_yaml(PIPE)
    stage_fns.CALLS.clear()
    assert cli.main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ran" in out and "2 stages (2 ran, 0 reused)" in out
    assert stage_fns.CALLS == ["copy_model", "count_bytes"]

    runs = {t.name for t in _task_runs(path)}
    assert {"a", "b"} <= runs, "one Prefect task run per stage, named after the stage"
    arts = _artifacts(_key(path, "b"))
    assert arts and "585535 bytes" in arts[0].data  # the stage's own summary, under a header
    assert arts[0].data.startswith("**ran**")

    stage_fns.CALLS.clear()
    assert cli.main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 stages (0 ran, 2 reused)" in out and "no flow run needed" in out
    assert stage_fns.CALLS == []

    assert cli.main(["run", str(path), "--force", "b"]) == 0
    assert "2 stages (1 ran, 1 reused)" in capsys.readouterr().out
    assert _artifacts(_key(path, "a"))[0].data.startswith("**reused**")
    assert any(t.state and t.state.name == "Cached" for t in _task_runs(path) if t.name == "a"), \
        "a reused stage ends in Prefect's Cached state"

    assert cli.main(["run", str(path), "--set", "stages.a.params.tag=two"]) == 0
    assert "2 stages (2 ran, 0 reused)" in capsys.readouterr().out


@pytest.mark.slow
def test_run_loads_the_pipeline_once(prefect_server, write_yaml, capsys, monkeypatch):
    """`trtflow run` checks the pipeline and the store before Prefect starts; the flow it then starts runs on that
    same runner: the pipeline file is loaded (read, interpolated, validated) once per command, whether the stages
    run or are all reused; the run's identity is not read again per stage."""
    from trtflow.flows import run_identity as identity
    from trtflow.pipelines import loader

    path = write_yaml(PIPE)
    loads, identities = [], []
    real, parse = loader.load_pipeline, identity.parse_yaml
    monkeypatch.setattr(loader, "load_pipeline", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    monkeypatch.setattr(identity, "parse_yaml", lambda *a, **k: identities.append(1) or parse(*a, **k))
    assert cli.main(["run", str(path)]) == 0
    assert "2 stages (2 ran, 0 reused)" in capsys.readouterr().out
    assert loads == [str(path)]
    # the run's name and tags (run_identity) are read for the flow run's name and for its tags: not once more per
    # stage task
    assert len(identities) == 2
    loads.clear()
    assert cli.main(["run", str(path), "--force", "b"]) == 0
    assert "2 stages (1 ran, 1 reused)" in capsys.readouterr().out
    assert loads == [str(path)]


@pytest.mark.slow
def test_stage_error_fails_flow_with_one_line_and_no_retries(prefect_server, write_yaml, capsys):
    path = write_yaml(PIPE.replace("tests.stage_fns:count_bytes", "tests.stage_fns:fail")
                      .replace("outputs: {report: json}", "outputs: {model: onnx}"))
    code = cli.main(["run", str(path)])
    captured = capsys.readouterr()
    assert code == 1
    errors = [ln for ln in captured.err.splitlines() if ln.startswith("error:")]
    assert errors == ["error: b: planted failure"], captured.err
    assert "Traceback" not in captured.err
    # the failed stage's line carries its seconds, as every other stage line does (issue #43)
    lines = [" ".join(ln.split()) for ln in captured.out.splitlines()]
    assert any(re.fullmatch(r"ran a \(tests\.stage_fns:copy_model\) \d+\.\d\ds .*", ln) for ln in lines), lines
    assert any(re.fullmatch(r"failed b \(tests\.stage_fns:fail\) \d+\.\d\ds", ln) for ln in lines), lines
    deadline = time.monotonic() + 30  # Prefect records a task run's last state after the flow returns, on a busy
    while True:  # server a moment later
        b_runs = [t for t in _task_runs(path) if t.name == "b" and t.state and t.state.is_failed()]
        if b_runs or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert b_runs and all(t.run_count == 1 for t in b_runs), "a StageError is not retried"


@pytest.mark.slow
def test_a_crash_is_retried_and_a_user_exception_is_one_line(prefect_server, write_yaml, tmp_path, capsys):
    marker = tmp_path / "crashed-once"
    path = write_yaml(f"""
        version: 1
        name: flaky
        model: models/cls.onnx
        stages:
          f: {{kind: "tests.stage_fns:flaky", outputs: {{report: json}}, params: {{marker: '{marker}'}}, retries: 1}}
        """)
    stage_fns.CALLS.clear()
    assert cli.main(["run", str(path)]) == 0, capsys.readouterr().err
    assert stage_fns.CALLS == ["flaky", "flaky"], "the crash was transient: retried once, then it succeeded"

    path = write_yaml(PIPE.replace("tests.stage_fns:count_bytes", "tests.stage_fns:raise_value_error"))
    assert cli.main(["run", str(path)]) == 1
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        "error: stage 'b' failed unexpectedly: ValueError: the user's own bug (run with --verbose for the "
        "traceback)"], err


@pytest.mark.slow
def test_independent_stages_run_side_by_side_and_a_failure_stops_only_its_dependents(prefect_server, write_yaml,
                                                                                     tmp_path, capsys):
    log = tmp_path / "intervals.txt"
    path = write_yaml(f"""
        version: 1
        name: graph
        model: models/cls.onnx
        concurrency: 2
        stages:
          left: {{kind: "tests.stage_fns:interval", outputs: {{report: json}},
                  params: {{tag: left, meet: right, seconds: 0.5, log: '{log}'}}}}
          right: {{kind: "tests.stage_fns:interval", outputs: {{report: json}},
                   params: {{tag: right, meet: left, seconds: 0.5, log: '{log}'}}}}
          broken: {{kind: "tests.stage_fns:fail", outputs: {{model: onnx}}}}
          after: {{kind: "tests.stage_fns:count_bytes", outputs: {{report: json}}, inputs: {{model: broken}}}}
        """)
    assert cli.main(["run", str(path)]) == 1
    captured = capsys.readouterr()
    errors = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert errors == ["error: broken: planted failure; not run because of it: after"], captured.err
    assert "skipped after" in " ".join(captured.out.split())
    spans = {tag: (float(a), float(b)) for tag, a, b in (ln.split() for ln in log.read_text().splitlines())}
    assert set(spans) == {"left", "right"}, "the stages that do not need the failed one ran"
    (a0, a1), (b0, b1) = spans["left"], spans["right"]
    assert a0 < b1 and b0 < a1, "the two independent stages overlapped in time"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["corrupt model", "opset too low"])
def test_bad_model_through_the_cli(prefect_server, write_yaml, workdir, capsys, case):
    if case == "corrupt model":
        model = workdir / "models" / "cls.onnx"
        model.write_bytes(model.read_bytes()[:30_000])
        body, expected = "p: {kind: prepare}", "cls.onnx is not a valid ONNX model (truncated or corrupt)"
    else:
        body, expected = "p: {kind: prepare, target_opset: 3}", "cannot convert cls.onnx from opset 11 to 3"
    path = write_yaml(f"version: 1\nname: bad\nmodel: models/cls.onnx\nstages:\n  {body}\n")
    code = cli.main(["run", str(path)])
    captured = capsys.readouterr()
    errors = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert code == 1 and len(errors) == 1 and expected in errors[0], captured.err
    assert "Traceback" not in captured.err
    stage_dir = workdir / ".trtflow" / "p"
    assert not [d for d in stage_dir.iterdir() if d.name != "last.json"], "nothing half-written is left"


@pytest.mark.slow
def test_calibration_progress_artifact(prefect_server, write_yaml, workdir, capsys):
    import shutil

    import numpy as np

    from tests.assets import SQUEEZENET
    shutil.copy(SQUEEZENET, workdir / "models" / "sq.onnx")
    (workdir / "calib").mkdir()
    for i in range(6):
        np.save(workdir / "calib" / f"{i}.npy", np.random.default_rng(i).standard_normal((1, 3, 224, 224))
                .astype(np.float32))
    path = write_yaml("version: 1\nname: prog\nmodel: models/sq.onnx\nstages:\n"
                      "  int8: {kind: calibrate, data: {tensors: 'calib/*.npy'}, method: minmax, holdout: 1}\n")
    assert cli.main(["run", str(path)]) == 0, capsys.readouterr().err
    arts = _artifacts(_key(path, "int8") + "-progress")
    assert arts and arts[0].type == "progress" and float(arts[0].data) == 100.0


def test_flow_runs_are_named_and_tagged_after_the_pipeline(prefect_server, write_yaml, capsys):
    import hashlib

    from prefect.client.orchestration import get_client
    path = write_yaml(PIPE)
    assert cli.main(["run", str(path)]) == 0

    async def newest():
        async with get_client() as client:
            return (await client.read_flow_runs(limit=50))
    short = hashlib.sha256(path.read_bytes()).hexdigest()[:6]
    runs = [r for r in asyncio.run(newest()) if r.name == f"flowdemo@{path.parent.name}-{short}"]
    assert runs and {"trtflow", "pipeline:flowdemo", f"repo:{path.parent.name}"} <= set(runs[0].tags)


@pytest.mark.slow
@pytest.mark.tensorrt
def test_watcher_rebuilds_once_and_names_each_engine(prefect_server, tmp_path_factory):
    """The watcher flow on a directory of model repos: the first pass builds the real TensorRT-RTX engines and
    returns one `trtflow.engine.rebuilt` event per engine; the second finds nothing stale. Its result is
    persisted (Prefect's own result storage)."""
    import shutil

    from prefect.client.orchestration import get_client

    from tests.assets import PPOCR
    from trtflow.flows.watch import watch_flow
    fleet = tmp_path_factory.mktemp("fleet")
    workdir = fleet / "cls-repo"
    (workdir / "models").mkdir(parents=True)
    shutil.copy(PPOCR, workdir / "models" / "cls.onnx")
    (workdir / "pipeline.yaml").write_text("""
version: 1
name: watched
model: models/cls.onnx
stages:
  build:
    kind: build
    profiles:
      small: {x: {min: [1, 3, 48, 48], opt: [1, 3, 48, 192], max: [2, 3, 48, 320]}}
""")
    (workdir / "notes.yaml").write_text("just: a yaml file that is not a pipeline\n")
    first = watch_flow([str(fleet)])
    (entry,) = first
    assert entry["pipeline"] == str((workdir / "pipeline.yaml").resolve()) and entry["ran"] == ["build"]
    assert [e["event"] for e in entry["events"]] == ["trtflow.engine.rebuilt"]
    (event,) = entry["events"]
    assert event["resource"].startswith(f"trtflow.engine.{workdir.name}.build.") and event["resource"].endswith(
        ".small.native")
    assert Path(event["engine"]).is_file() and Path(event["engine"]).stat().st_size > 100_000
    (again,) = watch_flow([str(fleet)])
    assert again["ran"] == [] and again["reused"] == ["build"] and again["events"] == []

    async def newest():
        from prefect.client.schemas.filters import FlowFilter, FlowFilterName
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["trtflow-watch"])))
            return [r for r in runs if r.state and r.state.is_completed()]
    stored = sorted((r.created, r.state.result()[0]) for r in asyncio.run(newest()))
    assert [(e["ran"], e["reused"]) for _, e in stored[-2:]] == [(["build"], []), ([], ["build"])], \
        "the flow's result is stored, not MissingResult"


def test_watcher_names_the_working_directory_of_a_missing_pipeline(prefect_server, tmp_path, monkeypatch):
    from trtflow.errors import SpecError
    from trtflow.flows.watch import find_pipelines
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match=f"relative paths resolve against the deployment's working directory, "
                                        f"{tmp_path}"):
        find_pipelines(["repo/pipeline.yaml"], tmp_path)


@pytest.mark.slow
def test_a_python_call_is_tagged_draws_true_edges_and_does_not_poll(prefect_server, write_yaml, tmp_path,
                                                                  monkeypatch):
    """Called from Python (no CLI, no tags context), the flow run still carries the pipeline's tags. A task that
    uses no GPU carries no tag, so Prefect asks the server for no concurrency lease for it (a distinct tag set per
    stage cost about 1.3 s a stage: a client service started for each set). Each task's inputs in Prefect's graph are exactly the stages it reads (the runner object
    passed as an argument drew edges to any earlier result inside it). Waiting for a running stage asks the server
    nothing: the scheduler asked every running task's state every 50 ms (about 13 reads a second per stage)."""
    from prefect.client.orchestration import SyncPrefectClient

    from trtflow.flows.pipeline_flow import pipeline_flow

    log = tmp_path / "intervals.txt"
    path = write_yaml(f"""
        version: 1
        name: edges
        model: models/cls.onnx
        stages:
          a: {{kind: "tests.stage_fns:copy_model", outputs: {{model: onnx}}}}
          side: {{kind: "tests.stage_fns:interval", outputs: {{report: json}},
                  params: {{tag: side, seconds: 2, log: '{log}'}}}}
          b: {{kind: "tests.stage_fns:count_bytes", outputs: {{report: json}}, inputs: {{model: a}}}}
        """)
    reads = []
    real = SyncPrefectClient.read_task_run
    monkeypatch.setattr(SyncPrefectClient, "read_task_run", lambda self, *a, **k: reads.append(1) or real(self, *a, **k))
    import prefect.concurrency._sync as concurrency_sync
    leases = []
    lease = concurrency_sync.acquire_concurrency_slots_with_lease
    monkeypatch.setattr(concurrency_sync, "acquire_concurrency_slots_with_lease",
                        lambda names, *a, **k: leases.append(names) or lease(names, *a, **k))
    outcomes = pipeline_flow(str(path))
    assert [o["status"] for o in outcomes] == ["ran", "ran", "ran"]
    assert reads == [], f"{len(reads)} task-run reads while 'side' ran for 2 s"
    runs = {t.name: t for t in _task_runs(path)}
    assert {name: t.tags for name, t in runs.items()} == {"a": [], "side": [], "b": []}
    assert leases == []
    ids = {t.id: name for name, t in runs.items()}
    upstream = {name: {ids.get(i.id) for inputs in t.task_inputs.values() for i in inputs if hasattr(i, "id")}
                for name, t in runs.items()}
    from trtflow.flows.runner import make_runner
    graph = make_runner(str(path), [], None).graph
    assert upstream == {n: set(graph.nodes[n].upstream) for n in runs} and upstream["b"] == {"a"}, upstream

    async def flow_tags():
        from prefect.client.orchestration import get_client
        async with get_client() as client:
            return (await client.read_flow_run(runs["b"].flow_run_id)).tags
    assert {"trtflow", "pipeline:edges", f"repo:{path.parent.name}"} <= set(asyncio.run(flow_tags()))


@pytest.mark.slow
def test_a_benchmark_never_shares_its_gpu_with_another_stage(prefect_server, write_yaml, tmp_path, monkeypatch):
    """A benchmark times the GPU: while it runs, no other stage uses that GPU, and it does not start while one does.
    Here a GPU stage (a user stage whose key holds the GPU) is running when the benchmark becomes ready, and another
    becomes ready with it; the task runs the Prefect server recorded never overlap on the device's tag. Stages
    without a GPU still run beside it. The GPU stages carry the device's tag because the server holds a limit on it
    (as `init-deploy --limits` makes); without one they carry none (a tag costs a lease request per task run)."""
    from prefect.client.orchestration import get_client

    from trtflow.flows.pipeline_flow import limited_tags, pipeline_flow

    assert limited_tags({"gpu:rig-7:1"}) == set()
    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag="gpu:rig-7:1", concurrency_limit=1)
    assert limited_tags({"gpu:rig-7:1", "gpu:rig-7:2"}) == {"gpu:rig-7:1"}
    monkeypatch.setenv("TRTFLOW_MACHINE", "rig-7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    log = tmp_path / "intervals.txt"
    path = write_yaml(f"""
        version: 1
        name: gpu-alone
        model: models/cls.onnx
        stages:
          a: {{kind: "tests.stage_fns:copy_model", outputs: {{model: onnx}}}}
          build_like: {{kind: "tests.stage_fns:interval", outputs: {{report: json}}, env_dependent: true,
                        params: {{tag: build_like, seconds: 3, log: '{log}'}}}}
          cpu_side: {{kind: "tests.stage_fns:interval", outputs: {{report: json}},
                      params: {{tag: cpu_side, seconds: 3, log: '{log}'}}}}
          validate_like: {{kind: "tests.stage_fns:interval", outputs: {{report: json}}, env_dependent: true,
                           inputs: {{model: a}}, params: {{tag: validate_like, seconds: 1, log: '{log}'}}}}
          bench: {{kind: benchmark, tool: builtin, inputs: {{models: [a]}}, duration: 0.2s, warmup: 0,
                   min_iterations: 3,
                   data: {{random: true, samples: 1, shapes: {{x: [1, 3, 48, 192]}}}}}}
        """)
    outcomes = pipeline_flow(str(path))
    assert {o["stage"]: o["status"] for o in outcomes} == dict.fromkeys(
        ["a", "build_like", "cpu_side", "validate_like", "bench"], "ran")
    runs = {t.name: t for t in _task_runs(path)}
    device = "gpu:rig-7:1"
    on_gpu = {n for n, t in runs.items() if device in t.tags}
    assert on_gpu == {"build_like", "validate_like", "bench"} and "gpu:rig-7:1" not in runs["cpu_side"].tags
    span = {n: (runs[n].start_time, runs[n].end_time) for n in runs}
    for other in on_gpu - {"bench"}:
        assert span[other][1] <= span["bench"][0] or span["bench"][1] <= span[other][0], \
            f"bench {span['bench']} overlaps {other} {span[other]}"
    # the CPU stage was not held back: it ran beside the GPU stages
    assert span["cpu_side"][0] < span["build_like"][1]


@pytest.mark.slow
def test_a_stages_own_output_reaches_prefects_task_log_and_its_directory(prefect_server, write_yaml):
    """What a stage's libraries print (TensorRT, ONNX Runtime) goes to its Prefect task's log line by line, at most
    isolate.OUTPUT_LINES of them, and whole into `stage.log` in its directory; a stage that crashes leaves its
    output in the task log, not only its last line."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterTaskRunId

    from trtflow.flows import isolate
    from trtflow.flows.pipeline_flow import pipeline_flow

    many = isolate.OUTPUT_LINES + 20
    path = write_yaml(f"""
        version: 1
        name: chatty
        model: models/cls.onnx
        stages:
          talk: {{kind: "tests.stage_fns:chatty", outputs: {{report: json}}, params: {{lines: {many}}}}}
          dies: {{kind: "tests.stage_fns:chatty", outputs: {{report: json}}, params: {{lines: 2, crash: true}}}}
        """)
    with pytest.raises(Exception, match="crashed"):
        pipeline_flow(str(path))
    runs = {t.name: t for t in _task_runs(path)}

    async def logs(task_run_id):
        out = []
        async with get_client() as client:
            while True:  # the API's pages are 200 entries at most
                page = await client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=[task_run_id])),
                                              offset=len(out), limit=200)
                out += page
                if len(page) < 200:
                    return [entry.message for entry in sorted(out, key=lambda e: e.timestamp)]

    def lines_of(name: str) -> list[str]:  # the API log handler sends in batches
        deadline = time.monotonic() + 30
        while True:
            got = [m for m in asyncio.run(logs(runs[name].id)) if m.startswith(f"{name} | ")]
            if got and ("more output" in got[-1] or "stderr" in got[-1]) or time.monotonic() > deadline:
                return got
            time.sleep(0.5)
    talk = lines_of("talk")
    assert talk[0] == "talk | builder says 0"
    assert len(talk) == isolate.OUTPUT_LINES + 1 and "more output" in talk[-1]
    kept = (Path(outcome_dir(path, "talk")) / isolate.STAGE_LOG).read_text().splitlines()
    assert len(kept) == many + 1 and kept[-1] == "a warning on stderr"
    assert lines_of("dies") == ["dies | builder says 0", "dies | builder says 1", "dies | a warning on stderr"]


def outcome_dir(path: Path, stage: str) -> Path:
    store = path.parent / ".trtflow" / stage
    return store / json.loads((store / "last.json").read_text())["key"]


@pytest.mark.slow
def test_a_script_without_a_main_guard_runs_its_pipeline_once(write_yaml, tmp_path):
    """multiprocessing imports the caller's main script again in each child it starts: a script calling
    pipeline_flow at top level ran its pipeline again inside every stage's process."""
    import os
    import subprocess
    import sys

    path = write_yaml(PIPE)
    script = tmp_path / "build_engines.py"
    script.write_text("print('top level', flush=True)\n"
                      "from trtflow.flows.pipeline_flow import pipeline_flow\n"
                      f"print([o['status'] for o in pipeline_flow({str(path)!r})], flush=True)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("top level") == 1, done.stdout
    assert "'ran'" in done.stdout.splitlines()[-1]


def test_a_stages_artifacts_are_posted_on_their_own_thread_and_a_failed_post_is_not_lost():
    """Issue #54: the next stage does not wait for a stage's artifacts (posted on a thread, in the context they were
    posted from); the flow run waits for all of them at its end and fails on a post that failed; unwinding waits
    only for the post under way."""
    import threading
    from contextvars import ContextVar

    from trtflow.flows.pipeline_flow import _Posting

    seen: ContextVar[str] = ContextVar("seen", default="")
    started, release, done = threading.Event(), threading.Event(), []

    def slow(what: str) -> None:
        started.set()
        release.wait(10)
        done.append((what, seen.get(), threading.current_thread().name))

    def broken() -> None:
        raise ConnectionError("the server went away")

    posting = _Posting()
    seen.set("task run 1")
    posting.post(slow, "summary")
    posting.post(broken)
    assert done == []  # the caller went on while the post waits
    release.set()
    error = posting.finish()
    assert isinstance(error, ConnectionError)
    assert done == [("summary", "task run 1", done[0][2])] and done[0][2].startswith("trtflow-artifacts")

    unwinding, started, release = _Posting(), threading.Event(), threading.Event()
    unwinding.post(slow, "under way")
    unwinding.post(slow, "queued")
    assert started.wait(10)
    threading.Timer(0.2, release.set).start()
    assert unwinding.finish(cancel=True) is None
    assert [d[0] for d in done[1:]] == ["under way"]


@pytest.mark.slow
def test_a_plot_the_summary_shows_inline_is_not_posted_again(prefect_server, write_yaml, capsys):
    """A stage's plots become image artifacts beside its summary, but for one the summary already shows inline (a
    data: URL, as parity's picture): that one is in Prefect once, inside the summary."""
    import base64

    path = write_yaml("""
version: 1
name: inlineplot
model: models/cls.onnx
stages:
  draw: {kind: "tests.stage_fns:inline_plot", outputs: {shown: file, other: file}}
""")
    assert cli.main(["run", str(path)]) == 0, capsys.readouterr()
    key = _key(path, "draw")
    store = path.parent / ".trtflow" / "draw"
    result = store / json.loads((store / "last.json").read_text())["key"]
    urls = {name: "data:image/png;base64," + base64.b64encode((result / f"{name}.png").read_bytes()).decode()
            for name in ("shown", "other")}
    (summary,) = _artifacts(key)
    assert urls["shown"] in summary.data
    posted = [a.data for i in range(2) for a in _artifacts(f"{key}-plot-{i}")]
    assert posted == [urls["other"]], [p[:60] for p in posted]
