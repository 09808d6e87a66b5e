"""bench/unsupported_ops.py (issue #68) cannot rot silently: its case runner, on one case prepare rewrites and one it
cannot fix, gives the rows docs/benchmarks.md reports (the rule, its measured difference, trtflow's reason); and every
case of the zoo still makes a model the ONNX checker takes."""
from __future__ import annotations

import onnx
import pytest

from tests.assets import load_bench


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
    assert fixed.parses and fixed.builds and fixed.reason == ""

    random = bench.run_case(cases["Dropout training_mode=1 ratio=0.5"], tmp_path / "dropout")
    assert (random.hit, random.outcome, random.fixed_by, random.max_abs) == ("parse", "none", "none", None), random
    assert "TensorRT does not support the Dropout operator in training mode" in random.parser
    assert random.reason.startswith("the parser refuses this 'Dropout' node"), random.reason
    assert "trtflow's rewrite was not kept (dropout-ratio0 does not apply: ratio 0.5" in random.reason
    assert "register a TensorRT plugin" not in random.reason and "\n" not in random.reason
    assert not random.parses and random.builds is None

    table = bench.markdown([fixed, random])
    assert "| Det 2x2 | UNSUPPORTED_NODE: " in table and "| det-cofactors | " in table
    first = bench.summary([fixed, random])[0]
    assert first.startswith("2 standard-op cases (2 refused by the parser, 0 parse and fail the trial build): "
                            "fixed by rewrite 1 (50%)"), first
