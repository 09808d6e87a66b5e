"""Stage `benchmark` on a real engine pipeline (PP-OCR's classifier built by TensorRT-RTX): the built-in harness
where trtexec is absent, labelled with its runtime; the regression gate against a planted slower baseline; a
baseline from another machine skipped, not compared; trtexec options the detected version lacks refused."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from tests.assets import last_report
from tests.test_runner import run_all
from trtflow.errors import StageError, StageFailed
from trtflow.stages.trtexec import command

PIPE = """
version: 1
name: bench
model: models/cls.onnx
stages:
  prepare: {kind: prepare, target_opset: 17, input_shapes: {x: [1, 3, 48, 192]}, preflight: "off"}
  build:
    kind: build
    profiles:
      lines: {x: {min: [1, 3, 48, 48], opt: [4, 3, 48, 192], max: [8, 3, 48, 320]}}
  benchmark:
    kind: benchmark
    duration: 0.5s
    warmup: 0.1s
    shapes: [opt, max]
"""


def report_of(workdir) -> dict:
    return last_report(workdir / ".trtflow", "benchmark")


@pytest.mark.slow
@pytest.mark.tensorrt
def test_the_harness_times_every_engine_and_names_its_runtime(write_yaml, workdir, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no trtexec
    path = write_yaml(PIPE)
    assert run_all(path)["benchmark"] == "ran"
    report = report_of(workdir)
    assert report["tool"] == "built-in harness" and report["trtexec_looked"][0] == "PATH"
    assert [c["cell"] for c in report["cells"]] == ["prepare.lines.native.opt", "prepare.lines.native.max"]
    for cell, shape in zip(report["cells"], ([4, 3, 48, 192], [8, 3, 48, 320])):
        r = cell["result"]
        assert cell["shapes"] == {"x": shape}
        assert "onnxruntime-cpu" in r["runtime"] and "not a TensorRT number" in r["runtime"]
        assert r["tensorrt_version"] is None and r["gpu_compute_ms"] is None, "no TensorRT number is claimed"
        lat = r["latency_ms"]
        assert 0 < lat["min"] <= lat["median"] <= lat["p99"] <= lat["max"]
        assert r["throughput_qps"] == pytest.approx(cell["iterations"] / r["total_host_walltime_s"])
        assert cell["batch"] == shape[0] and cell["samples_per_s"] == pytest.approx(r["throughput_qps"] * shape[0])
    # (which shape is slower is not asserted: on a busy two-core machine the medians of 0.5 s runs cross)
    assert report["telemetry"]["available"] is False and "no NVIDIA GPU" in report["telemetry"]["why"]
    directory = workdir / ".trtflow" / "benchmark" / json.loads(
        (workdir / ".trtflow" / "benchmark" / "last.json").read_text())["key"]
    assert (directory / "plots" / "latency.png").stat().st_size > 10_000
    assert "not a TensorRT number" in (directory / "summary.md").read_text()


@pytest.mark.slow
@pytest.mark.tensorrt
def test_the_gate_fails_on_a_planted_regression_and_skips_other_machines(write_yaml, workdir):
    path = write_yaml(PIPE)
    run_all(path)
    measured = report_of(workdir)
    # a baseline from a day the engine was twenty times faster: far beyond what a busy machine makes of the two
    # runs' own spread (three times faster left a cell within the bound when the first run was slowed down)
    faster = json.loads(json.dumps(measured))
    for cell in faster["cells"]:
        cell["result"]["throughput_qps"] *= 20
    (workdir / "faster.json").write_text(json.dumps(faster))
    gated = PIPE + "    gate: {baseline: faster.json, throughput_regression: 25%}\n"
    path = write_yaml(gated)
    with pytest.raises(StageFailed) as info:
        run_all(path)
    message = str(info.value)
    assert message.startswith("benchmark: 2 regression(s) against ") and "faster.json" in message
    now = report_of(workdir)["cells"][0]["result"]["throughput_qps"]
    assert (f"prepare.lines.native.opt: throughput_qps {now:.4g} qps against the baseline's "
            f"{faster['cells'][0]['result']['throughput_qps']:.4g} qps") in message
    assert "beyond the bound 25%" in message

    elsewhere = json.loads(json.dumps(faster))
    for cell in elsewhere["cells"]:
        cell["environment"]["host"] = "another CPU x64"
    (workdir / "faster.json").write_text(json.dumps(elsewhere))
    assert run_all(path)["benchmark"] == "ran", "a baseline from another machine is not compared"
    gate = report_of(workdir)["gate"]
    assert gate["violations"] == [] and gate["skipped"] == [
        "prepare.lines.native.opt: the baseline was measured elsewhere (host differ)",
        "prepare.lines.native.max: the baseline was measured elsewhere (host differ)"]


@pytest.mark.slow
@pytest.mark.tensorrt
def test_baseline_previous_is_the_last_accepted_run(write_yaml, workdir):
    path = write_yaml(PIPE + "    gate: {baseline: previous, throughput_regression: 95%}\n")
    run_all(path)
    first = report_of(workdir)
    assert len(first["gate"]["skipped"]) == 2 and "no baseline" in first["gate"]["skipped"][0]
    (accepted,) = (workdir / ".trtflow" / "shared" / "benchmark").glob("*.json")
    assert set(json.loads(accepted.read_text())) == {"prepare.lines.native.opt", "prepare.lines.native.max"}
    run_all(path, force=["benchmark"])
    second = report_of(workdir)
    assert second["gate"]["skipped"] == [] and second["gate"]["violations"] == []


def test_no_trtexec_when_it_is_required_is_one_line(write_yaml, workdir, tmp_path):
    from trtflow.artifact import Artifact, Inputs
    from trtflow.pipelines.params.benchmark import BenchmarkStage
    from trtflow.stages.benchmark import stage as benchmark
    shutil.copy(workdir / "models" / "cls.onnx", tmp_path / "m.onnx")
    params = BenchmarkStage.model_validate({"kind": "benchmark", "tool": "trtexec", "trtexec": "/nowhere/trtexec"})
    with pytest.raises(StageError) as info:
        benchmark.run(params, Inputs({"models": [Artifact(tmp_path / "m.onnx", "onnx", "d", "fp16")]}), tmp_path)
    assert str(info.value) == ("benchmark: tool: trtexec, but no trtexec was found (looked in: /nowhere/trtexec); "
                               "give its path as 'trtexec:' or use tool: auto for the built-in harness")


@pytest.mark.slow
@pytest.mark.tensorrt
def test_an_engine_this_machine_cannot_run_is_not_given_to_trtexec(write_yaml, workdir, tmp_path):
    stub = tmp_path / "trtexec"
    stub.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/calls.txt\n"
                    "echo '&&&& RUNNING TensorRT.trtexec [TensorRT v101601] # trtexec --help'\n")
    stub.chmod(0o755)
    path = write_yaml(PIPE.replace("    shapes: [opt, max]\n", f"    shapes: [opt]\n    trtexec: {stub}\n"))
    run_all(path)
    (cell,) = report_of(workdir)["cells"]
    assert "not a TensorRT number" in cell["result"]["runtime"]
    assert cell["result"]["warnings"][0].startswith("trtexec not used: no NVIDIA GPU on this machine")
    assert (tmp_path / "calls.txt").read_text().split() == ["--help"], "trtexec only asked its version"
    path = write_yaml(PIPE.replace("    shapes: [opt, max]\n", f"    tool: trtexec\n    trtexec: {stub}\n"))
    with pytest.raises(StageError, match=r"benchmark: engine 'prepare.lines.native' cannot run here, so trtexec "
                                         r"cannot time it: no NVIDIA GPU on this machine"):
        run_all(path)


def test_options_the_detected_trtexec_lacks_are_refused():
    with pytest.raises(StageError, match=r"trtexec_args --fp16: the detected trtexec \(TensorRT 11.0.0\) does not "
                                         r"have --fp16: TensorRT 11 takes precision from the ONNX"):
        command.check_args(["--fp16"], "11.0.0")
    assert command.check_args(["--fp16", "--useCudaGraph"], "10.3.0") == []
    assert command.check_args(["--useCudaGraph"], "11.1.0") == ["--useCudaGraph is TensorRT 11's default already"]


def _stand_in(tmp_path, data, log: str, code: int = 0):
    """A script that answers as trtexec did in a real published run: its log, its exported files, its exit code."""
    stub = tmp_path / "trtexec"
    stub.write_text(f"""#!/bin/sh
echo "$@" >> {tmp_path}/calls.txt
case "$1" in --help) echo '&&&& RUNNING TensorRT.trtexec [TensorRT v101601] # trtexec --help'; exit 0;; esac
for a in "$@"; do
  case "$a" in
    --exportTimes=*) cp {data}/fuzzylabs-trt10.4.0-alexnet-exportTimes.json "${{a#*=}}";;
    --exportProfile=*) cp {data}/fuzzylabs-trt10.4.0-alexnet-exportProfile.json "${{a#*=}}";;
    --exportLayerInfo=*) cp {data}/fuzzylabs-trt10.4.0-alexnet-exportLayerInfo-detailed.json "${{a#*=}}";;
  esac
done
cat {data}/{log}
exit {code}
""")
    stub.chmod(0o755)
    return stub


@pytest.fixture
def stand_in_setup(monkeypatch):
    """trtexec cannot run here (no GPU): the stand-in replays real published runs (TensorRT 10.16.1 and 8.6.1 logs,
    10.4.0 exports) and the engine's validity check is told "valid". This proves the plumbing — the command line,
    the run, the log kept, the parse, the exports read — and nothing about TensorRT itself."""
    from tests.assets import require_shared_trtexec
    from trtflow.stages.trt import runtime
    data = require_shared_trtexec()
    monkeypatch.setenv("TRTFLOW_IN_PROCESS", "1")  # the stage in this process, where the validity check is patched
    monkeypatch.setattr(runtime, "can_run", lambda module, plan: (True, ""))
    return data


@pytest.mark.slow
@pytest.mark.tensorrt
def test_the_trtexec_path_with_a_stand_in(write_yaml, workdir, tmp_path, stand_in_setup):
    stub = _stand_in(tmp_path, stand_in_setup, "hackathon-trt10.16.1-onnx-default.log")
    path = write_yaml(PIPE.replace("    shapes: [opt, max]\n", f"    shapes: [opt]\n    trtexec: {stub}\n"
                                   "    trtexec_args: [--useSpinWait]\n"))
    run_all(path)
    report = report_of(workdir)
    assert report["tool"] == "trtexec" and report["tensorrt_version"] == "10.16.1"
    (cell,) = report["cells"]
    assert cell["result"]["runtime"] == "trtexec (TensorRT 10.16.1)" and cell["result"]["throughput_qps"] == 15374.3
    assert cell["slowest_layers"][0]["average_ms"] == max(x["average_ms"] for x in cell["slowest_layers"])
    assert cell["iterations"] == 6039, "the latency plot is drawn from --exportTimes"
    call = (tmp_path / "calls.txt").read_text().splitlines()[-1].split()
    assert call[0].startswith("--loadEngine=") and call[0].endswith("prepare.lines.native/engine.plan")
    assert "--shapes=x:4x3x48x192" in call and "--warmUp=100" in call and "--duration=1" in call
    assert "--separateProfileRun" in call and "--percentile=90,95,99" in call and call[-1] == "--useSpinWait"


@pytest.mark.slow
@pytest.mark.tensorrt
def test_trtexec_failing_is_one_line_quoting_its_error(write_yaml, workdir, tmp_path, stand_in_setup):
    stub = _stand_in(tmp_path, stand_in_setup, "trt861_yolov8s_wrong_shape_failed.log", code=1)
    path = write_yaml(PIPE.replace("    shapes: [opt, max]\n", f"    shapes: [opt]\n    trtexec: {stub}\n"))
    with pytest.raises(StageFailed) as info:
        run_all(path)
    message = str(info.value)
    assert message.startswith("benchmark: 1 of 1 measurement(s) failed; prepare.lines.native.opt: the log holds no "
                              "performance summary") and "trtexec says 'Error[3]: " in message and "\n" not in message


@pytest.mark.slow
def test_the_harness_feeds_valid_inputs_and_a_failing_cell_fails_alone(tmp_path):
    """A BERT-style embedding table: random integers reached past its two rows in every cell (`idx=6 must be
    within the inclusive range [-2,1]`); the harness now keeps them within the table, or within `data.ranges`.
    Each cell runs in its own process: one that ONNX Runtime fails on fails with the harness's own words and its
    log, and the other cell still gets numbers."""
    from tests.graphs import embedding_table
    from trtflow.artifact import Artifact, Inputs
    from trtflow.pipelines.params.benchmark import BenchmarkStage
    from trtflow.stages.benchmark import stage as benchmark

    small, large = tmp_path / "small.onnx", tmp_path / "large.onnx"
    onnx.save(embedding_table(2), str(small))
    onnx.save(embedding_table(30), str(large))
    models = [Artifact(small, "onnx", "s", "token_types"), Artifact(large, "onnx", "l", "vocab")]

    def run(out, **kw):
        out.mkdir()
        params = BenchmarkStage.model_validate({"kind": "benchmark", "tool": "builtin", "duration": "0.05s",
                                                "warmup": 0, "min_iterations": 25, **kw})
        return benchmark.run(params, Inputs({"models": models}), out)

    result = run(tmp_path / "a")
    report = json.loads(result.outputs["report"].read_text())
    assert [c["result"]["has_summary"] for c in report["cells"]] == [True, True]
    assert all(c["iterations"] >= 25 for c in report["cells"]), "percentiles from enough samples"
    assert all(c["samples_per_s"] == pytest.approx(c["result"]["throughput_qps"] * c["batch"])
               for c in report["cells"])

    with pytest.raises(StageFailed) as info:  # indices up to 20: the 2-row table cannot take them
        run(tmp_path / "b", data={"random": True, "ranges": {"token_type_ids": [0, 20]}})
    message = str(info.value)
    assert message.startswith("benchmark: 1 of 2 measurement(s) failed; token_types.opt: variant 'token_types': "
                              "the built-in harness (ONNX Runtime on CPU) failed: "), message
    assert "trtexec" not in message and "(log: " in message
    log = Path(message.split("(log: ")[1].split(")")[0])
    assert "out of" in log.read_text() or "bounds" in log.read_text()
    cells = json.loads((tmp_path / "b" / "report.json").read_text())["cells"]
    assert cells[1]["result"]["has_summary"] and cells[1]["result"]["throughput_qps"] > 0


def test_a_harness_process_that_dies_is_one_failed_cell(tmp_path, monkeypatch):
    """The wording for a child killed by a signal (as ONNX Runtime 1.32's SIGSEGV on a ViT FP16 variant with its
    graph optimizations on). The process here is a stand-in: what is checked is the parent's report of it."""
    import numpy as np

    from trtflow.stages.ort import harness

    monkeypatch.setattr(harness.child, "call", lambda *a, **k: harness.child.Crashed(-11, "Segmentation"))
    result = harness.benchmark(tmp_path / "m.onnx", {"x": np.zeros(2, np.float32)}, 0, 0, 1, 1, tmp_path / "f",
                               tmp_path / "h.log")
    assert result.status == "failed" and not result.has_summary
    assert result.error == f"the built-in harness (ONNX Runtime on CPU) crashed (SIGSEGV) (log: {tmp_path / 'h.log'})"
    assert result.to_json()["note"] == result.error


@pytest.mark.slow
def test_min_iterations_overruling_duration_is_said_before_and_after(tmp_path, monkeypatch):
    """`duration: 1s` took 117.8 s on ViT-B/16 (20 min_iterations of ~1.7 s on the CPU harness), and nothing said
    why. Now the estimate is on the status line before the timed runs, when it is long (LONG_S, lowered here), and
    the warning says min_iterations overruled duration; a duration that decides says nothing."""
    from tests.graphs import matmul_stack
    from trtflow import progress
    from trtflow.artifact import Artifact, Inputs
    from trtflow.pipelines.params.benchmark import BenchmarkStage
    from trtflow.stages.benchmark import stage as benchmark

    model = Artifact(matmul_stack(tmp_path / "blocks.onnx"), "onnx", "m", "vit")
    monkeypatch.setattr(benchmark, "LONG_S", 0.0)
    heard: list[str] = []

    def run(out: Path, **kw) -> tuple[dict, list[str]]:
        out.mkdir()
        params = BenchmarkStage.model_validate({"kind": "benchmark", "tool": "builtin", "warmup": 0, **kw})
        with progress.listening(lambda what, done, total: heard.append(what)):
            result = benchmark.run(params, Inputs({"models": [model]}), out)
        return json.loads(result.outputs["report"].read_text())["cells"][0], result.warnings

    cell, warnings = run(tmp_path / "a", duration="0.01s", min_iterations=12)
    assert cell["iterations"] == 12
    (said,) = [w for w in warnings if "overruled" in w]
    assert said.startswith("vit.opt: min_iterations 12 overruled duration 0.01s: 12 timed runs of ~"), said
    assert any(w.startswith("benchmarking vit.opt: about ") and "min_iterations 12 runs of ~" in w for w in heard), \
        heard
    heard.clear()
    cell, warnings = run(tmp_path / "b", duration="0.3s", min_iterations=2)
    assert cell["iterations"] > 2 and not any("overrule" in w for w in warnings + heard), (warnings, heard)
