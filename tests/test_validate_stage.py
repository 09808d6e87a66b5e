"""Stage `validate`: defects planted in a real architecture (SqueezeNet 1.1, real photos) are caught, localized to
the planted node and repaired; every number names the runtime (ONNX Runtime simulations here: no GPU)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import helper, numpy_helper

from tests.assets import IMAGENET, PHOTOS, SQUEEZENET
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError, StageFailed
from trtflow.pipelines.params.calibrate import CalibrateStage
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.calibrate import stage as calibrate
from trtflow.stages.image import preprocess
from trtflow.stages.ort import qdq
from trtflow.stages.ort.runner import run, session
from trtflow.stages.precision import stage as precision
from trtflow.stages.validate import stage as validate

IMAGES = {"images": "*.png", "samples": 4}


def photos(tmp_path: Path, steps=IMAGENET) -> dict:
    name = f"preprocess{len(list(tmp_path.glob('preprocess*')))}.json"
    pre = preprocess.save(preprocess.canonical(steps), tmp_path / name)
    return {"preprocess": Artifact(pre, "preprocess", "parity"),
            "images": [Artifact(p, "file", p.name) for p in PHOTOS]}


def with_scale_pair(src: Path, dst: Path, tensor: str, factor: float) -> Path:
    """Insert x * factor (node 'planted_up') then / factor ('planted_down') after `tensor`: the same math in FP32,
    past FP16's 65504 in between when factor is large."""
    m = onnx.load(str(src))
    for node in m.graph.node:
        node.input[:] = [f"{tensor}__down" if t == tensor else t for t in node.input]
    m.graph.initializer.extend([numpy_helper.from_array(np.array(factor, np.float32), "planted_k")])
    at = next(i for i, n in enumerate(m.graph.node) if tensor in n.output) + 1
    for offset, node in enumerate([helper.make_node("Mul", [tensor, "planted_k"], [f"{tensor}__up"], name="planted_up"),
                                   helper.make_node("Div", [f"{tensor}__up", "planted_k"], [f"{tensor}__down"],
                                                    name="planted_down")]):
        m.graph.node.insert(at + offset, node)
    onnx.save(m, str(dst))
    return dst


def run_stage(module, schema, out: Path, inputs: dict, **kw):
    out.mkdir(parents=True)
    return module.run(schema.model_validate({"kind": schema.model_fields["kind"].annotation.__args__[0], **kw}),
                      Inputs(inputs), out)


def overflowing_squeezenet(tmp_path: Path) -> Path:
    """SqueezeNet with a planted scale after the first fire module's ReLU, sized so it passes 65504 on the photos."""
    tensor = next(n.output[0] for n in onnx.load(str(SQUEEZENET)).graph.node if n.op_type == "Relu")
    probe = with_scale_pair(SQUEEZENET, tmp_path / "probe.onnx", tensor, 1.0)
    m = onnx.load(str(probe))
    m.graph.output.extend([helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None)])
    onnx.save(m, str(probe))
    feeds = photos(tmp_path)
    pre = preprocess.load(feeds["preprocess"].path)
    peak = max(float(run(session(probe), {"input": pre(p)})[tensor].max()) for p in PHOTOS)
    return with_scale_pair(SQUEEZENET, tmp_path / "overflow.onnx", tensor, 4 * 65504 / peak)


@pytest.mark.slow
def test_fp16_overflow_is_caught_localized_and_repaired(tmp_path):
    model = overflowing_squeezenet(tmp_path)
    inputs = photos(tmp_path)
    fp16 = run_stage(precision, PrecisionStage, tmp_path / "fp16", {"model": Artifact(model, "onnx", "prepare"),
                                                                     **inputs},
                     data=IMAGES, holdout=1, fallback={"auto": False})
    variant = Artifact(fp16.outputs["model"], "onnx", "fp16", "fp16")
    reference = Artifact(model, "onnx", "ref", "prepare")
    with pytest.raises(StageFailed) as failed:
        run_stage(validate, ValidateStage, tmp_path / "v", {"reference": reference, "models": [variant], **inputs},
                  data=IMAGES)
    line = str(failed.value)
    assert "fp16" in line and "output 'logits'" in line and "NaN/Inf" in line, line
    report = json.loads(failed.value.result.outputs["report"].read_text())
    cand = report["candidates"][0]
    assert cand["runtime"].startswith("onnxruntime-cpu (simulated FP16")
    assert cand["accuracy"]["outputs"]["logits"]["reference_nan"] == 0
    assert cand["layerwise"]["first_bad"]["node"] == "planted_up"
    assert any(o["node"] == "planted_up" for o in cand["layerwise"]["overflow"])
    assert all((tmp_path / "v" / p).exists() for p in cand["plots"])

    fixed = run_stage(validate, ValidateStage, tmp_path / "r", {"reference": reference, "models": [variant], **inputs},
                      data=IMAGES, repair=True)
    report = json.loads(fixed.outputs["report"].read_text())
    assert set(report["repair"]["nodes"]) == {"planted_up", "planted_down"}, report["repair"]
    assert "block_nodes" in report["repair"]["yaml"] and "planted_up" in report["repair"]["yaml"]
    # the repaired model is a real FP16 model that now passes, and is what a later build takes
    repaired = fixed.outputs["repaired"]
    again = run_stage(validate, ValidateStage, tmp_path / "again",
                      {"reference": reference, "models": [Artifact(repaired, "onnx", "r", "fp16")], **inputs},
                      data=IMAGES)
    assert json.loads(again.outputs["report"].read_text())["passed"]


def test_bad_input(tmp_path):
    reference = Artifact(SQUEEZENET, "onnx", "ref", "prepare")
    inputs = photos(tmp_path)
    with pytest.raises(StageError, match="tolerances.logit: the model has no output 'logit'.*logits"):
        run_stage(validate, ValidateStage, tmp_path / "a", {"reference": reference, "models": [reference], **inputs},
                  data=IMAGES, tolerances={"logit": {"cosine": 0.99}})
    with pytest.raises(StageError, match="nothing to validate"):
        run_stage(validate, ValidateStage, tmp_path / "b", {"reference": reference, "models": [reference], **inputs},
                  data=IMAGES)
    # an "FP16" variant whose nodes all stayed FP32 (its precision stage warned): repair has nothing to give back
    # and says so; the variant passes as the FP32 model it is (a pipeline with no FP16/INT8 stage at all is refused
    # by `trtflow validate`: tests/test_spec.py)
    fp32 = Artifact(SQUEEZENET, "onnx", "other", "prepare2")
    res = run_stage(validate, ValidateStage, tmp_path / "c", {"reference": reference, "models": [fp32], **inputs},
                    data=IMAGES, repair=True)
    report = json.loads(res.outputs["report"].read_text())
    assert report["passed"] and "nothing to repair" in report["repair"]["note"]


@pytest.mark.slow
def test_int8_range_ruined_is_caught_localized_and_repaired(tmp_path):
    """One activation's INT8 range made 2000x too wide (as one huge outlier in the calibration data does): its
    values all round to zero; validate names the node that reads it and leaves that node unquantized."""
    inputs = photos(tmp_path)
    reference = Artifact(SQUEEZENET, "onnx", "ref", "prepare")
    int8 = run_stage(calibrate, CalibrateStage, tmp_path / "int8", {"model": reference, **inputs}, data=IMAGES,
                     holdout=1, min_samples=3)
    m = onnx.load(str(int8.outputs["model"]))
    inits = {i.name: i for i in m.graph.initializer}
    consumers = {t: n for n in m.graph.node for t in n.input}
    # a mid-network activation's QuantizeLinear: the Conv that reads its DequantizeLinear is the planted node
    qs = [n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
    q = qs[len(qs) // 2]
    scale = inits[q.input[1]]
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 2000, scale.name))
    planted = consumers[consumers[q.output[0]].output[0]].name
    ruined = tmp_path / "ruined.onnx"
    onnx.save(m, str(ruined))
    variant = Artifact(ruined, "onnx", "int8", "int8")

    with pytest.raises(StageFailed) as failed:
        run_stage(validate, ValidateStage, tmp_path / "v", {"reference": reference, "models": [variant], **inputs},
                  data=IMAGES)
    cand = json.loads(failed.value.result.outputs["report"].read_text())["candidates"][0]
    assert "simulated INT8" in cand["runtime"] and not cand["passed"]
    assert cand["layerwise"]["first_bad"]["node"] == planted, cand["layerwise"]["first_bad"]
    assert cand["layerwise"]["clipping"][0]["tensor"] == q.input[0]  # the range that does not fit its data
    assert cand["layerwise"]["clipping"][0]["range_use"] < 0.01

    fixed = run_stage(validate, ValidateStage, tmp_path / "r", {"reference": reference, "models": [variant], **inputs},
                      data=IMAGES, repair=True)
    rep = json.loads(fixed.outputs["report"].read_text())["repair"]
    assert rep["passed"] and rep["nodes"] == [planted], rep
    assert yaml.safe_load(rep["yaml"]) == {"stages": {"int8": {"exclude_nodes": [planted]}}}
    assert rep["of"] == len(qdq.quantized_nodes(m)) > 20  # the warning says how much of the variant is given back
    assert any(f"giving back 1 of its {rep['of']} INT8 node(s)" in w for w in fixed.warnings)
    repaired = onnx.load(str(fixed.outputs["repaired"]))
    assert sum(n.op_type == "QuantizeLinear" for n in repaired.graph.node) > 10  # still an INT8 model

    # a preprocessing mismatch: validation images fed without the 1/255 scale the model was calibrated with
    wrong = photos(tmp_path, [s for s in IMAGENET if "scale" not in s])
    good = Artifact(int8.outputs["model"], "onnx", "int8", "int8")
    with pytest.raises(StageFailed) as failed:
        run_stage(validate, ValidateStage, tmp_path / "pre", {"reference": reference, "models": [good], **wrong},
                  data=IMAGES)
    loc = json.loads(failed.value.result.outputs["report"].read_text())["candidates"][0]["layerwise"]
    first_conv = next(n.name for n in onnx.load(str(SQUEEZENET)).graph.node if n.op_type == "Conv")
    assert loc["first_bad"]["node"] == first_conv  # where the wrongly scaled input is quantized
    assert loc["clipping"] and loc["clipping"][0]["clipped"] > 0.1  # its values fall outside the calibrated ranges


def test_localization_looks_at_the_samples_whose_outputs_are_off_the_most():
    import numpy as np

    from trtflow.stages.validate.measure import how_far_off as _how_far_off
    from trtflow.stages.validate.measure import worst_samples as _worst_samples
    ref = {"y": np.array([1.0, 2.0, 3.0], np.float32)}
    close = _how_far_off(ref, {"y": np.array([1.0, 2.0, 3.001], np.float32)})
    far = _how_far_off(ref, {"y": np.array([3.0, 2.0, 1.0], np.float32)})
    broken = _how_far_off(ref, {"y": np.array([1.0, np.inf, 3.0], np.float32)})
    assert 0 < close < far < broken == 2.0
    src = object()
    ranked = [(close, src, 0), (broken, src, 1), (far, src, 2), (0.0, src, 3)]
    assert _worst_samples(ranked, 2) == [(src, 1), (src, 2)]


def test_localization_runs_a_batch_one_item_at_a_time_with_the_same_statistics(tmp_path, monkeypatch):
    """Every intermediate tensor of a batch of 32 at a profile's max can be tens of GB (PP-OCRv4's recognizer at
    48 x 640: 26 GB, killed by the kernel): the search runs each item alone, and its sums come out the same as
    over the items given one by one."""
    from trtflow.stages.ort import layerwise

    reference = onnx.load(str(SQUEEZENET))
    candidate = onnx.load(str(SQUEEZENET))
    weight = candidate.graph.initializer[0]
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.01, weight.name))
    batch = np.random.default_rng(0).random((3, 3, 224, 224), dtype=np.float32)
    fed = []
    run = layerwise._run
    monkeypatch.setattr(layerwise, "_run", lambda sess, names, feed: fed.append(feed["input"].shape) or
                        run(sess, names, feed))
    whole = layerwise.compare(reference, candidate, [{"input": batch}], tmp_path, 0.999)
    assert fed == [(1, 3, 224, 224)] * 3  # the batch of 3, an item at a time
    one_by_one = layerwise.compare(reference, candidate, [{"input": batch[i:i + 1]} for i in range(3)], tmp_path,
                                   0.999)
    assert whole.samples == 1 and one_by_one.samples == 3
    assert [r.tensor for r in whole.rows] == [r.tensor for r in one_by_one.rows]
    # (pytest 9.2's approx takes flat sequences only)
    assert [(r.cosine, r.rms_rel) for r in whole.rows] == [
        (pytest.approx(r.cosine, rel=1e-5), pytest.approx(r.rms_rel, rel=1e-5)) for r in one_by_one.rows]


@pytest.mark.slow
def test_int8_rebuild_keeps_the_range_of_a_quantized_graph_output(tmp_path):
    """A model whose last quantized node writes the graph output (a classifier's final Gemm, here SqueezeNet cut
    after a Conv): ONNX Runtime renames that tensor for its Q/DQ pair. Repair's rebuild must find its range under
    the output's own name (it failed with "Quantization parameters are not specified for param ...") and, giving
    nothing back, reproduce the variant's scales."""
    from trtflow.stages.validate import repair

    convs = [n for n in onnx.load(str(SQUEEZENET)).graph.node if n.op_type == "Conv"]
    cut = tmp_path / "cut.onnx"
    onnx.utils.extract_model(str(SQUEEZENET), str(cut), ["input"], [convs[3].output[0]])
    int8 = run_stage(calibrate, CalibrateStage, tmp_path / "int8",
                     {"model": Artifact(cut, "onnx", "ref", "prepare"), **photos(tmp_path)}, data=IMAGES,
                     holdout=1, min_samples=3, quantize_outputs=True)  # the graph output's own Q/DQ pair
    variant = onnx.load(str(int8.outputs["model"]))
    out = convs[3].output[0]
    assert out in qdq.activation_ranges(variant).data
    assert out in qdq.representable_ranges(variant)

    def scales(m: onnx.ModelProto) -> dict[str, float]:
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        return {n.input[0]: float(inits[n.input[1]]) for n in m.graph.node
                if n.op_type == "QuantizeLinear" and n.input[0] not in inits}

    work = tmp_path / "repair"
    work.mkdir()
    rebuilt, _ = repair.int8_variant(cut, onnx.load(str(cut)), variant, work).rebuild([])
    assert scales(rebuilt) == scales(variant) and len(scales(variant)) >= 4


def test_repair_search_reaches_an_error_spread_over_many_nodes_and_keeps_only_what_is_needed():
    """The search's own logic, on a stand-in variant whose gate passes only when every node of `needed` is given
    back (an error spread over layers, as INT8 on MobileNetV3 has it). Growing one node per round could not get
    there in 8 rounds; doubling does, and shrinking takes the extra nodes back."""
    from trtflow.stages.compare.records import LayerRow, Layerwise
    from trtflow.stages.validate import repair

    order = [f"n{i}" for i in range(40)]  # how localization ranks them, worst first
    needed = {"n0", "n3", "n9", "n17"}
    rebuilt: list[list[str]] = []

    def rebuild(nodes):
        rebuilt.append(list(nodes))
        return {"nodes": list(nodes)}, {"nodes": list(nodes)}

    def check(sim):
        missing = needed - set(sim["nodes"])
        return [f"{len(missing)} still wrong"] if missing else []

    def row(node: str, added: float) -> LayerRow:  # a stand-in: only what the search reads
        return LayerRow.model_construct(node=node, added=added)

    def locate(sim):
        left = [n for n in order if n not in sim["nodes"]]
        return Layerwise.model_construct(first_bad=row(left[0], 1.0), worst=[],
                                         rows=[row(n, 1.0 / (k + 2)) for k, n in enumerate(left)])

    v = repair.Variant(rebuild, lambda n: n, len(order))

    def search(check, rounds):
        return repair.search(v, locate({"nodes": []}), check, locate, rounds, "int8", "int8")

    found = search(check, 40)
    assert found.passed and set(found.nodes) == needed, found.nodes
    assert [len(h.give_back) for h in found.rounds if h.give_back is not None] == [1, 2, 4, 8, 16]
    assert found.model["nodes"] == found.nodes and len(rebuilt) == len(found.rounds) <= 40

    fewer = search(check, 8)  # fewer rounds: passes, less small
    assert fewer.passed and needed <= set(fewer.nodes) and len(fewer.nodes) < 31
    assert len(fewer.rounds) == 8

    one = search(lambda sim: [] if "n0" in sim["nodes"] else ["wrong"], 8)
    assert one.nodes == ["n0"] and len(one.rounds) == 1  # one planted fault: one round, nothing to shrink

    short = search(check, 3)
    assert not short.passed and len(short.nodes) == 7 and len(short.rounds) == 3


@pytest.mark.slow
def test_a_nan_is_repaired_at_its_source(tmp_path):
    """Issue #51: on basic-pitch, repair gave back 63 of 179 nodes, never the Add of 1e-10 and the Log that make
    the NaN (the Add's output drifts by nothing a cosine sees), and concluded FP16 was not viable. Now the search
    names the first node whose output turns non-finite and gives it back with what feeds it, first: the planted
    pattern repairs with at most three nodes, the Add and the Log among them."""
    from tests.test_precision_stage import signed_tensors

    consts = [numpy_helper.from_array(np.array(1e-10, np.float32), "eps"),
              numpy_helper.from_array(np.eye(16, dtype=np.float32) * 0.1, "W1"),
              numpy_helper.from_array(np.eye(16, dtype=np.float32) * 0.5, "W2"),
              numpy_helper.from_array(np.array(0.1, np.float32), "k")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="stem"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "eps"], ["r_eps"], name="add_eps"),
             helper.make_node("Log", ["r_eps"], ["log_r"], name="log_r"),
             helper.make_node("Mul", ["log_r", "k"], ["t"], name="scale"),
             *[helper.make_node("MatMul", [f"t{i}" if i else "t", "W2"], [f"t{i + 1}" if i < 5 else "y"],
                                name=f"head{i}") for i in range(6)]]  # the FP16 compute repair must not give back
    graph = helper.make_graph(nodes, "nan", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16])], consts)
    model = tmp_path / "nan.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    data = {"tensors": signed_tensors(tmp_path)}
    spec = {"data": {"tensors": "*.npy"}}
    fp16 = run_stage(precision, PrecisionStage, tmp_path / "fp16", {"model": Artifact(model, "onnx", "prepare"),
                                                                     **data},
                     holdout=2, fallback={"auto": False}, preflight="off", **spec)
    assert fp16.metrics["nan_inf"] > 0
    reference, variant = Artifact(model, "onnx", "ref", "prepare"), Artifact(fp16.outputs["model"], "onnx", "fp16",
                                                                            "fp16")
    with pytest.raises(StageFailed) as failed:
        run_stage(validate, ValidateStage, tmp_path / "v", {"reference": reference, "models": [variant], **data},
                  **spec)
    cand = json.loads(failed.value.result.outputs["report"].read_text())["candidates"][0]
    assert cand["layerwise"]["first_nonfinite"]["node"] == "log_r", cand["layerwise"]
    assert "**first non-finite output**: `log_r` (Log)" in failed.value.result.summary

    fixed = run_stage(validate, ValidateStage, tmp_path / "r", {"reference": reference, "models": [variant], **data},
                      repair=True, **spec)
    found = json.loads(fixed.outputs["report"].read_text())["repair"]
    assert found["passed"] and {"add_eps", "log_r"} <= set(found["nodes"]) and len(found["nodes"]) <= 3, found
    assert found["rounds"][0]["give_back"] == ["log_r"] and found["rounds"][1]["give_back"][0] == "add_eps", \
        found["rounds"]
