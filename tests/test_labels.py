"""Ground truth for validate's data (issue #51): the labels file read as users write it, and each sample file
counted once against its label however batches and shape sets repeat it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trtflow.errors import StageError
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.compare.labels import Tally, load


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
    tally = Tally({"0.png": 0, "1.png": 1, "2.png": 2}, k=2)
    scores = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.0, 0.6, 0.4]])  # the last one wrong at top-1
    tally.add(scores, files)
    tally.add(scores, files)  # another shape set, the same files: not counted again
    got = tally.result()
    assert (got.samples, got.top1, got.topk) == (3, pytest.approx(2 / 3), 1.0)
    batch_of_two_per_file = Tally({"0.png": 1}, k=1)
    batch_of_two_per_file.add(np.array([[0.1, 0.9], [0.1, 0.9]]), [Path("0.png")])
    assert batch_of_two_per_file.result().top1 == 1.0


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
    from trtflow.stages.compare.labels import Labelled
    from trtflow.stages.release import selection
    from trtflow.stages.release.card import labelled_line
    from trtflow.stages.release.report import Option

    fp32 = Labelled(samples=8, top1=1.0, topk=1.0, k=1)
    worse = Labelled(samples=8, top1=0.875, topk=1.0, k=1)
    drop, where = selection.labelled_drop(worse, fp32)
    assert (drop, where) == (0.125, "labels/top1") and selection.labelled_drop(fp32, worse)[0] == 0.0
    rule = Select(max_accuracy_drop="5%", accuracy="labels")
    option = Option(name="int8.lines.native", variant="int8", precision="int8", target="native", profiles=["lines"],
                    engine_bytes=1, engine_sha256="0", labelled=worse, accuracy_drop=drop, drop_metric=where)
    assert selection.refusal(option, rule, None, True) == \
        "accuracy drop 12.50% on labels/top1 > select.max_accuracy_drop 5.00%"
    unlabelled = option.model_copy(update={"labelled": None, "accuracy_drop": None})
    assert selection.refusal(unlabelled, rule, None, True).startswith("select.accuracy: labels, but validate")
    assert labelled_line(option, fp32) == ("Against the labels (8 labelled samples): FP32 top-1 100.00%; shipped "
                                          "(int8.lines.native) top-1 87.50%")
