"""bench/unsupported_ops.py (issue #68) cannot rot silently: its case runner, on one case prepare rewrites, one no
rewrite fixes (which offload then cuts out of its sandwich of ops TensorRT takes) and one variant offload cuts between
TensorRT pieces, gives the rows docs/benchmarks.md reports (the rule, its measured difference, trtflow's reason, the
offloaded nodes, the chain's pieces and its difference from the whole model); a chain all on ONNX Runtime counts as
not fixed; every case of the zoo still makes a model the ONNX checker takes, and its sandwich one too, computing the
bare model's outputs between a Relu and a Sigmoid."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.assets import load_bench


def test_the_sandwich_puts_the_bare_model_between_a_relu_and_a_sigmoid():
    import onnxruntime as ort

    bench = load_bench("unsupported_ops")
    cases = {c.name: c for c in bench.CASES}
    for case in bench.CASES:
        onnx.checker.check_model(bench.sandwich(case.build()), full_check=True)

    bare = cases["BitShift (uint8)"].build()
    made = bench.sandwich(bare)
    edges = [(vi.name, vi.type.tensor_type.elem_type, [d.dim_value for d in vi.type.tensor_type.shape.dim])
             for vi in [*made.graph.input, *made.graph.output]]
    assert edges == [("x", onnx.TensorProto.FLOAT, [4]), ("y", onnx.TensorProto.FLOAT, [4])], edges
    assert [n.op_type for n in made.graph.node] == ["Relu", "Floor", "Cast", "BitShift", "Cast", "Sigmoid"]
    x = np.array([-1.0, 0.5, 2.7, 7.9], np.float32)
    got = ort.InferenceSession(made.SerializeToString()).run(None, {"x": x})[0]
    shifted = ort.InferenceSession(bare.SerializeToString()).run(None, {"x": np.array([0, 0, 2, 7], np.uint8)})[0]
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-shifted.astype(np.float32))), rtol=1e-6)

    made = bench.sandwich(cases["ai.onnx.ml LinearClassifier"].build())  # an INT64 output: Cast, then Sigmoid
    assert [n.op_type for n in made.graph.node] == ["Relu", "LinearClassifier", "Cast", "Sigmoid", "Sigmoid"]
    assert [o.name for o in made.graph.output] == ["label", "scores"]
    assert {o.type.tensor_type.elem_type for o in made.graph.output} == {onnx.TensorProto.FLOAT}


@pytest.mark.slow
@pytest.mark.tensorrt
def test_the_case_runner_reports_the_rule_its_difference_and_the_reason(tmp_path):
    bench = load_bench("unsupported_ops")
    cases = {c.name: c for c in bench.CASES}
    assert len(cases) == len(bench.CASES), "two cases share a name"
    for case in bench.CASES:
        onnx.checker.check_model(case.build())

    fixed = bench.run_case(cases["Det 2x2"], tmp_path / "det")
    assert (fixed.hit, fixed.outcome, fixed.fixed_by) == ("parse", "rewrite", "det-cofactors"), fixed
    assert fixed.parser.startswith("UNSUPPORTED_NODE: ")
    assert fixed.max_abs is not None and fixed.max_abs < 1e-5, fixed
    assert fixed.parses and fixed.builds and fixed.reason == "" and fixed.offload == "" and not fixed.on_ort
    assert not fixed.sandwiched

    random = bench.run_case(cases["Dropout training_mode=1 ratio=0.5"], tmp_path / "dropout")
    assert (random.hit, random.outcome, random.fixed_by, random.max_abs) == ("parse", "offload", "offload", None), \
        random
    assert "TensorRT does not support the Dropout operator in training mode" in random.parser
    assert random.reason.startswith("the parser refuses this 'Dropout' node"), random.reason
    assert "trtflow's rewrite was not kept (dropout-ratio0 does not apply: ratio 0.5" in random.reason
    assert "register a TensorRT plugin" not in random.reason and "\n" not in random.reason
    assert not random.parses and random.builds is None
    # no rewrite: prepare again with offload: onnxruntime, on the Dropout between a Relu and a Sigmoid, marks the
    # Dropout alone; the Relu and the Sigmoid are TensorRT pieces that build
    assert random.sandwiched
    assert (random.offload, random.on_ort, random.pieces, random.trt_built) == ("ok", ["dropout0 (Dropout)"],
                                                                                 "trt→ort→trt", "2/2"), random
    assert random.random_op and random.chain_max_abs == 0.0, random

    between = bench.run_case(cases["Relu, ai.onnx.ml LinearClassifier, Sigmoid"], tmp_path / "between")
    assert (between.outcome, between.on_ort, between.pieces, between.trt_built) == \
        ("offload", ["linearclassifier0 (LinearClassifier)"], "trt→ort→trt", "2/2"), between
    assert between.chain_max_abs is not None and between.chain_max_abs < 1e-5 and not between.sandwiched, between

    # a chain all on ONNX Runtime (as a single-op model's would be) is no fix: no engine to build or ship
    whole = bench.Row("X whole", "parse", bench.STANDARD, parser="UNSUPPORTED_NODE: x", reason="no importer",
                      offload=bench.ALL_ORT, sandwiched=True, on_ort=["x0 (X)"], pieces="ort only", trt_built="0/0",
                      chain_max_abs=0.0)
    table = bench.markdown([fixed, random, whole])
    assert "| Det 2x2 | UNSUPPORTED_NODE: " in table and "| det-cofactors | " in table
    assert "| offload (no rewrite: the parser refuses this 'Dropout' node" in table
    assert "| dropout0 (Dropout) | trt→ort→trt (TensorRT built 2/2) | 0 (random op: shape and type only) |" in table
    assert f"| none: no importer; offload: {bench.ALL_ORT} |" in table and "| x0 (X) | ort only | 0 |" in table
    lines = bench.summary([fixed, random, whole])
    assert lines[0] == ("3 standard-op cases (3 refused by the parser, 0 parse and fail the trial build): fixed by "
                        "rewrite 1 (33%), by prepare's simplification 0 (0%), by offload (TensorRT pieces built, the "
                        "chain exact) 1 (33%), none 1 (33%) (of them offloaded all to ONNX Runtime 1); of the "
                        "parser's refusals, fixed by rewrite 1 (33%)"), lines[0]
    assert lines[1] == ("fixed by rewrite, simplification or offload 2 (67%); the issue's bar, >= 80% by rewrite or "
                        "offload: not met"), lines[1]
    assert f"  none, 1: offload: {bench.ALL_ORT}: X whole" in lines, lines
    assert bench.summary([fixed, random])[1].endswith("2 (100%); the issue's bar, >= 80% by rewrite or offload: met")
