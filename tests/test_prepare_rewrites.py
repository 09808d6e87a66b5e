"""Issue #68: prepare rewrites what TensorRT's parser refuses, each rewrite kept only once ONNX Runtime and the parser
agree with it. Your own rewrites (`prepare.rewrites: [package.module:function]`) are applied first and checked the
same way; one that changes the model's outputs stops the stage with the measured difference."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.assets import PPOCR
from tests.test_prepare_stage import run_prepare
from trtflow.errors import StageError

FIXES = '''
import onnx

def same(model):
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.doc_string = "touched by a rewrite of mine"
    return model

def doubles(model):
    from onnx import helper
    model = onnx.ModelProto.FromString(model.SerializeToString())
    out = model.graph.output[0]
    model.graph.node[-1].output[0] = out.name + "_half"
    two = helper.make_tensor("two", onnx.TensorProto.FLOAT, [], [2.0])
    model.graph.initializer.append(two)
    model.graph.node.append(helper.make_node("Mul", [out.name + "_half", "two"], [out.name], name="doubling"))
    return model

def not_a_model(model):
    return "nothing"
'''


@pytest.fixture
def fixes(tmp_path, monkeypatch):
    (tmp_path / "mine_fixes.py").write_text(textwrap.dedent(FIXES))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_your_rewrite_is_applied_checked_and_listed(tmp_path, fixes):
    result = run_prepare(PPOCR, tmp_path / "out", rewrites=["mine_fixes:same"], input_shapes={"x": [1, 3, 48, 192]},
                         preflight="off")
    report = json.loads(result.outputs["report"].read_text())
    (record,) = report["rewrites"]
    assert record["rule"] == "mine_fixes:same" and record["kept"] and record["max_abs"] == 0.0
    assert "mine_fixes:same" in result.summary and "touched by a rewrite" in Path(result.outputs["model"]).read_bytes(
    ).decode("latin-1")


def test_your_rewrite_that_changes_the_outputs_stops_the_stage_with_the_difference(tmp_path, fixes):
    with pytest.raises(StageError, match=r"prepare: rewrites: mine_fixes:doubles changes the model's outputs: "
                                         r"ONNX Runtime's outputs differ \(.*max \|diff\|"):
        run_prepare(PPOCR, tmp_path / "out", rewrites=["mine_fixes:doubles"], input_shapes={"x": [1, 3, 48, 192]},
                    preflight="off")


def test_your_rewrite_that_returns_no_model_is_refused_in_one_line(tmp_path, fixes):
    with pytest.raises(StageError, match="mine_fixes:not_a_model returned str, not an onnx.ModelProto"):
        run_prepare(PPOCR, tmp_path / "out", rewrites=["mine_fixes:not_a_model"], preflight="off")


def test_your_rewrites_are_in_the_key():
    from trtflow.pipelines.params.prepare import PrepareStage

    stage = PrepareStage.model_validate({"kind": "prepare", "rewrites": ["mine_fixes:same"]})
    assert stage.code_refs() == ["mine_fixes:same"] and stage.key_params()["rewrites"] == ["mine_fixes:same"]


# --- a real trained model whose only problem is a node the parser refuses -----------------------------------------

REWRITE_PIPELINE = """
version: 1
name: ocr-cls-aa
model: models/cls-antialiased.onnx
stages:
  prepare: {kind: prepare, input_shapes: {x: [1, 3, 96, 384]}, check: {data: {tensors: "data/*.npy"}}}
  build:
    kind: build
    profiles: {line: {x: {min: [1, 3, 96, 384], opt: [1, 3, 96, 384], max: [1, 3, 96, 384]}}}
  validate:
    kind: validate
    data: {tensors: "data/*.npy"}
    tolerances: {"*": {top1: 100%}}
  release: {kind: release, select: {require: validated, prefer: size}}
"""


def _antialiased_classifier(path: Path) -> None:
    """PP-OCR's direction classifier (real, trained) taking text lines at twice its size and halving them with an
    antialiased Resize inside the graph, as `F.interpolate(..., antialias=True)` exports at opset 18."""
    import numpy as np
    import onnx
    from onnx import helper, version_converter

    model = version_converter.convert_version(onnx.load(str(PPOCR)), 18)
    graph = model.graph
    (x,) = [i for i in graph.input if i.name == "x"]
    for node in graph.node:
        node.input[:] = ["x_half" if name == "x" else name for name in node.input]
    for dim, size in zip(x.type.tensor_type.shape.dim, (1, 3, 96, 384)):
        dim.Clear()
        dim.dim_value = size
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "halve"))
    graph.node.insert(0, helper.make_node("Resize", ["x", "", "halve"], ["x_half"], name="antialiased_halving",
                                          mode="linear", antialias=1))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _text_lines(folder: Path) -> None:
    """The example's real text lines as the classifier takes them, at twice the size (the model halves them)."""
    import numpy as np

    from tests.assets import EXAMPLES
    from trtflow.stages.image.paddleocr import cls_resize_norm_img

    folder.mkdir()
    for i, image in enumerate(sorted((EXAMPLES / "ppocr-cls" / "data").glob("*.png"))[:6]):
        small = cls_resize_norm_img(str(image))
        np.save(folder / f"{i}.npy", small.repeat(2, axis=1).repeat(2, axis=2)[None].astype(np.float32))


@pytest.mark.slow
def test_a_model_whose_only_problem_is_an_antialiased_resize_ships_with_the_rewrite_named(workdir, prefect_api,
                                                                                         tensorrt_backend):
    """Done when (issue #68): no change to the pipeline file beyond what the model needs; prepare rewrites the
    node the parser refuses, the engine builds, validate passes on real text lines, the release ships, and the
    report and the card name the rewrite and its measured difference."""
    from tests.assets import last_report, trtflow

    _antialiased_classifier(workdir / "models" / "cls-antialiased.onnx")
    _text_lines(workdir / "data")
    (workdir / "pipeline.yaml").write_text(REWRITE_PIPELINE.lstrip())
    done = trtflow("run", "pipeline.yaml", cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    prepared = last_report(workdir / ".trtflow", "prepare")
    (kept,) = [r for r in prepared["rewrites"] if r["kept"]]
    assert (kept["node"], kept["op_type"], kept["rule"]) == ("antialiased_halving", "Resize", "resize-matmul")
    assert kept["max_abs"] is not None and kept["max_abs"] < 1e-4
    assert prepared["preflight"]["parsed"] and prepared["preflight"]["trial_build"]["ok"]
    card = (Path(trtflow("output", "pipeline.yaml", "release", "card", cwd=workdir).stdout.strip())
            / "model-card.md").read_text()
    assert "## What was changed in the model" in card and "resize-matmul" in card
    assert f"{kept['max_abs']:.3g}" in card

    off = trtflow("run", "pipeline.yaml", "--set", "stages.prepare.rewrites=none", cwd=workdir)
    assert off.returncode == 1, off.stdout + off.stderr
    (line,) = [ln for ln in off.stderr.splitlines() if ln.strip()]
    assert "antialiased_halving (Resize)" in line and "rule resize-matmul" in line, line


# --- a real trained model from a wheel: scikit-learn's Scaler in front of an MLP ----------------------------------

SURFACES = "surfaces-onnx-files==0.0.1"  # MIT: trained MLP surrogates of hyperparameter search, exported by skl2onnx
SURROGATE = "surfaces_onnx_files/gradient_boosting_regressor.onnx"
SCALER_PIPELINE = """
version: 1
name: gbr-surrogate
model: models/surrogate.onnx
stages:
  prepare: {kind: prepare, input_shapes: {input: [8, 4]}, check: {data: {tensors: "data/*.npy"}}}
  build:
    kind: build
    profiles: {search: {input: {min: [1, 4], opt: [8, 4], max: [64, 4]}}}
  validate:
    kind: validate
    data: {tensors: "data/*.npy"}
    tolerances: {"*": {max_abs: 0.001}}
  release: {kind: release, select: {require: validated, prefer: size}}
"""


def _hyperparameters(folder: Path) -> None:
    """Batches of 8 hyperparameter settings of the kind the surrogate was fitted on: [cv, dataset, max_depth,
    n_estimators] (its meta.json: dataset 0 is diabetes)."""
    import numpy as np

    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        batch = np.stack([rng.integers(2, 11, 8), np.zeros(8), rng.integers(2, 30, 8), rng.integers(10, 300, 8)], 1)
        np.save(folder / f"{i}.npy", batch.astype(np.float32))


@pytest.mark.slow
def test_a_trained_scikit_learn_model_whose_scaler_the_parser_refuses_ships(workdir, prefect_api, tensorrt_backend):
    """Issue #68 Build 5: a real trained model from a wheel, refused by the parser (ai.onnx.ml Scaler: no
    importer), runs to a release with the Scaler rewritten into a Sub and a Mul, its predictions unchanged."""
    import shutil

    from tests.assets import last_report, trtflow, wheel_file

    shutil.copy(wheel_file(SURFACES, SURROGATE), workdir / "models" / "surrogate.onnx")
    _hyperparameters(workdir / "data")
    (workdir / "pipeline.yaml").write_text(SCALER_PIPELINE.lstrip())
    done = trtflow("run", "pipeline.yaml", cwd=workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    prepared = last_report(workdir / ".trtflow", "prepare")
    (kept,) = [r for r in prepared["rewrites"] if r["kept"]]
    assert (kept["op_type"], kept["rule"]) == ("Scaler", "scaler-sub-mul") and kept["max_abs"] < 1e-6
    assert prepared["preflight"]["parsed"] and prepared["preflight"]["trial_build"]["ok"]
    released = last_report(workdir / ".trtflow", "release")
    assert [r["rule"] for r in released["rewrites"]] == ["scaler-sub-mul"]


@pytest.mark.slow
def test_init_says_which_rewrite_prepare_will_apply(tmp_path, tensorrt_backend):
    """Issue #68 Build 1: `trtflow init` reads the same diagnosis: a node the parser rejects that a rule covers is
    said in the file it writes, with the rule, and the trial is 'not checked' rather than failed."""
    from tests.assets import trtflow

    _antialiased_classifier(tmp_path / "cls.onnx")
    done = trtflow("init", "cls.onnx", "--task", "classify", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    text = " ".join(line.strip().lstrip("#").strip() for line in (tmp_path / "pipeline.yaml").read_text().splitlines())
    assert "prepare rewrites 1 of them (rewrites: auto, checked when it runs): antialiased_halving (Resize) by " \
           "resize-matmul" in text and "FAILS" not in text
