"""Ground truth for validate's data (issue #51): the labels file read as users write it, and each sample file
counted once against its label however batches and shape sets repeat it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trtflow.errors import StageError
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.compare.labels import Scored, Tally, load


def test_a_labels_file_reads_as_csv_or_json_by_name_or_index(tmp_path):
    csv = tmp_path / "labels.csv"
    csv.write_text("file,label\ndata/01-up-0.png,0\n02-down-180.png,180\n\n")
    assert load(csv, ["0", "180"], "validate: labels.file") == {"01-up-0.png": 0, "02-down-180.png": 1}
    js = tmp_path / "labels.json"
    js.write_text('{"a.png": 3, "b.png": 7}')
    assert load(js, [], "validate: labels.file") == {"a.png": 3, "b.png": 7}
    (tmp_path / "named.csv").write_text("a.png,upright\n")
    with pytest.raises(StageError, match=r"validate: labels.file: named.csv: 'a.png' is labelled 'upright', not a "
                                         r"class index"):
        load(tmp_path / "named.csv", [], "validate: labels.file")
    with pytest.raises(StageError, match=r"'a.png' is labelled 'upright', not one of 0, 180"):
        load(tmp_path / "named.csv", ["0", "180"], "validate: labels.file")
    (tmp_path / "bad.csv").write_text("a.png,0,extra\n")
    with pytest.raises(StageError, match="bad.csv: row 1 has 3 fields, not 2"):
        load(tmp_path / "bad.csv", [], "validate: labels.file")


def test_each_file_counts_once_against_its_label():
    files = [Path(f"{i}.png") for i in range(3)]
    tally = Tally("y", {"0.png": 0, "1.png": 1, "2.png": 2}, k=2)
    scores = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.0, 0.6, 0.4]])  # the last one wrong at top-1
    tally.add(Scored({"y": scores}, {}, files))
    tally.add(Scored({"y": scores}, {}, files))  # another shape set, the same files: not counted again
    got = tally.result()
    assert (got.samples, got.values, got.main) == (3, {"top1": pytest.approx(2 / 3), "top2": 1.0}, "top1")
    batch_of_two_per_file = Tally("y", {"0.png": 1}, k=1)
    batch_of_two_per_file.add(Scored({"y": np.array([[0.1, 0.9], [0.1, 0.9]])}, {}, [Path("0.png")]))
    assert batch_of_two_per_file.result().values == {"top1": 1.0}


def test_labels_need_sample_files():
    with pytest.raises(ValueError, match="labels: name the true class of sample files"):
        ValidateStage.model_validate({"kind": "validate", "labels": {"file": "l.csv", "output": "y"}})
    spec = ValidateStage.model_validate({"kind": "validate", "data": {"images": "data/*.png"},
                                         "labels": {"file": "data/labels.csv", "output": "y"}})
    assert spec.data_globs()["labels"] == ("data/labels.csv", ("labels", "file"))


def test_the_release_can_weigh_accuracy_against_the_labels():
    """select.accuracy: labels: max_accuracy_drop weighs the top-1 accuracy against the labels below FP32's; an
    engine validate scored against no labels may not ship; the card's line shows FP32 and the shipped engine."""
    from trtflow.pipelines.params.release import Select
    from trtflow.stages.compare.records import Labelled
    from trtflow.stages.release import selection
    from trtflow.stages.release.card import labelled_line
    from trtflow.stages.release.report import Option

    fp32 = Labelled(samples=8, values={"top1": 1.0}, main="top1")
    worse = Labelled(samples=8, values={"top1": 0.875}, main="top1")
    drop, where = selection.labelled_drop(worse, fp32)
    assert (drop, where) == (0.125, "labels/top1") and selection.labelled_drop(fp32, worse)[0] == 0.0
    rule = Select(max_accuracy_drop="5%", accuracy="labels")
    option = Option(name="int8.lines.native", variant="int8", precision="int8", target="native", profiles=["lines"],
                    engine_bytes=1, engine_sha256="0", labelled=worse, accuracy_drop=drop, drop_metric=where)
    assert selection.refusal(option, rule, None, True) == \
        "accuracy drop 12.50% on labels/top1 > select.max_accuracy_drop 5.00%"
    unlabelled = option.model_copy(update={"labelled": None, "accuracy_drop": None})
    assert selection.refusal(unlabelled, rule, None, True).startswith("select.accuracy: labels, but validate")
    assert labelled_line(option, fp32) == ("Against the labels (8 labelled samples): FP32 top1 100.00%; shipped "
                                          "(int8.lines.native) top1 87.50%")


REC = Path(__file__).resolve().parents[1] / "examples" / "ppocr-rec" / "models" / "ch_PP-OCRv4_rec_infer.onnx"
LINES = ["Model card", "trtflow 2026", "Triton server", "engine per target", "batch of 32", "FP16 and INT8",
         "calibration data", "release notes"]


def rendered_lines(out: Path) -> tuple[list[Path], Path]:
    """Text lines rendered from known strings (DejaVu Sans, matplotlib's own font, black on white, 32 px on a
    48 px line), and their labels.csv."""
    import csv

    import matplotlib
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"), 32)
    paths = []
    for i, text in enumerate(LINES):
        width = int(font.getlength(text)) + 16
        img = Image.new("RGB", (width, 48), "white")
        ImageDraw.Draw(img).text((8, 6), text, font=font, fill="black")
        paths.append(out / f"line{i:02d}.png")
        img.save(paths[-1])
    with open(out / "labels.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([("file", "text")] + [(p.name, t) for p, t in zip(paths, LINES)])
    return paths, out / "labels.csv"


def fp16_beside(tmp_path: Path, model: Path, images: list[Path], steps: list, metrics: dict) -> tuple:
    """The inputs of a validate stage on `images` through the preprocessing `steps` (as the parity stage writes
    it), the FP32 reference `model`, and its FP16 variant (the precision stage, judged by `metrics`)."""
    from tests.test_validate_stage import run_stage
    from trtflow.artifact import Artifact
    from trtflow.pipelines.params.precision import PrecisionStage
    from trtflow.stages.image import preprocess
    from trtflow.stages.precision import stage as precision

    pre = preprocess.save(preprocess.canonical(steps), tmp_path / "preprocess.json")
    inputs = {"preprocess": Artifact(pre, "preprocess", "parity"),
              "images": [Artifact(p, "file", p.name) for p in images]}
    reference = Artifact(model, "onnx", "ref", "prepare")
    fp16 = run_stage(precision, PrecisionStage, tmp_path / "fp16", {"model": reference, **inputs},
                     data={"images": "*.png"}, holdout=2, preflight="off", metrics=metrics)
    return inputs, reference, Artifact(fp16.outputs["model"], "onnx", "fp16", "fp16")


@pytest.mark.slow
def test_a_recognizer_is_scored_against_the_text_its_lines_hold(tmp_path):
    """PP-OCRv4's recognizer (its charset in the model's metadata, as RapidOCR ships it) reads lines rendered from
    known strings: FP32's and the FP16 variant's exact-read share and character error rate against the strings,
    beside their agreement with each other."""
    import json

    from tests.test_validate_stage import run_stage
    from trtflow.artifact import Artifact
    from trtflow.stages.validate import stage as validate

    paths, labels = rendered_lines(tmp_path)
    steps = [{"read": "bgr"}, {"resize": {"height": 48, "max_width": 320, "round": "ceil"}}, {"scale": "1/255"},
             {"normalize": {"mean": [0.5], "std": [0.5]}}, {"layout": "chw"},
             {"pad": {"size": [48, 320], "value": 0}}, {"batch": True}]
    text = {"softmax_11.tmp_0": {"ctc": {"blank": 0}}}
    inputs, reference, half = fp16_beside(tmp_path, REC, paths, steps, text)
    spec = {"data": {"images": "*.png"}, "metrics": text,
            "labels": {"file": "labels.csv", "output": "softmax_11.tmp_0", "text": {"charset": "model:character"}}}
    result = run_stage(validate, ValidateStage, tmp_path / "v",
                       {"reference": reference, "models": [half],
                        "labels": [Artifact(labels, "file", "labels")], **inputs}, **spec)
    report = json.loads(result.outputs["report"].read_text())
    fp32 = report["labelled"]
    assert fp32["samples"] == len(LINES) and fp32["main"] == "text_exact"
    assert fp32["values"]["text_exact"] >= 0.75 and fp32["values"]["cer"] <= 0.05, fp32
    half = report["candidates"][0]["labelled"]["values"]
    assert abs(half["text_exact"] - fp32["values"]["text_exact"]) <= 1 / len(LINES), (half, fp32)
    assert "against the labels" in result.summary and "on 8 labelled samples" in result.summary
    with pytest.raises(StageError, match=r"labels.text.charset: the model has no metadata entry 'chars' \(it has: "
                                         r"character\)"):
        run_stage(validate, ValidateStage, tmp_path / "w",
                  {"reference": reference, "models": [half],
                   "labels": [Artifact(labels, "file", "labels")], **inputs},
                  **{**spec, "labels": {**spec["labels"], "text": {"charset": "model:chars"}}})
