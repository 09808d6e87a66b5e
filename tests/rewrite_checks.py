"""What every rewrite test asserts (issue #68): the rule applies to the node, ONNX Runtime gives the same outputs
before and after within `atol`, the refused op is gone, and TensorRT-RTX parses and builds the rewritten model
(in a child process: stages/trt/preflight.py) where the original did not parse."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from trtflow.stages.onnx.rewrites.apply import apply
from trtflow.stages.onnx.rewrites.rule import Rewrite


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_rewrite(model: onnx.ModelProto, node_name: str, rule: Rewrite, feeds: dict[str, np.ndarray],
                  atol: float, tmp_path: Path, parses_before: bool = False) -> float:
    """The rewritten model's max abs difference from the original on `feeds` (asserted <= atol), after asserting
    what the module says. Returns the difference."""
    from trtflow.stages.trt.preflight import run_preflight

    onnx.checker.check_model(model)
    new = apply(model, node_name, rule)
    onnx.checker.check_model(new)
    old_op = next(n for n in model.graph.node if n.name == node_name).op_type
    assert old_op not in {n.op_type for n in new.graph.node}, f"{old_op} is still in the rewritten model"
    before, after = run_ort(model, feeds), run_ort(new, feeds)
    diff = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
               for a, b in zip(before, after))
    assert diff <= atol, f"{rule.name}: max abs diff {diff} > {atol}"
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    original = tmp_path / "original.onnx"
    onnx.save(model, original)
    if not parses_before:
        assert not run_preflight(original).parsed, "the original model already parses: nothing to prove"
    rewritten = tmp_path / "rewritten.onnx"
    onnx.save(new, rewritten)
    report = run_preflight(rewritten, shapes)
    assert report.ran and report.parsed, report.failures
    assert report.trial_build is not None and report.trial_build.ok, report.trial_build
    return diff
