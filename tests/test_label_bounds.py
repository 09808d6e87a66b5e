"""Validate's labels bounded (issue #67, items 6 and 7): a labels file, a charset or a mask that is not UTF-8, nested
too deep, too large, holds non-finite numbers or declares too many pixels is refused in one line naming the key
(`validate: labels.file`, `labels.text.charset`) and the file, as a StageError: never "unexpected", never retried.
Masks are sized from their headers before anything decodes them."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest

from tests.assets import IMAGENET, PHOTOS, SQUEEZENET
from trtflow.artifact import Artifact, Inputs
from trtflow.errors import StageError, TransientStageError
from trtflow.image_header import MAX_PIXELS
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.compare.label_boxes import read_coco
from trtflow.stages.compare.label_masks import MaskTally, mask_files
from trtflow.stages.compare.labels import LABELS_BYTES, Scored, load, read_pairs
from trtflow.stages.image import preprocess
from trtflow.stages.validate.labelling import CHARSET_BYTES, WHERE, LabelSet

DEEP = 100_000


def refused(call, *args) -> str:
    """The one line a StageError says (the non-retried kind), where `call(*args)` refuses its input."""
    with pytest.raises(StageError) as caught:
        call(*args)
    error = caught.value
    assert type(error) is StageError and not isinstance(error, TransientStageError) and error.exit_code == 1
    line = str(error)
    assert "\n" not in line, line
    return line


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def header_png(path: Path, width: int, height: int) -> Path:
    """A gray PNG whose header declares width x height, its pixels no zlib stream: OpenCV decodes nothing of it."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", b"no zlib stream")
                     + _chunk(b"IEND", b""))
    return path


# --- labels files -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, said", [
    (b"file,label\na.png,0\nb\xff.png,1\n", "labels.csv: line 3: byte 20 (0xff) is not UTF-8: save the file as UTF-8"),
    (b"\xef\xbb\xbfa.png,0\n\xc3(.png,1\n", "labels.csv: line 2: byte 11 (0xc3) is not UTF-8"),
    (b"a.png," + b"x" * 200_000 + b"\n", "labels.csv: field larger than field limit"),
], ids=["latin-1 byte", "after a BOM", "csv field limit"])
def test_a_labels_csv_that_is_not_utf8_is_refused_naming_the_line_and_byte(tmp_path, body, said):
    """Was a UnicodeDecodeError (and csv's own Error for a field over its limit): "unexpected", retried."""
    path = tmp_path / "labels.csv"
    path.write_bytes(body)
    line = refused(load, path, [], WHERE)
    assert line.startswith(f"validate: labels.file: {said}"), line


@pytest.mark.parametrize("name, body", [
    ("labels.json", '{"a.png": ' + "[" * DEEP + "]" * DEEP + "}"),
    ("instances.json", '{"images": ' + "[" * DEEP + "]" * DEEP + "}"),
], ids=["labels", "coco"])
def test_json_nested_100000_deep_is_refused(tmp_path, name, body):
    """Was a RecursionError out of json.loads."""
    path = tmp_path / name
    path.write_text(body)
    reader = read_pairs if name == "labels.json" else read_coco
    line = refused(reader, path, WHERE)
    assert line.startswith(f"validate: labels.file: {name}: its JSON is nested deeper than"), line


def test_a_labels_file_over_its_byte_limit_is_refused_before_it_is_read(tmp_path):
    """Read whole before, however large: a sparse file of LABELS_BYTES + 1 (nothing on disk) is refused from its
    size."""
    path = tmp_path / "labels.csv"
    with open(path, "wb") as f:
        f.truncate(LABELS_BYTES + 1)
    line = refused(load, path, [], WHERE)
    assert line.startswith(f"validate: labels.file: labels.csv is larger than {LABELS_BYTES:,} bytes"), line


@pytest.mark.parametrize("number, at", [("NaN", 2), ("Infinity", 3), ("-Infinity", 0), ("1e999", 1)])
def test_a_coco_bbox_with_a_non_finite_number_is_refused(tmp_path, number, at):
    """JSON's NaN and Infinity (and 1e999, which Python reads as inf) passed CocoBox and reached COCOeval."""
    bbox = ["10", "10", "20", "20"]
    bbox[at] = number
    path = tmp_path / "instances.json"
    path.write_text('{"images": [{"id": 1, "file_name": "a.png"}], "categories": [{"id": 3}], "annotations": '
                    f'[{{"image_id": 1, "category_id": 3, "bbox": [{", ".join(bbox)}]}}]}}')
    line = refused(read_coco, path, WHERE)
    assert line.startswith(f"validate: labels.file: instances.json: annotations.0.bbox.{at}: Input should be a "
                           f"finite number"), line


# --- the charset --------------------------------------------------------------------------------------------------

def _text_labels(tmp_path: Path, charset: Path) -> LabelSet:
    labels = tmp_path / "labels.csv"
    labels.write_text("a.png,ab\n")
    params = ValidateStage.model_validate({"kind": "validate", "data": {"images": "*.png"}, "labels": {
        "file": "labels.csv", "output": "y", "text": {"charset": charset.name}}})
    inputs = Inputs({"labels": [Artifact(labels, "file", "l")], "images": [Artifact(tmp_path / "a.png", "file", "a")],
                     "charset": [Artifact(charset, "file", "c")]})
    return LabelSet(params, inputs, onnx.ModelProto(), ["y"])


def test_a_charset_that_is_not_utf8_or_too_large_is_refused(tmp_path):
    """Read with nothing caught before (a UnicodeDecodeError), and whole however large (64 MB: 14 s)."""
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"a\nb\n" + "é\n".encode("latin-1"))
    line = refused(_text_labels, tmp_path, latin)
    assert line == ("validate: labels.text.charset: latin.txt: line 3: byte 4 (0xe9) is not UTF-8: save the file as "
                    "UTF-8"), line
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(CHARSET_BYTES + 1)
    line = refused(_text_labels, tmp_path, huge)
    assert line.startswith(f"validate: labels.text.charset: huge.txt is larger than {CHARSET_BYTES:,} bytes"), line
    good = tmp_path / "keys.txt"
    good.write_text("\ufeffa\nb\n", encoding="utf-8")  # a BOM is no character
    assert _text_labels(tmp_path, good).charset == ["a", "b", " "]


# --- masks: sized from their headers -----------------------------------------------------------------------------

@pytest.mark.parametrize("side", [60000, 32000])
def test_a_mask_whose_header_declares_too_many_pixels_is_refused_before_it_is_decoded(tmp_path, side):
    """60000x60000 was OpenCV's cv2.error (over its own 2**30 pixels), "unexpected"; 32000x32000 was decoded
    (1 GB, then 8 GB as int64). Both are refused from the header: when the masks are matched to the images, before
    anything runs, and when one is scored."""
    mask = header_png(tmp_path / "a.png", side, side)
    line = refused(mask_files, [mask], ["a.png"], WHERE)
    assert line.startswith("validate: labels.file: mask a.png declares more than"), line
    assert f"over trtflow's limit of {MAX_PIXELS:,} (MAX_PIXELS)" in line, line
    tally = MaskTally("y", {"a.png": mask}, 1, None, 255, "validate: labels.masks")
    line = refused(tally.add, Scored({"y": np.zeros((1, 2, 4, 4), np.float32)}, {}, [tmp_path / "a.png"]))
    assert line.startswith("validate: labels.masks: mask a.png declares more than") and "MAX_PIXELS" in line, line


def test_a_mask_of_another_size_than_its_image_is_refused_from_its_header(tmp_path):
    """The sizes were compared after the mask was decoded whole: its header (5x4, its pixels no PNG stream) is
    refused against the image (4x4) and against the output's map, and never decoded."""
    image = tmp_path / "a.png"
    cv2.imwrite(str(image), np.zeros((4, 4, 3), np.uint8))
    (tmp_path / "masks").mkdir()
    mask = header_png(tmp_path / "masks" / "a.png", 4, 5)
    pre = preprocess.Preprocessor(preprocess.canonical([{"read": "rgb"}]))
    logits = np.zeros((1, 2, 4, 4), np.float32)
    tally = MaskTally("y", {"a.png": mask}, 1, None, 255, "validate: labels.masks")
    line = refused(tally.add, Scored({"y": logits}, {"x": pre(image)}, [image], pre))
    assert line == "validate: labels.masks: a.png is 5x4, its image a.png 4x4", line
    tally = MaskTally("y", {"a.png": mask}, 1, None, 255, "validate: labels.masks")
    line = refused(tally.add, Scored({"y": logits}, {}, [image]))
    assert line == "validate: labels.masks: a.png is 5x4, the output's map 4x4", line


def test_a_mask_is_scored_in_its_own_dtype(tmp_path):
    """A 16-bit mask (classes past 255) scores as before, kept as OpenCV decodes it (uint16), not widened whole; a
    float TIFF's values are no class ids."""
    logits = np.zeros((1, 300, 2, 2), np.float32)
    logits[0, 299, 0] = 1  # class 299 on the top row, class 0 below
    mask = np.array([[299, 299], [0, 7]], np.uint16)
    cv2.imwrite(str(tmp_path / "a.png"), mask)
    tally = MaskTally("y", {"a.png": tmp_path / "a.png"}, 1, None, 65535, "validate: labels.masks")
    tally.add(Scored({"y": logits}, {}, [tmp_path / "a.png"]))
    assert tally.result().values == {"miou": pytest.approx((1 + 0.5 + 0) / 3), "pixel_accuracy": 0.75}
    cv2.imwrite(str(tmp_path / "b.tiff"), np.full((2, 2), 1.5, np.float32))  # truncated to class 1 before
    tally = MaskTally("y", {"b.png": tmp_path / "b.tiff"}, 1, None, 65535, "validate: labels.masks")
    line = refused(tally.add, Scored({"y": logits}, {}, [tmp_path / "b.png"]))
    assert line == "validate: labels.masks: b.tiff holds float32 values: a mask is integer class ids (an 8- or 16-bit " \
                   "PNG)", line


# --- through the stage's own process ----------------------------------------------------------------------------

def test_the_validate_stage_refuses_a_bad_labels_file_as_bad_input_not_retried(tmp_path, monkeypatch):
    """The validate stage in its own process, as `trtflow run` starts it: a labels CSV with a non-UTF-8 byte comes
    back as the StageError it raised (exit 1, one line naming labels.file), which Prefect's retry condition does not
    retry; not "failed unexpectedly" (a TransientStageError)."""
    from trtflow.flows import isolate
    from trtflow.flows.pipeline_flow import _retry_unless_user_error
    from trtflow.stages.validate import stage as validate

    monkeypatch.delenv(isolate.IN_PROCESS, raising=False)
    labels = tmp_path / "labels.csv"
    labels.write_bytes(b"".join(p.name.encode() + b",0\n" for p in PHOTOS[:-1]) + PHOTOS[-1].name.encode() + b",\xff\n")
    pre = preprocess.save(preprocess.canonical(IMAGENET), tmp_path / "preprocess.json")
    reference = Artifact(SQUEEZENET, "onnx", "ref", "prepare")
    inputs = Inputs({"reference": reference, "models": [reference], "preprocess": Artifact(pre, "preprocess", "p"),
                     "images": [Artifact(p, "file", p.name) for p in PHOTOS], "labels": [Artifact(labels, "file", "l")]})
    params = ValidateStage.model_validate({"kind": "validate", "data": {"images": "*.png", "samples": len(PHOTOS)},
                                           "labels": {"file": "labels.csv", "output": "logits"}})
    (tmp_path / "out").mkdir()
    with pytest.raises(StageError) as caught:
        isolate.call_stage(validate.run, (params, inputs, tmp_path / "out"), 120, "validate")
    error = caught.value
    assert type(error) is StageError and error.exit_code == 1
    line = str(error)
    assert line == (f"validate: labels.file: labels.csv: line {len(PHOTOS)}: byte {labels.stat().st_size - 2} (0xff) "
                    f"is not UTF-8: save the file as UTF-8"), line
    assert "unexpectedly" not in line
    state = type("State", (), {"result": lambda self, raise_on_failure=False: error})()
    assert _retry_unless_user_error(None, None, state) is False


def test_the_stages_images_are_refused_from_their_header_before_any_decode(tmp_path):
    """Issue #67 Build 4: one header reader for init --data, masks and the stages' images: a data image whose header
    declares 60000x60000 is refused in one line naming the file and the key, before OpenCV allocates it."""
    import struct
    import zlib

    from trtflow.errors import StageError
    from trtflow.stages.image.headers import check_images

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    huge = tmp_path / "huge.png"
    huge.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    with pytest.raises(StageError, match=r"^validate: data.images: huge.png declares more than [\d,]+ pixels, over trtflow.s limit .*: resize it$"):
        check_images([huge], "validate: data.images")
    other = tmp_path / "other.ppm"  # no header Pillow reads among trtflow's formats: left to OpenCV
    other.write_bytes(b"P6\n2 2\n255\n" + bytes(12))
    check_images([other], "validate: data.images")
