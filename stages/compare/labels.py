"""Accuracy against ground truth: each sample file's true class (validate's `labels:`), scored on the class scores
an output gives, for the FP32 reference and each candidate alike, beside their agreement with FP32.

Rows of a batch belong to the files the sample was made of (`SampleSource.files_of`); a file counted once, however
many shape sets or batch fills repeat it."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from trtflow.errors import StageError


class Labelled(BaseModel):
    """Top-1 and top-k accuracy against the labels, over `samples` labelled files."""
    samples: int
    top1: float
    topk: float
    k: int

    def text(self) -> str:
        return f"top-1 {self.top1:.2%}, top-{self.k} {self.topk:.2%} on {self.samples} labelled samples"


def load(path: Path, classes: list[str], where: str) -> dict[str, int]:
    """file name -> class index, from a CSV of `file,label` rows or a JSON object; a label is an index, or one of
    `classes` by name."""
    text = path.read_text(encoding="utf-8-sig")
    try:
        if path.suffix.lower() == ".json":
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise ValueError("not an object {file: label}")
            pairs = [(str(k), str(v)) for k, v in raw.items()]
        else:
            rows = [r for r in csv.reader(text.splitlines()) if r and any(c.strip() for c in r)]
            if rows and len(rows[0]) >= 2 and rows[0][0].strip().lower() in ("file", "image", "filename", "name"):
                rows = rows[1:]  # a header
            bad = next((i for i, r in enumerate(rows) if len(r) != 2), None)
            if bad is not None:
                raise ValueError(f"row {bad + 1} has {len(rows[bad])} fields, not 2 (file,label)")
            pairs = [(r[0].strip(), r[1].strip()) for r in rows]
    except ValueError as exc:
        raise StageError(f"{where}: {path.name}: {exc}") from None
    out: dict[str, int] = {}
    for name, label in pairs:
        if label in classes:
            out[Path(name).name] = classes.index(label)
        elif label.lstrip("-").isdigit() and not classes:
            out[Path(name).name] = int(label)
        else:
            said = f"one of {', '.join(classes[:10])}" if classes else "a class index"
            raise StageError(f"{where}: {path.name}: '{name}' is labelled '{label}', not {said}")
    return out


class Tally:
    """Top-1 / top-k hits over the files seen, each counted once."""

    def __init__(self, labels: dict[str, int], k: int) -> None:
        self.labels, self.k = labels, k
        self.seen: set[str] = set()
        self.top1 = self.topk = 0

    def add(self, scores: np.ndarray, files: list[Path]) -> None:
        """`scores`: one output, batch first, classes last; its rows are `files`' (in order, equally many each)."""
        rows = scores.reshape(scores.shape[0], -1) if scores.ndim != 2 else scores
        per = max(1, rows.shape[0] // max(1, len(files)))
        for r, row in enumerate(np.nan_to_num(rows.astype(np.float64), nan=-np.inf)):
            f = files[min(r // per, len(files) - 1)]
            if f.name in self.seen or f.name not in self.labels:
                continue
            self.seen.add(f.name)
            want = self.labels[f.name]
            k = min(self.k, row.shape[0])
            self.top1 += int(int(row.argmax()) == want)
            self.topk += int(want in np.argpartition(-row, k - 1)[:k])

    def result(self) -> Labelled | None:
        n = len(self.seen)
        return Labelled(samples=n, top1=self.top1 / n, topk=self.topk / n, k=self.k) if n else None
