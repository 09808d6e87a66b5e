"""A detector against COCO-format labels (validate's `labels: {boxes: ...}`): each labelled image's boxes decoded
from the outputs, suppressed, taken back through the preprocessing to the image as read, and scored by
pycocotools' COCOeval (mAP over IoU 0.5:0.95, and at 0.5) over the images seen, each once."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from trtflow.errors import StageError
from trtflow.metrics.builtin.detections import BoxDecoder
from trtflow.stages.compare.labels import LABELS_BYTES, PerFile, Scored, read_json
from trtflow.stages.compare.records import Labelled


class _Loose(BaseModel):
    # COCO files carry more (segmentation, licenses, info); JSON's NaN and Infinity (and 1e999) are no coordinates
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class CocoImage(_Loose):
    id: int
    file_name: str
    width: int | None = None
    height: int | None = None


class CocoBox(_Loose):
    image_id: int
    category_id: int
    bbox: list[float]
    iscrowd: int = 0
    area: float | None = None
    id: int | None = None


    @field_validator("bbox")
    @classmethod
    def _four(cls, v: list[float]) -> list[float]:
        if len(v) != 4 or v[2] < 0 or v[3] < 0:
            raise ValueError(f"{v} is not [x, y, width, height]: 4 numbers, sizes not negative")
        return v


class CocoCategory(_Loose):
    id: int
    name: str = ""


class CocoFile(_Loose):
    """What pycocotools reads of a COCO instances file."""
    images: list[CocoImage]
    annotations: list[CocoBox]
    categories: list[CocoCategory]


def read_coco(path: Path, where: str) -> CocoFile:
    """The labels file, checked: one line naming the first thing wrong in it."""
    raw = read_json(path, LABELS_BYTES, where)
    try:
        coco = CocoFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        at = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise StageError(f"{where}: {path.name}: {at}: {msg} (a COCO instances file: images [{{id, "
                         f"file_name}}], annotations [{{image_id, category_id, bbox: [x, y, w, h]}}], "
                         f"categories [{{id, name}}])") from None
    known = {c.id for c in coco.categories}
    stray = next((a for a in coco.annotations if a.category_id not in known), None)
    if stray is not None:
        raise StageError(f"{where}: {path.name}: an annotation of image {stray.image_id} has category_id "
                         f"{stray.category_id}, which categories does not list")
    return coco


class BoxTally(PerFile):
    """Each labelled image's detections, in the labels' coordinates, and COCOeval over them."""

    def __init__(self, output: str, coco: CocoFile, decoder: BoxDecoder, category_ids: list[int],
                 where: str) -> None:
        self.ids = {Path(i.file_name).name: i.id for i in coco.images}
        super().__init__(output, self.ids)
        self.coco, self.decoder, self.where = coco, decoder, where
        self.category_ids = category_ids or sorted(c.id for c in coco.categories)
        self.found: list[dict[str, Any]] = []
        self.sizes: dict[int, tuple[int, int]] = {}

    def add(self, scored: Scored) -> None:
        images = self.decoder.kept(scored.outputs[self.output], scored.outputs, scored.feed)
        for r, path in self.first_seen(len(images), scored.files):
            kept = images[r]
            boxes = kept.boxes
            image_id = self.ids[path.name]
            if scored.pre is not None:
                frame = scored.pre.frame(path)
                h, w = self.sizes[image_id] = frame.image
                boxes = np.clip(frame.back(boxes), 0, [w, h, w, h])
            for box, score, cls in zip(boxes, kept.scores, kept.classes):
                if not 0 <= cls < len(self.category_ids):
                    raise StageError(f"{self.where}: the model gave class {int(cls)}; the labels have "
                                     f"{len(self.category_ids)} categories: give labels.boxes.category_ids (the "
                                     f"labels' category id of each model class)")
                self.found.append({"image_id": image_id, "category_id": self.category_ids[cls], "score": float(score),
                                   "bbox": [float(box[0]), float(box[1]), float(box[2] - box[0]),
                                            float(box[3] - box[1])]})

    def result(self) -> Labelled | None:
        seen = sorted(self.ids[name] for name in self.seen)
        if not seen:
            return None
        values = coco_map(self.coco, self.found, seen, self.sizes)
        return Labelled(samples=len(seen), values=values, main="map")


def coco_map(coco: CocoFile, found: list[dict[str, Any]], image_ids: list[int],
             sizes: dict[int, tuple[int, int]] | None = None) -> dict[str, float]:
    """pycocotools' bbox evaluation of `found` on `image_ids`: map (IoU 0.5:0.95) and map50, every area, 100
    detections per image. An image with no labelled boxes counts its detections as false positives."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    sizes = {i.id: (i.height, i.width) for i in coco.images} | (sizes or {})
    dataset = {
        "images": [{"id": i.id, "file_name": i.file_name, "height": sizes[i.id][0], "width": sizes[i.id][1]}
                   for i in coco.images],
        "annotations": [{"id": a.id if a.id is not None else n + 1, "image_id": a.image_id,
                         "category_id": a.category_id, "bbox": a.bbox, "iscrowd": a.iscrowd,
                         "area": a.area if a.area is not None else a.bbox[2] * a.bbox[3]}
                        for n, a in enumerate(coco.annotations)],
        "categories": [{"id": c.id, "name": c.name} for c in coco.categories]}
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        gt = COCO()
        gt.dataset = dataset
        gt.createIndex()
        if not found:
            return {"map": 0.0, "map50": 0.0}
        dt = gt.loadRes([dict(f) for f in found])
        ev = COCOeval(gt, dt, "bbox")
        ev.params.imgIds = image_ids
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    stats = ev.stats
    # -1: no labelled box of any category among these images; nothing found there is all the detector can do
    return {"map": max(0.0, float(stats[0])), "map50": max(0.0, float(stats[1]))}
