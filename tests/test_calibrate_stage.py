"""Stage `calibrate`: INT8 Q/DQ from calibration data (real photos through the parity preprocessing, saved
tensors, random), built into engines by TensorRT-RTX on the CPU; bad input; reuse of the ranges."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.assets import IMAGENET, PHOTOS, PPOCR, SQUEEZENET
from tests.graphs import fpn, if_with_outer_refs, only_inside_if
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError
from trtflow.pipelines.params.calibrate import CalibrateStage
from trtflow.stages.calibrate import stage as calibrate
from trtflow.stages.image import preprocess


def run_calibrate(model: Path, out: Path, extra_inputs=None, **kw):
    out.mkdir(parents=True)
    params = CalibrateStage.model_validate({"kind": "calibrate", **kw})
    return calibrate.run(params, Inputs({"model": Artifact(model, "onnx", "m"), **(extra_inputs or {})}), out)


def assert_trt_ready(model: Path, shape: dict[str, list[int]], build_dir: Path, engine_size=None) -> None:
    """Q/DQ as TensorRT wants it; built with the real builder when `engine_size` (a TensorRT flavour) is given."""
    q = onnx.load(str(model))
    dq_inputs = {n.input[0] for n in q.graph.node if n.op_type == "DequantizeLinear"}
    int32 = [i.name for i in q.graph.initializer if i.name in dq_inputs and i.data_type == TensorProto.INT32]
    assert not int32, f"a quantized bias (INT32 DequantizeLinear) breaks TensorRT: {int32}"
    assert sum(n.op_type == "QuantizeLinear" for n in q.graph.node) > 10
    if engine_size is not None:
        assert engine_size(model, shape, build_dir) > 100_000


@pytest.mark.slow
def test_real_photos_through_the_parity_preprocessing(tmp_path, tensorrt_available, engine_size):
    pre = preprocess.save(preprocess.canonical(IMAGENET), tmp_path / "preprocess.json")
    inputs = {"preprocess": Artifact(pre, "preprocess", "p"), "images": [Artifact(p, "file", p.name) for p in PHOTOS]}
    result = run_calibrate(SQUEEZENET, tmp_path / "out", inputs, data={"images": "*.png", "samples": 4},
                           holdout=1, trt_calibration_cache=True, method="percentile", percentile=99.9)
    report = json.loads(result.outputs["report"].read_text())
    assert report["calibration_samples"] == 3 and report["holdout_samples"] == 1
    assert report["data"].startswith("images via preprocess")
    out = report["accuracy"]["outputs"]["logits"]
    assert out["cosine"] > 0.99 and out["nan"] == 0 and "simulated" in report["accuracy"]["runtime"]
    assert_trt_ready(result.outputs["model"], {"input": [1, 3, 224, 224]}, tmp_path / "engine",
                     engine_size if tensorrt_available else None)
    cache = result.outputs["trt_calibration_cache"].read_text().splitlines()
    assert cache[0].startswith("TRT-") and cache[0].endswith("-EntropyCalibration2")
    name, hexscale = cache[1].split(": ")
    scale = struct.unpack(">f", bytes.fromhex(hexscale))[0]
    ranges = json.loads(result.outputs["ranges"].read_text())["data"]
    assert name in ranges and 0 < scale < 10


@pytest.mark.slow
def test_prepared_ppocr_with_random_data_builds(tmp_path, tensorrt_available, engine_size):
    from onnx import version_converter

    from trtflow.stages.onnx.graph import constants_to_initializers, sanitize_dims
    m = onnx.load(str(PPOCR))
    with pytest.raises(StageError, match="Q/DQ quantization needs opset >= 13, the model is at opset 11"):
        run_calibrate(PPOCR, tmp_path / "raw", data={"random": True})
    sanitize_dims(m)
    m = version_converter.convert_version(m, 17)
    constants_to_initializers(m)  # what prepare hands over: weights as initializers, so they get quantized
    model = tmp_path / "prepared.onnx"
    onnx.save(m, str(model))
    result = run_calibrate(model, tmp_path / "out", data={"random": True, "samples": 8, "shapes": {"x": [1, 3, 48, 192]}},
                           method="minmax", holdout=4)
    assert result.metrics["quantize_linear_nodes"] > 10
    assert_trt_ready(result.outputs["model"], {"x": [1, 3, 48, 192]}, tmp_path / "engine",
                     engine_size if tensorrt_available else None)


def _tensors(tmp_path: Path, n: int, shape=(1, 3, 224, 224)) -> list[Artifact]:
    rng = np.random.default_rng(1)
    arts = []
    for i in range(n):
        f = tmp_path / f"t{i:03d}.npy"
        np.save(f, rng.standard_normal(shape).astype(np.float32))
        arts.append(Artifact(f, "file", f.name))
    return arts


@pytest.mark.slow
def test_bad_input(tmp_path):
    tensors = {"tensors": _tensors(tmp_path, 4)}
    data = {"tensors": "*.npy", "samples": 100}
    with pytest.raises(StageError, match=r"2 calibration sample\(s\), fewer than min_samples 10"):
        run_calibrate(SQUEEZENET, tmp_path / "a", tensors, data=data, min_samples=10, holdout=2)
    warned = run_calibrate(SQUEEZENET, tmp_path / "b", tensors, data=data, min_samples=10, holdout=2,
                           on_too_few="warn", method="minmax")
    assert any("fewer than min_samples" in w for w in warned.warnings)
    with pytest.raises(StageError, match=r"exclude_nodes: no node named '/features/features.0/Conv_'"):
        run_calibrate(SQUEEZENET, tmp_path / "c", tensors, data=data, exclude_nodes=["/features/features.0/Conv_"])
    (tmp_path / "w").mkdir()
    wrong = {"tensors": _tensors(tmp_path / "w", 3, (1, 3, 64))}
    with pytest.raises(StageError, match=r"gives shape \[1, 3, 64\], which does not fit the model's input 'input'"):
        run_calibrate(SQUEEZENET, tmp_path / "d", wrong, data=data)
    with pytest.raises(StageError, match="the calibration set is empty"):
        run_calibrate(SQUEEZENET, tmp_path / "e", {"tensors": []}, data=data)


def test_nothing_to_quantize(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    with pytest.raises(StageError, match="nothing to quantize: the model has no Conv/ConvTranspose/Gemm/MatMul"):
        run_calibrate(model, tmp_path / "out", data={"random": True})


@pytest.mark.slow
def test_ranges_are_reused_until_the_data_changes(write_yaml, workdir):
    from trtflow.flows.runner import Runner
    from trtflow.pipelines.loader import load_pipeline

    (workdir / "calib").mkdir()
    _tensors(workdir / "calib", 6)
    import shutil
    shutil.copy(SQUEEZENET, workdir / "models" / "sq.onnx")
    path = write_yaml("""
        version: 1
        name: int8
        model: models/sq.onnx
        stages:
          int8: {kind: calibrate, data: {tensors: "calib/*.npy", samples: 6}, method: minmax, holdout: 2}
        """)
    runner = Runner(load_pipeline(path))
    runner.store.ensure_writable()
    first = runner.run_stage("int8", {})
    assert set(first.manifest.outputs) >= {"model", "ranges", "report"}
    assert Runner(load_pipeline(path)).plan()[0].action == "reuse"
    np.save(workdir / "calib" / "t000.npy", np.zeros((1, 3, 224, 224), np.float32))
    item = Runner(load_pipeline(path)).plan()[0]
    assert (item.action, item.reason) == ("run", "input 'tensors' changed")


def _nvidia_entropy_reference(calib_hist, calib_bin_edges, num_bits=8, start_bin=128):
    """NVIDIA pytorch-quantization's `_compute_amax_entropy` (the reference for TensorRT's entropy calibration),
    transcribed loop for loop: the independent computation the stage's vectorized search is checked against."""
    from collections import Counter

    from scipy.stats import entropy

    bins = np.array(calib_hist, dtype=np.float64)
    bins[0] = bins[1]
    nbins = 1 << (num_bits - 1)
    divergences = []
    for i in range(start_bin, len(bins) + 1):
        digitized = np.digitize(range(i), np.linspace(0, i, num=nbins + 1)) - 1
        digitized[bins[:i] == 0] = -1
        counts = np.zeros(nbins)
        for idx, d in enumerate(digitized):
            if d != -1:
                counts[d] += bins[idx]
        for key, val in Counter(digitized).items():
            if key != -1:
                counts[key] /= val
        q = np.array([counts[d] if d != -1 else 0.0 for d in digitized])
        p = np.array(bins[:i])
        p[-1] += bins[i:].sum()
        divergences.append(entropy(p / p.sum(), q / q.sum()))
    divergences = np.array(divergences)
    return calib_bin_edges[len(divergences) - 1 - np.argmin(divergences[::-1]) + start_bin]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["laplace with outliers", "relu with outliers"])
def test_entropy_threshold_is_tensorrts_kl_rule(kind):
    from trtflow.stages.ort.calibration import entropy_threshold

    rng = np.random.default_rng(0)
    if kind == "laplace with outliers":
        x = np.abs(np.concatenate([rng.laplace(0, 1, 100_000), rng.normal(0, 30, 50)]))
    else:
        x = np.maximum(rng.normal(0, 1, 100_000), 0)
        x[:10] = 40
    hist, edges = np.histogram(x, bins=2048, range=(0, x.max()))
    got = entropy_threshold(hist, edges)
    assert got == _nvidia_entropy_reference(hist, edges)
    assert got < 0.5 * x.max()  # the outliers are clipped: this is not MinMax


def test_percentile_threshold_is_taken_on_absolute_values():
    from trtflow.stages.ort.calibration import percentile_threshold

    rng = np.random.default_rng(1)
    x = -np.abs(rng.normal(0, 2, 200_000))  # every large value negative: ONNX Runtime's rule would clip to ~0
    hist, edges = np.histogram(np.abs(x), bins=2048, range=(0, np.abs(x).max()))
    width = edges[1] - edges[0]
    assert abs(percentile_threshold(hist, edges, 99.9) - np.percentile(np.abs(x), 99.9)) <= width


@pytest.mark.slow
def test_entropy_is_not_minmax_on_real_photos(tmp_path):
    """Seen before: ONNX Runtime's defaults made `entropy` give MinMax's scales exactly (0 of 70 differed)."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    from trtflow.stages.ort.calibration import entropy_threshold

    pre = preprocess.save(preprocess.canonical(IMAGENET), tmp_path / "preprocess.json")
    inputs = {"preprocess": Artifact(pre, "preprocess", "p"), "images": [Artifact(p, "file", p.name) for p in PHOTOS]}
    from trtflow.stages.ort.calibration import MIN_VALUES_FOR_KL, percentile_threshold

    scales = {}
    for method, floor in (("minmax", None), ("entropy", None), ("entropy_floored", 99.99)):
        result = run_calibrate(SQUEEZENET, tmp_path / method, inputs, data={"images": "*.png", "samples": 4},
                               holdout=1, method=method.split("_")[0], entropy_floor=floor, entropy_check=False)
        model = onnx.load(str(result.outputs["model"]))
        scales[method] = {i.name: float(onnx.numpy_helper.to_array(i)) for i in model.graph.initializer
                          if i.name.endswith("_scale") and not i.dims}
        stored = load_tensors_data(result.outputs["ranges"]).data
        if method == "minmax":
            full = {name: float(np.abs(np.asarray(td.range_value, dtype=np.float64)).max()) for name, td in stored.items()}
        if method.startswith("entropy"):
            sparse = set(json.loads(result.outputs["report"].read_text())["full_range_tensors"])
            q_dq = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
            assert q_dq - {i.name for i in model.graph.initializer} <= {k for k, v in stored.items()
                                                                        if hasattr(v, "hist")}
            for name, td in stored.items():
                if not hasattr(td, "hist"):  # no Q/DQ goes on it (a Conv's output): no histogram, its full range
                    assert name not in q_dq and float(td.highest) == pytest.approx(full[name], rel=1e-6)
                    continue
                kl = entropy_threshold(td.hist, td.hist_edges)
                want = kl if floor is None else max(kl, percentile_threshold(td.hist, td.hist_edges, floor))
                if name in sparse:  # too few values for the KL search: the full range
                    assert td.hist.sum() < MIN_VALUES_FOR_KL
                    want = float(td.hist_edges[-1])
                assert float(td.highest) == pytest.approx(want)
    common = scales["minmax"].keys() & scales["entropy"].keys()
    differ = [k for k in common if scales["entropy"][k] != pytest.approx(scales["minmax"][k])]
    assert len(common) > 15 and len(differ) > len(common) // 2  # 18 activations: the inputs of the 26 Convs
    assert all(scales["entropy"][k] <= scales["minmax"][k] * 1.0001 for k in common)


@pytest.mark.slow
def test_nothing_is_written_outside_the_output_directory(tmp_path, monkeypatch):
    """Seen before: every calibrate run left sym_shape_infer_temp.onnx and a <uuid>.data weight copy in the
    directory trtflow was started from."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    model = fpn(tmp_path / "fpn.onnx")
    result = run_calibrate(model, tmp_path / "out", data={"random": True, "samples": 2, "shapes": {"x": [1, 3, 32, 32]}},
                           holdout=1)
    assert list(cwd.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.onnx", "ranges.json", "report.json"]
    assert result.metrics["quantize_linear_nodes"] >= 2  # the Convs' inputs (their outputs stay float)


@pytest.mark.slow
def test_control_flow_is_named(tmp_path):
    """Seen before: "the model has no Conv/ConvTranspose/Gemm/MatMul node" when they sat inside If branches."""
    onnx.save(only_inside_if(), str(tmp_path / "inside.onnx"))
    with pytest.raises(StageError, match=r"its 2 such node\(s\) sit inside control flow \(branch\), which is not "
                                         r"quantized"):
        run_calibrate(tmp_path / "inside.onnx", tmp_path / "a", data={"random": True, "samples": 2})
    onnx.save(if_with_outer_refs(), str(tmp_path / "mixed.onnx"))
    result = run_calibrate(tmp_path / "mixed.onnx", tmp_path / "b", data={"random": True, "samples": 2}, holdout=1)
    assert result.metrics["quantize_linear_nodes"] >= 1
    assert any("1 MatMul node(s) inside the subgraphs of branch are not quantized" in w for w in result.warnings)


@pytest.mark.slow
def test_the_range_rules_are_checked_against_each_other(tmp_path):
    """The KL rule can clip rare large activations a model needs (PP-OCR's detector: cosine 0.89 against 0.975 with
    MinMax), and a worst-sample cosine picked the full ranges on PP-OCRv4 rec where percentile and entropy do far
    better on its text (bench/int8.py): the rule, the other histogram rule and the full ranges are each run on the
    calibration samples, the closest to FP32 by mean relative error is kept, saying which."""
    pre = preprocess.save(preprocess.canonical(IMAGENET), tmp_path / "preprocess.json")
    inputs = {"preprocess": Artifact(pre, "preprocess", "p"), "images": [Artifact(p, "file", p.name) for p in PHOTOS]}
    for method in ("entropy", "percentile"):  # percentile (the default) is checked the same way
        result = run_calibrate(SQUEEZENET, tmp_path / method, inputs, data={"images": "*.png", "samples": 4},
                               holdout=1, method=method)
        check = json.loads(result.outputs["report"].read_text())["range_check"]
        assert check["samples"] == 3 and check["rule"] == method
        assert set(check["errors"]) == {"entropy", "percentile", "full_range"}
        assert check["used"] == min(check["errors"], key=lambda k: (check["errors"][k], k != method))
        warned = [w for w in result.warnings if "tracked FP32 better" in w]
        assert bool(warned) == (check["used"] != method)
        assert f"ranges: {check['used'].replace('_', ' ')} (mean relative error on 3" in result.summary
    # with a declared task metric, it decides (the method on a tie)
    result = run_calibrate(SQUEEZENET, tmp_path / "declared", inputs, data={"images": "*.png", "samples": 4},
                           holdout=1, metrics={"*": {"topk": {"k": 5}}})
    check = json.loads(result.outputs["report"].read_text())["range_check"]
    assert set(check["task"]) == {"entropy", "percentile", "full_range"}
    assert all(set(t) == {"logits/top1", "logits/top5"} for t in check["task"].values()), check["task"]
    order = ["percentile", "entropy", "full_range"]
    assert check["used"] == min(order, key=lambda k: ([-v for v in check["task"][k].values()], order.index(k)))
    assert f"ranges: {check['used'].replace('_', ' ')} (by the declared task metrics on 3" in result.summary


def test_full_ranges_are_exactly_minmax(tmp_path):
    """When the entropy check keeps the full ranges they must be MinMax's, not the histogram's last edge (which
    ONNX Runtime widens by whole bins as chunks arrive: up to two bins past the largest |x|)."""
    from trtflow.stages.ort.calibration import Rule, StreamedCalibration

    w = onnx.numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                               helper.make_node("MatMul", ["r", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    rng = np.random.default_rng(1)
    chunks = []
    for top in (1.0, 3.0001, 2.0):  # the second chunk widens the histogram: 4096.2 bins of the first's width
        xs = rng.uniform(-top, top, (3, 1, 8)).astype(np.float32)
        xs[0, 0, 0] = top
        chunks.append([{"x": x} for x in xs])

    def collect(method):
        (tmp_path / method).mkdir()
        cal = StreamedCalibration(model, ["MatMul"], Rule(method, 99.99), tmp_path / method)
        for chunk in chunks:
            cal.add(chunk)
        return cal

    entropy, minmax = collect("entropy"), collect("minmax").ranges()
    seen = max(float(np.abs(np.maximum(f["x"], 0)).max()) for c in chunks for f in c)
    full = entropy.full_ranges()
    assert float(full.data["r"].highest) == pytest.approx(seen, rel=1e-6)
    assert float(full.data["r"].highest) == pytest.approx(float(np.max(minmax.data["r"].highest)), rel=1e-6)
    edges = entropy.calibrator.collector.histogram_dict["r"][1]
    assert edges[-1] > seen  # the case this guards against is real: the last edge lies past the largest value
    assert float(entropy.ranges().data["r"].highest) <= seen


@pytest.mark.slow
def test_the_range_check_says_the_task_metric_that_decided(tmp_path):
    """Issue #39: with `metrics:` declared the task metric picks the ranges, but the warning quoted the mean
    relative errors as the reason even where they said the opposite. PP-OCRv4's recognizer on 7 of the example's
    real text lines: the entropy ranges read more lines exactly as FP32 does than the percentile ones and are kept,
    though their mean relative error is the larger: the warning and the summary say the text decided."""
    from onnx import version_converter

    from tests.task_checks import TASKS, rec_input
    from trtflow import markdown as md
    from trtflow.stages.onnx.graph import constants_to_initializers, sanitize_dims

    model, images, *_ = TASKS["rec"]
    m = onnx.load(str(model))
    sanitize_dims(m)
    m = version_converter.convert_version(m, 17)
    constants_to_initializers(m)
    onnx.save(m, str(tmp_path / "rec.onnx"))
    (tmp_path / "lines").mkdir()
    tensors = []
    for p in sorted(images.glob("*.png"))[:8]:
        np.save(tmp_path / "lines" / f"{p.stem}.npy", rec_input(p))
        tensors.append(Artifact(tmp_path / "lines" / f"{p.stem}.npy", "file", p.stem))
    result = run_calibrate(tmp_path / "rec.onnx", tmp_path / "out", {"tensors": tensors},
                           data={"tensors": "lines/*.npy", "samples": 8}, holdout=1, method="percentile",
                           metrics={"softmax_11.tmp_0": {"ctc": {"blank": 0}}})
    check = json.loads(result.outputs["report"].read_text())["range_check"]
    exact = "softmax_11.tmp_0/text_exact"
    used, rule = check["task"]["entropy"], check["task"]["percentile"]
    assert check["used"] == "entropy" and used[exact] > rule[exact], check
    assert check["errors"]["entropy"] > check["errors"]["percentile"], "the case the old warning got wrong"
    (warned,) = [w for w in result.warnings if "tracked FP32 better" in w]
    assert f"(declared task metric {exact} {used[exact]:.5g} vs {rule[exact]:.5g}) and are used" in warned, warned
    assert "mean relative error" not in warned, warned
    assert check["decided_by"] == exact, check
    assert ("ranges: entropy (by the declared task metrics on 7 calibration samples, the percentile rule on a tie: "
            f"{md.text(exact)}: percentile {rule[exact]:.4g}, entropy {used[exact]:.4g}, ") in result.summary


def test_the_range_check_weighs_a_functions_metric_by_its_declared_direction(tmp_path):
    """A function's metric declared better lower counts toward the range check as such: of two candidates the
    one with the smaller error stands higher (it was left out of the check: only trtflow's own names had a
    direction)."""
    from trtflow.metrics.outputs import OutputMetrics
    from trtflow.stages.ort.runner import session

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    metrics = {"y": OutputMetrics.model_validate({"callable": {"function": "tests.stage_fns:mean_abs_error",
                                                               "lower": ["abs_err"]}})}
    feed = {"x": np.ones((2, 4), np.float32)}
    sess = session(path)
    task, _, higher = calibrate._closeness([(feed, {"y": feed["x"] + 0.25})], sess, metrics, sess.get_outputs())
    assert task == {"y/abs_err": pytest.approx(0.25)} and higher == {"y/abs_err": False}
    used, decided = calibrate._choose(["entropy", "percentile"], {"entropy": {"y/abs_err": 0.3},
                                                                 "percentile": {"y/abs_err": 0.1}},
                                      {"entropy": 0.0, "percentile": 1.0}, higher)
    assert (used, decided) == ("percentile", "y/abs_err")


def _piled_up(tmp_path: Path, n: int, seed: int) -> list[Artifact]:
    """Activations piled up just under half a quantization step (0.0035; the range, set by 2% of values at 1.0,
    makes the step 1/127): every one rounds to 0, an error of the same sign that a convolution sums."""
    rng = np.random.default_rng(seed)
    folder = tmp_path / f"piled{seed}"
    folder.mkdir()
    out = []
    for i in range(n):
        x = (0.0035 + rng.uniform(-0.0003, 0.0003, (1, 16, 16, 16))).astype(np.float32)
        x[rng.random(x.shape) < 0.02] = 1.0
        np.save(folder / f"{i:02d}.npy", x)
        out.append(Artifact(folder / f"{i:02d}.npy", "file", f"{i:02d}"))
    return out


@pytest.mark.slow
def test_bias_correction_takes_out_the_roundings_mean_error(tmp_path):
    """Issue #51 (bench/int8.py: trtflow's INT8 trailed ModelOpt's on YOLOX's boxes): rounding activations piled up
    near one value is biased, and a convolution sums that bias into a shift of each output channel. The corrected
    model's mean error per channel on other samples is a fraction of the uncorrected one's; the correction is in
    the model's recipe, so a rebuild from it (validate's repair) keeps it."""
    from onnx import numpy_helper

    from trtflow.stages.ort import qdq
    from trtflow.stages.ort.runner import run, session

    rng = np.random.default_rng(0)
    w = rng.uniform(0.05, 0.15, (16, 16, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])], "piled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(16, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "conv.onnx"))
    calib = _piled_up(tmp_path, 12, 1)
    shifts, reports, summaries = {}, {}, {}
    for corrected in (True, False):
        # (the FP32 remainder: the INT8 rounding's mean error alone, run as it is and rebuilt by qdq.write below)
        result = run_calibrate(tmp_path / "conv.onnx", tmp_path / f"out{corrected}", {"tensors": calib},
                               data={"tensors": "*.npy"}, holdout=2, bias_correction=corrected, remainder="fp32")
        reports[corrected], summaries[corrected] = json.loads(result.outputs["report"].read_text()), result.summary
        ref, got = session(tmp_path / "conv.onnx"), session(result.outputs["model"])
        diffs = [run(got, {"x": np.load(a.path)})["y"] - run(ref, {"x": np.load(a.path)})["y"]
                 for a in _piled_up(tmp_path, 6, 2 + corrected)]
        shifts[corrected] = float(np.abs(np.mean(diffs, axis=(0, 1, 3, 4))).max())
    assert reports[True]["bias_corrected"] == 1 and reports[False]["bias_corrected"] == 0
    assert "corrected for the rounding's mean error on 1 node(s)" in summaries[True]
    assert "corrected for" not in summaries[False]
    assert shifts[False] > 0.005 and shifts[True] < shifts[False] / 5, shifts

    corrected_model = onnx.load(str(tmp_path / "outTrue" / "model.onnx"))
    how = qdq.recipe(corrected_model)
    rebuilt = tmp_path / "rebuilt.onnx"
    qdq.write(tmp_path / "conv.onnx", rebuilt, tmp_path / "r.json", how.tensors, how.per_channel, how.quantize_ops,
              how.excluded, how.quantize_outputs)

    def bias_of(m: onnx.ModelProto) -> np.ndarray:
        conv = next(n for n in m.graph.node if n.op_type == "Conv")
        return numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == conv.input[2]))

    np.testing.assert_allclose(bias_of(onnx.load(str(rebuilt))), bias_of(corrected_model), rtol=1e-6)
    assert np.abs(bias_of(corrected_model)).max() > 0.005


def test_a_range_candidate_replaces_the_rule_only_when_no_metric_is_worse():
    """Issue #51: the full ranges found one box more of 99 on ddddocr's calibration scenes (recall first) with less
    precision and box IoU, and were kept; they cost 3.6 points of precision on 200 other scenes."""
    from trtflow.stages.calibrate.stage import _choose

    higher = {"y/det_recall": True, "y/det_precision": True}
    errors = {"percentile": 0.1, "entropy": 0.2, "full_range": 0.3}
    task = {"percentile": {"y/det_recall": 0.919, "y/det_precision": 0.938},
            "entropy": {"y/det_recall": 0.919, "y/det_precision": 0.930},
            "full_range": {"y/det_recall": 0.929, "y/det_precision": 0.929}}
    assert _choose(list(task), task, errors, higher) == ("percentile", None)
    task["entropy"] = {"y/det_recall": 0.919, "y/det_precision": 0.940}
    assert _choose(list(task), task, errors, higher) == ("entropy", "y/det_precision")
