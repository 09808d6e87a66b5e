"""Issue #69, items 2 and 3, on models trained here: a regression's outputs are judged in their own units, and no
metric that cannot fail is proposed or accepted.

A speech-quality-shaped regressor (three MOS-like scores in 1..5, an MLP trained on a smooth function) had no
metric of its own: `trtflow init --task other` proposed one cosine pooled over every sample (called "element by
element"), which passed candidates off by a third of a MOS point; the release refused them only through a `top1`
nobody declared, and showed a function's error of 0.33 MOS as a 33% drop. A one-class Sigmoid score got
`topk: {k: 1}`, which agrees whatever the candidate gives."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from pydantic import TypeAdapter

from tests.assets import trtflow
from tests.test_validate_stage import run_stage
from trtflow.artifact import Artifact
from trtflow.errors import SpecError, StageError, StageFailed
from trtflow.pipelines.params.precision import PrecisionStage
from trtflow.pipelines.params.release import Select
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.compare import gate
from trtflow.stages.compare.accuracy import Comparison
from trtflow.stages.compare.records import Accuracy
from trtflow.stages.ort.runner import session
from trtflow.stages.precision import stage as precision
from trtflow.stages.release import card, selection
from trtflow.stages.release.report import Option, ReleaseReport, TargetRelease
from trtflow.stages.validate import stage as validate

Layers = list[tuple[np.ndarray, np.ndarray]]  # (weight [out, in], bias [out]) per Linear


def mos_target(x: np.ndarray) -> np.ndarray:
    """Three smooth scores of four features, each within 1..5 (a MOS scale)."""
    return np.stack([3 + 1.5 * np.sin(np.pi * x[:, 0]) * np.cos(x[:, 1]),
                     3 + 1.2 * x[:, 2] * x[:, 3] + 0.6 * x[:, 0],
                     3 + 1.4 * np.tanh(x[:, 0] + x[:, 1] - x[:, 2])], 1).astype(np.float32)


def train(x: np.ndarray, y: np.ndarray, hidden: int, steps: int, loss: str) -> Layers:
    """An MLP (Linear, Tanh, ..., Linear) trained on CPU with a fixed seed: mean squared error, or binary
    cross-entropy on its one logit."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a network this small trains faster on one thread than on two shared cores
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                              torch.nn.Tanh(), torch.nn.Linear(hidden, y.shape[1]))
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    fit = torch.nn.MSELoss() if loss == "mse" else torch.nn.BCEWithLogitsLoss()
    inputs, wanted = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(steps):
        opt.zero_grad()
        fit(net(inputs), wanted).backward()
        opt.step()
    torch.set_num_threads(threads)
    return [(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy()) for m in net
            if isinstance(m, torch.nn.Linear)]


def to_onnx(layers: Layers, path: Path, output: str, sigmoid: bool = False) -> Path:
    """The MLP as ONNX (Gemm and Tanh, a Sigmoid after the last Gemm where `sigmoid`), the batch dynamic."""
    nodes, weights, prev = [], [], "x"
    for i, (w, b) in enumerate(layers):
        weights += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                    numpy_helper.from_array(b.astype(np.float32), f"b{i}")]
        last = i == len(layers) - 1
        made = ("logit" if sigmoid else output) if last else f"h{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [made], transB=1, name=f"fc{i}"))
        if not last:
            nodes.append(helper.make_node("Tanh", [made], [f"a{i}"], name=f"tanh{i}"))
            prev = f"a{i}"
    if sigmoid:
        nodes.append(helper.make_node("Sigmoid", ["logit"], [output], name="sigmoid"))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", x_width(layers)])],
                              [helper.make_tensor_value_info(output, TP.FLOAT, ["batch", layers[-1][0].shape[0]])],
                              weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def x_width(layers: Layers) -> int:
    return layers[0][0].shape[1]


def save_samples(x: np.ndarray, folder: Path) -> list[Artifact]:
    """One .npy per sample (batch 1), as validate's `data: {tensors: ...}` takes them."""
    folder.mkdir()
    files = []
    for i, row in enumerate(x):
        np.save(folder / f"s{i:02d}.npy", row[None].astype(np.float32))
        files.append(Artifact(folder / f"s{i:02d}.npy", "file", f"s{i:02d}.npy"))
    return files


@dataclass
class Models:
    root: Path
    mos: Path  # [N, 3] MOS-like scores from a Gemm
    drifted: Path  # the same with its last layer perturbed: off by about a third of a MOS point
    price: Path  # the same network with outputs in the thousands: FP16 rounds them by whole units
    score: Path  # [N, 1] from a Sigmoid, trained on scikit-learn's breast cancer data
    shifted: Path  # the score with its logit moved by -2: the few samples near 0.5 decided the other way
    mos_x: np.ndarray  # held-out samples of each
    score_x: np.ndarray


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    from sklearn.datasets import load_breast_cancer

    root = tmp_path_factory.mktemp("regression")
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (256, 4)).astype(np.float32)
    layers = train(x, mos_target(x), hidden=32, steps=200, loss="mse")
    (w, b), noise = layers[-1], np.random.default_rng(1).normal(0, 0.02, layers[-1][0].shape).astype(np.float32)
    drifted = layers[:-1] + [(w + noise, b + np.array([0.0, 0.25, 0.0], np.float32))]
    price = layers[:-1] + [(w * 2500, b * 2500 + 1000)]

    cancer = load_breast_cancer()
    features = ((cancer.data - cancer.data.mean(0)) / cancer.data.std(0)).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(features))
    train_at, held = order[:400], order[400:]
    scorer = train(features[train_at], cancer.target[train_at, None].astype(np.float32), hidden=8, steps=150,
                   loss="bce")
    (sw, sb) = scorer[-1]
    shifted = scorer[:-1] + [(sw, sb - 2.0)]
    return Models(root, to_onnx(layers, root / "mos.onnx", "mos"), to_onnx(drifted, root / "drifted.onnx", "mos"),
                  to_onnx(price, root / "price.onnx", "price"),
                  to_onnx(scorer, root / "score.onnx", "malignant", sigmoid=True),
                  to_onnx(shifted, root / "shifted.onnx", "malignant", sigmoid=True),
                  rng.uniform(-1, 1, (16, 4)).astype(np.float32), features[held])


def outputs(model: Path, x: np.ndarray) -> np.ndarray:
    return session(model).run(None, {"x": x})[0]


def compared(models: Models, metrics: dict, tolerances: dict | None = None,
             precision: str = "fp16") -> tuple[Accuracy, list[str]]:
    """The drifted MOS model against the trained one, a sample at a time, through validate's gate: its accuracy
    read back from JSON as the release reads a report's, and the bounds it missed."""
    params = ValidateStage(kind="validate", metrics=metrics, tolerances=tolerances or {})
    cmp = Comparison(params.metrics)
    for row in models.mos_x:
        cmp.add({"mos": outputs(models.mos, row[None])}, {"mos": outputs(models.drifted, row[None])})
    acc = gate.judge(cmp.result("onnxruntime-cpu"), precision, params.tolerances, True, params.metrics)
    return STORED.validate_json(STORED.dump_json(acc)), acc.violations


STORED = TypeAdapter(Accuracy)  # an accuracy as a report stores it and the release reads it


def mos_err(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """A user's metric in the output's units: the batch's largest score error, in MOS points."""
    return {"mos_err": float(np.abs(reference - candidate).max())}


def option(acc: Accuracy, verdict: str | None, max_drop: str | None = "1%") -> Option:
    """The engine as the release weighs it, from validate's accuracy and verdict."""
    shown, drop, where = selection.accuracy_drop(acc, weigh=max_drop is not None)
    o = Option(name="fp16.b.native", variant="fp16", precision="fp16", target="native", profiles=["b"],
               engine_bytes=1, engine_sha256="0", accuracy=shown, accuracy_drop=drop, drop_metric=where)
    o.refused = selection.refusal(o, Select(max_accuracy_drop=max_drop), verdict, True)
    return o


def card_of(o: Option) -> str:
    report = ReleaseReport(model_name="mos", rule={"require": "validated", "prefer": "throughput",
                                                   "max_accuracy_drop": 0.01},
                           targets=[TargetRelease(target="native", chosen=None, why_none=o.refused, options=[o])],
                           lineage=[])
    return card.markdown(report, {}) + card.to_html(report, {}) + report.summary()


# ------------------------------------------------------------------------------------------------------ init

@pytest.mark.slow
def test_init_proposes_a_regression_for_small_values_and_a_decision_for_a_one_class_score(models, tmp_path):
    """Before: the MOS model's [N, 3] from a Gemm was refused as "class logits or an embedding" (--task other then
    wrote no metric), and the [N, 1] Sigmoid got topk: {k: 1}."""
    from trtflow.pipelines.init.model import read_model
    from trtflow.pipelines.init.task import guess

    for model, name in ((models.mos, "mos"), (models.score, "score")):
        (tmp_path / name).mkdir()
        proc = trtflow("init", str(model), "--shape", "x=1:4:16x" + ("4" if name == "mos" else "30"), "-o",
                       f"{name}/pipeline.yaml", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    mos_text = (tmp_path / "mos" / "pipeline.yaml").read_text()
    assert yaml.safe_load(mos_text)["stages"]["validate"]["metrics"] == {"mos": {"regression": {}}}
    assert "a regression, judged by its errors against FP32's in the output's own units" in mos_text
    assert "set regression.within to the largest error its users accept" in mos_text
    score = yaml.safe_load((tmp_path / "score" / "pipeline.yaml").read_text())["stages"]
    assert score["validate"]["metrics"] == score["fp16"]["metrics"] == {
        "malignant": {"regression": {}, "decision": {"threshold": 0.5}}}
    assert trtflow("validate", "mos/pipeline.yaml", cwd=tmp_path).returncode == 0

    sigmoid = read_model(models.score)
    for task in ("classify", None):  # --task classify, which the refusal used to offer, writes no top-1 of one class
        (metric,) = guess(sigmoid, task, None).metrics().values()
        assert metric.model_dump(mode="json", exclude_unset=True) == {"regression": {}, "decision": {"threshold": 0.5}}
    (metric,) = guess(sigmoid, "regress", None).metrics().values()
    assert metric.model_dump(mode="json", exclude_unset=True) == {"regression": {}}
    (metric,) = guess(read_model(models.mos), "classify", None).metrics().values()  # class logits, if they are
    assert metric.model_dump(mode="json", exclude_unset=True) == {"topk": {"k": 1}}


def test_the_refusal_names_regress_and_says_what_other_does():
    from trtflow.pipelines.init.model import ModelFacts, Tensor
    from trtflow.pipelines.init.task import guess

    facts = ModelFacts(Path("m.onnx"), 17, (Tensor("x", "float32", ("batch", 40)),),
                       (Tensor("out", "float32", ("batch", 64), "Gemm"),))
    with pytest.raises(SpecError) as err:
        guess(facts, None, None)
    hint = str(err.value.hint)
    assert "regress: values judged by their errors against FP32's, in the output's own units" in hint
    assert "other: no task metric, each output judged by one cosine with FP32's pooled over every sample" in hint
    assert "element by element" not in hint


# ------------------------------------------------------------------------------------------------------ validate

@pytest.mark.slow
def test_validate_bounds_a_regression_in_the_output_s_units(models, tmp_path):
    """The price-scaled network's FP16 variant (trtflow's converter) rounds outputs in the thousands by whole
    units: its cosine is 0.99999999 and its error 0.02% of the outputs' spread, which the default bounds pass; the
    user's `within: 0.5` (in the output's units) fails it, naming the value in those units."""
    data = {"tensors": save_samples(models.mos_x[:8], tmp_path / "samples")}
    spec = {"data": {"tensors": "*.npy"}, "locate_first_bad_layer": False}
    fp16 = run_stage(precision, PrecisionStage, tmp_path / "fp16", {"model": Artifact(models.price, "onnx", "prepare"),
                                                                     **data},
                     holdout=2, preflight="off", data={"tensors": "*.npy"})
    inputs = {"reference": Artifact(models.price, "onnx", "ref", "prepare"),
              "models": [Artifact(fp16.outputs["model"], "onnx", "fp16", "fp16")], **data}
    passed = run_stage(validate, ValidateStage, tmp_path / "default", inputs, metrics={"price": {"regression": {}}},
                       **spec)
    (cand,) = json.loads(passed.outputs["report"].read_text())["candidates"]
    price = cand["accuracy"]["outputs"]["price"]
    assert cand["runtime"].startswith("onnxruntime-cpu (simulated FP16")
    assert price["task"] is True and price["cosine"] > 0.9999999
    assert price["abs_err_max"] == pytest.approx(price["max_abs"])
    assert 0.5 < price["abs_err_max"] < 4  # FP16's spacing at 4096..8192 is 4
    assert price["abs_err_mean"] <= price["sample_err_mean"] <= price["abs_err_max"]
    assert price["spread_err_max"] < 0.001 and cand["bounds"]["price"] == {"spread_err_max": 0.01}

    with pytest.raises(StageFailed) as failed:
        run_stage(validate, ValidateStage, tmp_path / "within", inputs,
                  metrics={"price": {"regression": {"within": 0.5}}}, **spec)
    assert f"output 'price': abs_err_max {price['abs_err_max']:.5g} > 0.5" in str(failed.value), str(failed.value)
    (cand,) = json.loads(failed.value.result.outputs["report"].read_text())["candidates"]
    assert cand["bounds"]["price"] == {"abs_err_max": 0.5}  # in place of the default on the spread


def test_a_one_class_score_is_judged_by_its_decision_and_error_and_a_top1_of_one_class_is_refused(models, tmp_path):
    data = {"tensors": save_samples(models.score_x, tmp_path / "samples")}
    inputs = {"reference": Artifact(models.score, "onnx", "ref", "prepare"),
              "models": [Artifact(models.shifted, "onnx", "shifted", "prepare2")], **data}
    count = len(models.score_x)
    spec = {"data": {"tensors": "*.npy", "samples": count}, "locate_first_bad_layer": False}
    # what init wrote before: refused before anything runs, in one line naming the key
    with pytest.raises(StageError) as refused:
        run_stage(validate, ValidateStage, tmp_path / "topk", inputs, metrics={"malignant": {"topk": {"k": 1}}}, **spec)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("validate: metrics.malignant.topk.k: 1, and the output has 1 class "
                                                "along its axis: its top-1 holds every class, so it agrees whatever "
                                                "the candidate gives; a one-class score: declare decision: "), line

    ref, got = outputs(models.score, models.score_x), outputs(models.shifted, models.score_x)
    flipped = int(((ref > 0.5) != (got > 0.5)).sum())
    assert 0 < flipped < 10  # the trained score decides most held-out samples far from 0.5
    with pytest.raises(StageFailed) as failed:
        run_stage(validate, ValidateStage, tmp_path / "decision", inputs,
                  metrics={"malignant": {"decision": {"threshold": 0.5}, "regression": {}}},
                  tolerances={"malignant": {"decision_agree": 0.995}}, **spec)
    (cand,) = json.loads(failed.value.result.outputs["report"].read_text())["candidates"]
    score = cand["accuracy"]["outputs"]["malignant"]
    assert score["decision_agree"] == pytest.approx(1 - flipped / count)
    assert score["abs_err_max"] == pytest.approx(float(np.abs(ref - got).max()), rel=1e-5)
    assert f"output 'malignant': decision_agree {1 - flipped / count:.5g} < 0.995" in str(failed.value)

    # the release weighs the decision (a share lost), not the score's error (in the score's units)
    acc = STORED.validate_python(cand["accuracy"])
    shown, drop, where = selection.accuracy_drop(acc, weigh=True)
    assert (drop, where) == (pytest.approx(flipped / count), "malignant/decision_agree")
    assert set(shown["malignant"]) == {"decision_agree", "abs_err_max", "abs_err_mean", "sample_err_mean",
                                       "spread_err_max"}


# ------------------------------------------------------------------------------------------------------ release

def test_the_release_weighs_no_metric_nobody_declared(models):
    """Without metrics (what --task other wrote), a [N, 3] output still gets the top-1 every (batch, classes)
    output gets, for its report: the release weighed it ("accuracy drop 6.90% on mos/top1"). Now it weighs the
    cosine validate judged the output by, and no top-5 of three classes is reported."""
    acc, _ = compared(models, {})
    mos = acc.outputs["mos"]
    assert mos.task is False and "top1" in mos.task_values and "top5" not in mos.task_values
    shown, drop, where = selection.accuracy_drop(acc, weigh=True)
    assert shown == {"mos": {"cosine": mos.cosine}} and where == "mos/cosine"
    assert drop == pytest.approx(1 - mos.cosine) and drop < 0.01  # the cosine misses what a MOS user sees
    # a tolerance naming it declares it (examples/squeezenet-cls bounds its logits' top1 so): then it is weighed
    acc, _ = compared(models, {}, {"mos": {"top1": 0.5}})
    shown, drop, where = selection.accuracy_drop(acc, weigh=True)
    assert shown == {"mos": {"top1": acc.outputs["mos"].task_values["top1"]}} and where == "mos/top1"


def test_the_release_shows_errors_in_units_as_values_never_as_a_drop(models):
    """The drifted model is off by about a third of a MOS point: the regression metric and a function's error
    better lower say so in MOS points, validate fails it on its bound in those units, and the release's line, row
    and card show the value, never a percentage of it."""
    acc, violations = compared(models, {"mos": {"regression": {}}})
    worst = float(np.abs(outputs(models.mos, models.mos_x) - outputs(models.drifted, models.mos_x)).max())
    assert 0.25 < worst < 0.5 and acc.outputs["mos"].task_values["abs_err_max"] == pytest.approx(worst, rel=1e-6)
    assert acc.outputs["mos"].cosine > 0.999  # what `--task other` judged it by: passed at FP16's default
    spread = acc.outputs["mos"].task_values["spread_err_max"]
    assert violations == [f"output 'mos': spread_err_max {spread:.5g} > 0.01"]
    o = option(acc, None)
    assert (o.accuracy_drop, o.refused) == (None, None)  # nothing of it is a share lost: validate's bound holds it
    assert f"abs_err_max {worst:.4g}" in o.cells()[2] and o.cells()[3] == "-"

    metrics = {"mos": {"callable": {"function": "tests.test_regression_metrics:mos_err", "lower": ["mos_err"]}}}
    acc, violations = compared(models, metrics, {"mos": {"mos_err": {"max": 0.1}}})
    err = acc.outputs["mos"].task_values["mos_err"]
    assert 0.1 < err < worst and violations == [f"output 'mos': mos_err {err:.5g} > 0.1"]
    o = option(acc, violations[0])
    assert o.refused == f"failed validation: output 'mos': mos_err {err:.5g} > 0.1"
    assert o.accuracy_drop is None and o.cells()[3] == "-"  # before: "33.18% on mos/mos_err"
    shown = card_of(o)
    assert f"mos_err {err:.4g}" in shown and f"{err:.2%}" not in shown
    # passed by validate, a function's error is still shown as it is and weighed by nothing
    o = option(compared(models, metrics, {"mos": {"mos_err": {"max": 0.5}}})[0], None)
    assert o.refused is None and o.accuracy_drop is None and f"{err:.2%}" not in card_of(o)


def test_max_accuracy_drop_refuses_a_function_s_error_nothing_bounds(models, tmp_path):
    """A function's metric better lower is an error in its own units that max_accuracy_drop does not weigh: with
    no {max: x} on it, nothing would bound it, and `trtflow validate` says so in one line."""
    from trtflow.pipelines.graph import build_graph
    from trtflow.pipelines.loader import load_pipeline

    (tmp_path / "mos.onnx").write_bytes(models.mos.read_bytes())
    pipe = """version: 1
name: mos
model: mos.onnx
stages:
  fp16: {kind: precision, data: {random: true}}
  build: {kind: build}
  check:
    kind: validate
    metrics: {mos: {callable: {function: "tests.test_regression_metrics:mos_err", lower: [mos_err]}}}
  ship: {kind: release, select: {prefer: size, max_accuracy_drop: 1%}}
"""
    (tmp_path / "pipeline.yaml").write_text(pipe)
    with pytest.raises(SpecError) as err:
        build_graph(load_pipeline(tmp_path / "pipeline.yaml", environ={}))
    said = f"{err.value} {err.value.hint}"
    assert "stages.check.metrics.mos.callable declares mos_err better lower: errors in their own units" in said
    assert "bound them in stages.check.tolerances.mos with {max: x}, x in their units" in said
    proc = trtflow("validate", "pipeline.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "stages.ship.select.max_accuracy_drop" in proc.stderr, proc.stderr
    (tmp_path / "pipeline.yaml").write_text(pipe.replace("kind: validate\n",
                                                         "kind: validate\n    tolerances: {mos: {mos_err: {max: 0.1}}}\n"))
    build_graph(load_pipeline(tmp_path / "pipeline.yaml", environ={}))
