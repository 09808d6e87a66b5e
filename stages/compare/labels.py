"""Accuracy against ground truth (validate's `labels:`): each sample file's true class, scored on the class scores
an output gives (top-1, top-k), or its true text, read from a CTC recognizer's output through its charset (exact
share, character error rate); for the FP32 reference and each candidate alike, beside their agreement with FP32.
Boxes (`label_boxes.py`) and masks (`label_masks.py`) count the same way. The result is a `Labelled`
(`records.py`).

Rows of a batch belong to the files the sample was made of (`SampleSource.files_of`); a file counted once, however
many shape sets or batch fills repeat it."""
from __future__ import annotations

import csv
import errno
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from trtflow.errors import StageError
from trtflow.files import read_bounded
from trtflow.metrics.builtin.ctc import ctc_greedy, edit_distance
from trtflow.stages.compare.records import Labelled

LABELS_BYTES = 64 * 2**20  # a labels file: ImageNet's 50 000 validation labels are 2 MB, COCO's val2017 boxes 25 MB
_BOM = b"\xef\xbb\xbf"


def read_text(path: Path, limit: int, where: str) -> str:
    """The UTF-8 text of a file the user gave (a byte-order mark allowed), at most `limit` bytes: anything else
    refused in one line naming `where` and the file."""
    try:
        data = read_bounded(path, limit)
    except OSError as exc:
        raise StageError(f"{where}: {path.name} {_unreadable(exc, limit)}") from None
    body = data.removeprefix(_BOM)
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = exc.start + len(data) - len(body)
        line = data.count(b"\n", 0, at) + 1
        raise StageError(f"{where}: {path.name}: line {line}: byte {at} (0x{data[at]:02x}) is not UTF-8: save the "
                         f"file as UTF-8") from None


def _unreadable(exc: OSError, limit: int) -> str:
    if exc.errno == errno.EFBIG:
        return f"is larger than {limit:,} bytes, the most trtflow reads there: give a smaller file"
    return f"cannot be read: {exc.strerror or exc}"


def read_json(path: Path, limit: int, where: str) -> Any:
    """A JSON file the user gave, read as `read_text` does: one line naming `where`, the file and what is wrong."""
    text = read_text(path, limit, where)
    try:
        return json.loads(text)
    except RecursionError:  # json's scanner recurses once per nested array or object
        raise StageError(f"{where}: {path.name}: its JSON is nested deeper than Python's parser goes: no labels file "
                         f"nests more than a few levels") from None
    except ValueError as exc:
        raise StageError(f"{where}: {path.name} is not JSON ({exc})") from None


def read_pairs(path: Path, where: str) -> list[tuple[str, str]]:
    """(file name, label) from a CSV of `file,label` rows (a header allowed) or a JSON object."""
    if path.suffix.lower() == ".json":
        return _json_pairs(read_json(path, LABELS_BYTES, where), path, where)
    text = read_text(path, LABELS_BYTES, where)
    try:
        rows = [r for r in csv.reader(text.splitlines()) if r and any(c.strip() for c in r)]
    except csv.Error as exc:  # a field over csv.field_size_limit()
        raise StageError(f"{where}: {path.name}: {exc}: a row is a file name and its label") from None
    if rows and len(rows[0]) >= 2 and rows[0][0].strip().lower() in ("file", "image", "filename", "name"):
        rows = rows[1:]  # a header
    bad = next((i for i, r in enumerate(rows) if len(r) != 2), None)
    if bad is not None:
        raise StageError(f"{where}: {path.name}: row {bad + 1} has {len(rows[bad])} fields, not 2 (file,label)")
    return [(Path(r[0].strip()).name, r[1]) for r in rows]


def _json_pairs(raw: Any, path: Path, where: str) -> list[tuple[str, str]]:
    if not isinstance(raw, dict):
        raise StageError(f"{where}: {path.name}: not an object {{file: label}}")
    odd = next((k for k, v in raw.items() if not isinstance(v, (str, int, float))), None)
    if odd is not None:
        raise StageError(f"{where}: {path.name}: '{odd}' is labelled with {type(raw[odd]).__name__}: a label is a "
                         f"string or a class index")
    return [(Path(str(k)).name, str(v)) for k, v in raw.items()]


def load(path: Path, classes: list[str], where: str) -> dict[str, int]:
    """file name -> class index; a label is an index, or one of `classes` by name."""
    out: dict[str, int] = {}
    for name, raw in read_pairs(path, where):
        label = raw.strip()
        if label in classes:
            out[name] = classes.index(label)
        elif label.lstrip("-").isdigit() and not classes:
            out[name] = int(label)
        else:
            said = f"one of {', '.join(classes[:10])}" if classes else "a class index"
            raise StageError(f"{where}: {path.name}: '{name}' is labelled '{label}', not {said}")
    return out


@dataclass
class Scored:
    """One batch to count against the labels: every output by name, the feed, the files its rows were made of,
    and the preprocessing that made them from image files (None: saved tensors, labelled in their own pixels)."""
    outputs: dict[str, np.ndarray]
    feed: dict[str, np.ndarray]
    files: list[Path]
    pre: Any = None  # a stages.image.preprocess.Preprocessor

    @property
    def size(self) -> tuple[int, int] | None:
        """(height, width) of the images in the tensor fed (a map's scale against it); None for saved tensors."""
        if self.pre is None:
            return None
        x = next(iter(self.feed.values()))
        return (x.shape[-2], x.shape[-1]) if self.pre.layout == "chw" else (x.shape[-3], x.shape[-2])


class PerFile:
    """Counts each labelled file once: the rows of a batch belong to `files` in order, equally many each."""

    def __init__(self, output: str, labels: dict) -> None:
        self.output, self.labels = output, labels
        self.seen: set[str] = set()

    def first_seen(self, rows: int, files: list[Path]) -> Iterator[tuple[int, Path]]:
        """(row, file) for the rows whose file is labelled and not counted yet."""
        per = max(1, rows // max(1, len(files)))
        for r in range(rows):
            path = files[min(r // per, len(files) - 1)]
            if path.name not in self.seen and path.name in self.labels:
                self.seen.add(path.name)
                yield r, path


class Tally(PerFile):
    """Top-1 / top-k hits over the files seen, each counted once."""

    def __init__(self, output: str, labels: dict[str, int], k: int) -> None:
        super().__init__(output, labels)
        self.k = k
        self.top1 = self.topk = 0

    def add(self, scored: Scored) -> None:
        """The output's scores: batch first, classes last."""
        scores = scored.outputs[self.output]
        rows = np.nan_to_num(scores.reshape(scores.shape[0], -1).astype(np.float64), nan=-np.inf)
        for r, path in self.first_seen(rows.shape[0], scored.files):
            want, row = self.labels[path.name], rows[r]
            k = min(self.k, row.shape[0])
            self.top1 += int(int(row.argmax()) == want)
            self.topk += int(want in np.argpartition(-row, k - 1)[:k])

    def result(self) -> Labelled | None:
        n = len(self.seen)
        if not n:
            return None
        values = {"top1": self.top1 / n}
        if self.k > 1:
            values[f"top{self.k}"] = self.topk / n
        return Labelled(samples=n, values=values, main="top1")


class TextTally(PerFile):
    """Each file's text as the recognizer reads it (greedy CTC through the charset) against its label: the share
    read exactly and the character error rate (edits / label characters), each file once."""

    def __init__(self, output: str, labels: dict[str, str], charset: list[str], axis: int = -1) -> None:
        super().__init__(output, labels)
        self.charset, self.axis = charset, axis
        self.exact = self.edits = self.chars = 0

    def read(self, ids: list[int]) -> str:
        return "".join(self.charset[i - 1] if 0 < i <= len(self.charset) else "\ufffd" for i in ids)

    def add(self, scored: Scored) -> None:
        decoded = ctc_greedy(scored.outputs[self.output], 0, self.axis)
        for r, path in self.first_seen(len(decoded), scored.files):
            got, want = self.read(decoded[r]), self.labels[path.name]
            self.exact += int(got == want)
            self.edits += edit_distance(list(got), list(want))
            self.chars += max(1, len(want))

    def result(self) -> Labelled | None:
        n = len(self.seen)
        if not n:
            return None
        return Labelled(samples=n, values={"text_exact": self.exact / n, "cer": self.edits / self.chars},
                        main="text_exact")
