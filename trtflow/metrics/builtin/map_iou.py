"""A probability or segmentation map thresholded into regions, or a segmentation's argmax classes: the IoU of the
candidate's regions with the reference's (iou, iou_min, iou_class_min)."""
from __future__ import annotations

from typing import Annotated, ClassVar

import numpy as np
from pydantic import Field, model_validator

from trtflow.errors import StageError
from trtflow.metrics.contract import BuiltInMetric, Gives, Sample, per_precision


class MapIoU:
    """A probability or segmentation map thresholded into regions: IoU of the candidate's regions with the
    reference's, pooled over every sample (`iou`) and for the worst sample (`iou_min`). Two empty maps agree.
    `channel`: only that index along `axis` is the map. `classes`: each element's class is the argmax along
    `axis` (segmentation scores), and each listed class's region is compared: pooled over the classes and samples
    (`iou`), the worst sample (`iou_min`), the worst class (`iou_class_min`)."""

    def __init__(self, threshold: float = 0.5, channel: int | None = None, classes: list[int] | tuple[int, ...] = (),
                 axis: int = 1, what: str = "map_iou") -> None:
        self.threshold, self.channel, self.classes, self.axis, self.what = threshold, channel, list(classes), axis, what
        self.inter = self.union = 0
        self.class_inter = np.zeros(len(self.classes), np.int64)
        self.class_union = np.zeros(len(self.classes), np.int64)
        self.worst = 1.0
        self.samples = 0

    def _regions(self, x: np.ndarray) -> np.ndarray:
        """(batch, regions, elements) booleans: one region, or one per selected class."""
        x = np.nan_to_num(x.astype(np.float64), nan=-np.inf)
        if self.channel is None and not self.classes:
            return (x > self.threshold).reshape(x.shape[0], 1, -1)
        if not -x.ndim <= self.axis < x.ndim or self.axis % x.ndim == 0:
            raise StageError(f"{self.what}.axis: {self.axis} is not a non-batch axis of an output of shape "
                             f"{list(x.shape)}")
        count = x.shape[self.axis]
        wanted = [self.channel] if self.channel is not None else self.classes
        beyond = [c for c in wanted if c >= count]
        if beyond:
            raise StageError(f"{self.what}.{'channel' if self.channel is not None else 'classes'}: "
                             f"{', '.join(map(str, beyond))} beyond the {count} along axis {self.axis} of an output "
                             f"of shape {list(x.shape)}")
        if self.channel is not None:
            return (np.take(x, self.channel, axis=self.axis) > self.threshold).reshape(x.shape[0], 1, -1)
        label = x.argmax(self.axis).reshape(x.shape[0], -1)
        return np.stack([label == c for c in self.classes], 1)

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        r, g = self._regions(ref), self._regions(got)
        inter, union = (r & g).sum(2), (r | g).sum(2)  # (batch, regions)
        self.inter += int(inter.sum())
        self.union += int(union.sum())
        if self.classes:
            self.class_inter += inter.sum(0)
            self.class_union += union.sum(0)
        i, u = inter.sum(1), union.sum(1)
        per = np.where(u > 0, i / np.maximum(u, 1), 1.0)
        self.worst = min(self.worst, float(per.min()))
        self.samples += r.shape[0]

    def result(self) -> dict[str, float]:
        if not self.samples:
            return {}
        out = {"iou": self.inter / self.union if self.union else 1.0, "iou_min": self.worst}
        if self.classes:
            per = np.where(self.class_union > 0, self.class_inter / np.maximum(self.class_union, 1), 1.0)
            out["iou_class_min"] = float(per.min())
        return out


class MapMetric(BuiltInMetric):
    """A map thresholded into regions (the whole output, or one `channel` of it), or a segmentation's class
    scores whose argmax along `axis` marks each selected class's region (`classes`)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "iou": Gives(True, bounds=per_precision(0.98, 0.95, 0.9), example="map_iou: {threshold: 0.3}"),
        "iou_min": Gives(True, weighed=False, example="map_iou: {threshold: 0.3}"),
        "iou_class_min": Gives(True, weighed=False, example="map_iou: {classes: [1, 2]}")}
    threshold: float = Field(0.5, description="a map value above this marks a region (not with classes)")
    channel: int | None = Field(None, ge=0, description="only this index along axis: one channel's map (e.g. the "
                                                         "face channel of a background/face softmax)")
    classes: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, max_length=1000,
        description="segmentation logits: each sample's class is the argmax along axis; the IoU of each of these "
                    "classes' regions, pooled (iou), for the worst sample (iou_min) and the worst class "
                    "(iou_class_min)")
    axis: int = Field(1, description="the channel or class axis (with channel or classes)")

    @model_validator(mode="after")
    def _one_selection(self) -> "MapMetric":
        if self.channel is not None and self.classes:
            raise ValueError("give channel (one channel's map, thresholded) or classes (argmax regions), not both")
        if self.classes and "threshold" in self.model_fields_set:
            raise ValueError("with classes each region is where its class is the argmax: threshold does not apply")
        return self

    def gives(self) -> dict[str, Gives]:
        return {n: g for n, g in self.GIVES.items() if n != "iou_class_min" or self.classes}

    def measure(self, where: str) -> MapIoU:
        return MapIoU(self.threshold, self.channel, self.classes, self.axis, where)


METRIC = MapMetric
