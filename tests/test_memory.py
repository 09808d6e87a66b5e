"""Issue #69, item 5: memory bounded by prediction. Before ONNX Runtime runs a model at a shape, its peak is
estimated from the graph (stages/ort/memory.py); a batch over the budget (TRTFLOW_MEMORY_BUDGET) runs in parts with
the same outputs, a single sample over it is refused in one line naming the shape and the estimate; calibration
holds no more samples than fit; init says what its profile's max costs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from trtflow import procfs, settings
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import SpecError, StageError, StageFailed
from trtflow.stages.ort import calibration, memory, runner

ROOT = Path(__file__).resolve().parents[1]
BATCH, SAMPLES = 32, 32000  # two seconds of 16 kHz audio, a batch of 32: the profile's max


def audio_model(path: Path, seed: int = 0, noise: float = 0.0) -> Path:
    """A speech-quality model in small: audio [batch, samples] -> Conv1d 1->16 -> ReLU -> Conv1d 16->16 (stride 2)
    -> ReLU -> mean over time -> Gemm -> score [batch, 1]. `noise` perturbs the weights (a candidate that differs)."""
    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        value = rng.standard_normal(shape) * 0.3
        return numpy_helper.from_array((value * (1 + noise * rng.standard_normal(shape))).astype(np.float32), name)

    nodes = [helper.make_node("Unsqueeze", ["audio", "axis1"], ["x"], name="unsqueeze"),
             helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[4, 4]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[4, 4], strides=[2]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("ReduceMean", ["r2"], ["m"], name="mean", axes=[2], keepdims=0),
             helper.make_node("Gemm", ["m", "w3"], ["score"], name="head")]
    graph = helper.make_graph(nodes, "speech_quality",
                              [helper.make_tensor_value_info("audio", TP.FLOAT, ["batch", "samples"])],
                              [helper.make_tensor_value_info("score", TP.FLOAT, ["batch", 1])],
                              [numpy_helper.from_array(np.array([1], np.int64), "axis1"), w("w1", 16, 1, 9),
                               w("w2", 16, 16, 9), w("w3", 16, 1)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def _feed(rows: int = BATCH) -> dict[str, np.ndarray]:
    return {"audio": np.random.default_rng(1).standard_normal((rows, SAMPLES)).astype(np.float32)}


def test_the_estimate_is_the_graphs_liveness(tmp_path):
    """x -> a = relu(x) -> b = relu(a) -> c = a + b: a is alive while b and c are made, so the most alive at once is
    a + b + c; the inputs are the caller's and the weights are apart."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 1000])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["n", 1000])],
                              [numpy_helper.from_array(np.zeros((10, 10), np.float32), "unused")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    e = memory.Graph.of(model).estimate({"x": [8, 1000]})
    row = 8 * 1000 * 4
    assert (e.activations, e.inputs, e.outputs, e.weights, e.largest, e.guessed) == (3 * row, row, row, 400, row, 0)
    assert e.run == int(3 * row * memory.ARENA) + memory.SCRATCH


def test_the_budget_setting_takes_a_size_or_a_share(monkeypatch):
    for raw, want in (("8GiB", settings.Budget(size=8 * 2**30)), ("512M", settings.Budget(size=2**29)),
                      ("25%", settings.Budget(share=0.25)), ("100000000", settings.Budget(size=100000000))):
        monkeypatch.setenv("TRTFLOW_MEMORY_BUDGET", raw)
        assert settings.MEMORY_BUDGET.get() == want
    monkeypatch.delenv("TRTFLOW_MEMORY_BUDGET")
    assert settings.MEMORY_BUDGET.get() == settings.Budget(share=0.5)
    for raw in ("0%", "150%", "10MiB", "lots", "-1G"):
        monkeypatch.setenv("TRTFLOW_MEMORY_BUDGET", raw)
        with pytest.raises(SpecError, match="TRTFLOW_MEMORY_BUDGET=.* is not a size such as 8GiB"):
            settings.MEMORY_BUDGET.get()


def test_a_batch_over_the_budget_runs_in_parts_with_the_same_outputs(tmp_path, monkeypatch):
    sess = runner.session(audio_model(tmp_path / "m.onnx"))
    feed = _feed()
    want = runner.whole(sess, feed)
    graph = memory.graph_of(sess)
    whole, one = graph.estimate({"audio": [BATCH, SAMPLES]}), graph.estimate({"audio": [1, SAMPLES]})
    now = procfs.resident()  # held still: a test worker's moves between reads (see the calibration test below)
    monkeypatch.setattr(procfs, "resident", lambda: now)
    monkeypatch.setenv("TRTFLOW_MEMORY_BUDGET", str(now + one.run + (whole.run - one.run) // 3))
    memory.PLANNED.clear()
    got = runner.run(sess, feed)
    (plan,) = memory.PLANNED
    assert 1 < plan.rows < BATCH and plan.whole.shapes == {"audio": [BATCH, SAMPLES]}
    assert plan.predicted <= plan.resident + plan.room.bytes  # each part, as predicted, fits
    assert got.keys() == want.keys() and np.array_equal(got["score"], want["score"])


CHILD = """
import json, os, sys
from pathlib import Path
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageFailed
from trtflow.pipelines.params.validate import ValidateStage
from trtflow import procfs
from trtflow.stages.ort import memory
from trtflow.stages.validate import stage
from trtflow.pipelines.kinds import KINDS
import importlib
for module in KINDS["validate"].preload:  # as the fork server imports them ahead of a validate stage's process
    importlib.import_module(module)
reference, candidate, out, room = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
budget = procfs.resident() + room  # what the stage's process may grow to, from here
os.environ["TRTFLOW_MEMORY_BUDGET"] = str(budget)
params = ValidateStage.model_validate({"kind": "validate", "locate_first_bad_layer": False,
                                       "data": {"random": True, "samples": 2, "shapes": {"audio": [%d, %d]}}})
try:
    result = stage.run(params, Inputs({"reference": Artifact(reference, "onnx", "ref", "prepare"),
                                       "models": [Artifact(candidate, "onnx", "cand", "variant")]}), out)
except StageFailed as failed:
    result = failed.result
print(json.dumps({"peak": procfs.peak_resident(), "budget": budget, "report": str(result.outputs["report"]),
                  "rows": min(p.rows for p in memory.PLANNED)}))
""" % (BATCH, SAMPLES)


def _validate(tmp_path: Path, name: str) -> tuple[Path, Path, dict]:
    from trtflow.pipelines.params.validate import ValidateStage
    from trtflow.stages.validate import stage

    reference, candidate = audio_model(tmp_path / "ref.onnx"), audio_model(tmp_path / "cand.onnx", noise=0.01)
    (tmp_path / name).mkdir()
    params = ValidateStage.model_validate({"kind": "validate", "locate_first_bad_layer": False,
                                           "data": {"random": True, "samples": 2,
                                                    "shapes": {"audio": [BATCH, SAMPLES]}}})
    inputs = Inputs({"reference": Artifact(reference, "onnx", "ref", "prepare"),
                     "models": [Artifact(candidate, "onnx", "cand", "variant")]})
    try:
        result = stage.run(params, inputs, tmp_path / name)
    except StageFailed as failed:
        result = failed.result
    return reference, candidate, json.loads(result.outputs["report"].read_text())


@pytest.mark.slow
def test_validate_runs_a_max_batch_within_a_low_budget_with_the_same_verdict(tmp_path):
    """The budget set low through the setting: validate's process stays under it (its peak measured: VmHWM), the
    max batch run in parts, and the report's numbers are the ones the whole batch gives. The budget is 160 MiB over
    what the process holds once imported; the whole batch needs about 300 MiB more (ONNX Runtime's arena)."""
    reference, candidate, want = _validate(tmp_path, "whole")
    env = {k: v for k, v in os.environ.items() if k != "TRTFLOW_MEMORY_BUDGET"}
    (tmp_path / "parts").mkdir()
    done = subprocess.run([sys.executable, "-c", CHILD, str(reference), str(candidate), str(tmp_path / "parts"),
                           str(160 * 2**20)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["peak"] <= found["budget"], (memory.gib(found["peak"]), memory.gib(found["budget"]))
    assert 1 <= found["rows"] < BATCH
    got = json.loads(Path(found["report"]).read_text())
    assert [c["accuracy"] for c in got["candidates"]] == [c["accuracy"] for c in want["candidates"]]
    assert got["candidates"][0]["shapes"] == [{"audio": [BATCH, SAMPLES]}]


def test_a_sample_over_the_budget_is_refused_in_one_line(tmp_path, monkeypatch):
    from trtflow.pipelines.params.validate import ValidateStage
    from trtflow.stages.validate import stage

    reference, candidate = audio_model(tmp_path / "ref.onnx"), audio_model(tmp_path / "cand.onnx", noise=0.01)
    monkeypatch.setenv("TRTFLOW_MEMORY_BUDGET", str(procfs.resident() + 8 * 2**20))  # less than one sample's run
    params = ValidateStage.model_validate({"kind": "validate", "data": {"random": True, "samples": 1,
                                                                        "shapes": {"audio": [BATCH, SAMPLES]}}})
    (tmp_path / "v").mkdir()
    with pytest.raises(StageError) as refused:
        stage.run(params, Inputs({"reference": Artifact(reference, "onnx", "ref", "prepare"),
                                  "models": [Artifact(candidate, "onnx", "cand", "variant")]}), tmp_path / "v")
    line = str(refused.value)
    assert "\n" not in line and not isinstance(refused.value, StageFailed)
    assert f"at audio [1, {SAMPLES}] needs an estimated " in line, line
    assert f"a batch of {BATCH} runs in parts, and a single sample does not fit" in line, line
    assert "TRTFLOW_MEMORY_BUDGET" in line and "give the profile a smaller max" in line, line


def test_calibration_holds_what_fits_and_splits_a_batch_that_does_not(tmp_path, monkeypatch):
    """Calibration folds its statistics in every few samples (memory flat in their count); under the budget it
    holds fewer, and a sample whose batch does not fit is calibrated in parts: MinMax ranges come out the same."""
    model = audio_model(tmp_path / "m.onnx")
    feeds = [_feed(8) for _ in range(3)]

    def ranges(folder: str) -> dict:
        (tmp_path / folder).mkdir()
        cal = calibration.calibrate(model, ["Conv", "Gemm"], calibration.Rule("minmax"), iter(feeds), len(feeds),
                                    tmp_path / folder, 16)
        assert cal.samples == len(feeds)
        return {k: tuple(np.asarray(x, np.float64).ravel().tolist() for x in v.range_value)
                for k, v in cal.ranges().data.items()}

    want = ranges("whole")
    sess = runner.session(tmp_path / "whole" / "augmented.onnx")
    graph = memory.graph_of(sess)
    one = graph.estimate({"audio": [1, SAMPLES]})
    each = calibration.held_per_sample(one)
    # the process's own memory held at what it is now: in a test worker it moves by more than a few samples' worth
    # between two reads (garbage collection, other tests' arenas); the budget's arithmetic is what is checked here
    # (test_validate_runs_a_max_batch_within_a_low_budget_with_the_same_verdict measures real peaks in a child)
    now = procfs.resident()
    monkeypatch.setattr(procfs, "resident", lambda: now)
    monkeypatch.setenv("TRTFLOW_MEMORY_BUDGET", str(now + one.run + 3 * each))
    parts = list(calibration.fitting(sess, feeds[0]))
    assert len(parts) > 1 and sum(len(p["audio"]) for p in parts) == 8
    assert calibration.held(sess, parts[0], 16) < 16
    assert ranges("parts") == want


def test_init_says_what_the_profiles_max_costs_and_warns_past_the_machine(tmp_path):
    audio_model(tmp_path / "model.onnx")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRTFLOW_")}
    env["TRTFLOW_MEMORY_BUDGET"] = "1%"
    done = subprocess.run([sys.executable, "-m", "trtflow.flows.cli", "init", "model.onnx", "--shape",
                           "audio=1:8:32x16000:32000:16000000"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "pipeline.yaml").read_text()
    assert "# memory: ONNX Runtime at the max (audio [32, 16000000]) needs an estimated" in text
    assert "# time on this CPU: one FP32 pass at audio [1, 32000] took" in text
    assert "WARNING: the profile's max (audio [32, 16000000]) needs an estimated" in text
    warning = [line for line in done.stdout.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "more than this machine has available" in warning[0], done.stdout
    assert "one sample needs" in warning[0] and "give --shape with a smaller max" in warning[0]
