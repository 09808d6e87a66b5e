"""The fast part of the zoo (bench/zoo.py runs all of it): real architectures exported from PyTorch, each through
prepare -> fp16 -> int8 (entropy: what repair and reduce start from) -> build as a trtflow pipeline, with no stage
failing. The three calibration methods are compared on every architecture by bench/zoo.py, and on real photos by
tests/test_calibrate_stage.py; here one is enough to show each architecture goes through."""
from __future__ import annotations

import pytest

from tests import assets

# exported in well under 15 s each; each family breaks a converter in its own way
FAST = ["yolo_head", "transformer_encoder", "lstm", "if_model", "fp16_mixed"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    with assets.zoo(tmp_path_factory.mktemp("zoo")) as models:
        yield models, assets.load_bench("zoo")


@pytest.mark.slow
@pytest.mark.tensorrt
@pytest.mark.parametrize("name", FAST)
def test_through_every_stage(zoo, name, tmp_path):
    models, bench = zoo
    facts = {**models.BUILDERS[name](), "samples": models.SAMPLES}
    row = bench.run_model(name, facts, tmp_path, methods=("entropy",))
    assert row["errors"] == {}, row["errors"]
    assert row["trial_build"] == "ok"
    cosine, _ = row["fp16"]
    assert cosine > 0.99, f"FP16 pre-flight cosine {cosine}"
    assert row["int8_entropy"][0] > 0.5, row["int8_entropy"]
    assert all(size for size in row["engines"].values()), row["engines"]
    assert set(row["engines"]) == {"prepare", "fp16", "int8_entropy"}

    # quantizing again from the variant's recipe with nothing left out (what validate's repair and `trtflow
    # reduce` start from) gives the variant back: the same Q/DQ, the same scales. The transformer's MatMuls
    # between two activations are quantized too, which the graph alone does not tell.
    import onnx
    from onnx import numpy_helper

    from trtflow.stages.validate import repair

    def qdq_scales(m: onnx.ModelProto) -> dict[str, float]:
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        return {n.output[0]: float(inits[n.input[1]].ravel()[0]) for n in m.graph.node
                if n.op_type == "QuantizeLinear" and n.input[0] not in inits}

    (reference,) = (tmp_path / "store" / "prepare").glob("*/model.onnx")
    (int8,) = (tmp_path / "store" / "int8_entropy").glob("*/model.onnx")
    variant = onnx.load(str(int8))
    work = tmp_path / "rebuild"
    work.mkdir()
    rebuilt, _ = repair.int8_variant(reference, onnx.load(str(reference)), variant, work).rebuild([])
    assert qdq_scales(rebuilt) == qdq_scales(variant) and qdq_scales(variant)
    assert sorted(n.op_type for n in rebuilt.graph.node) == sorted(n.op_type for n in variant.graph.node)
