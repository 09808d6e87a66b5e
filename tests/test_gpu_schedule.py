"""Issue #70 Build 5: whether a stage uses the GPU is its kind's declaration (`Kind.gpu`), not read off its key:
prepare's and precision's trial builds take the GPU as a build does, so the flow never starts one beside a
benchmark timing that GPU (and never starts a benchmark beside one)."""
from __future__ import annotations

from pathlib import Path

from trtflow.flows.pipeline_flow import _Schedule, stage_gpu
from trtflow.flows.runner import Runner
from trtflow.flows.store import LocalStore
from trtflow.pipelines.loader import load_pipeline

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "squeezenet-cls" / "pipeline.yaml"


def _runner(tmp_path: Path, *overrides: str) -> Runner:
    return Runner(load_pipeline(EXAMPLE, list(overrides)), store=LocalStore(tmp_path / "store"))


def test_trial_builds_take_the_gpu_as_builds_do(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    runner = _runner(tmp_path)
    on_gpu = {name for name in runner.graph.nodes if stage_gpu(runner, name)}
    assert on_gpu == {"prepare", "fp16", "build", "validate", "benchmark"}, on_gpu  # parity, int8, release: CPU
    off = _runner(tmp_path, "stages.prepare.preflight=off", "stages.fp16.preflight=off")
    assert stage_gpu(off, "prepare") is None and stage_gpu(off, "fp16") is None


def test_no_stage_on_a_gpu_shares_it_with_a_running_benchmark(tmp_path):
    runner = _runner(tmp_path)
    schedule = _Schedule.__new__(_Schedule)  # its scheduling rule alone (no Prefect server asked for limits)
    schedule.runner = runner
    schedule.gpu = {name: stage_gpu(runner, name) for name in runner.graph.nodes}
    schedule.running = {"benchmark": None}
    assert not schedule._gpu_free("prepare") and not schedule._gpu_free("fp16")  # trial builds wait
    assert schedule._gpu_free("parity") and schedule._gpu_free("int8")
    schedule.running = {"fp16": None}
    assert not schedule._gpu_free("benchmark") and schedule._gpu_free("build")
