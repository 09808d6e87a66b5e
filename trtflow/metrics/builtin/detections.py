"""A detector judged by its boxes: each side's outputs decoded into boxes (a built-in decoder for the common YOLO
head layouts, or the user's function), suppressed by class-aware non-maximum suppression, and the candidate's
boxes matched one-to-one to the reference's (same class, IoU at least `match_iou`, greedily by the candidate's
score). Gives `det_recall` (share of the reference's boxes the candidate found), `det_precision` (share of the
candidate's boxes the reference has), `det_iou` (mean IoU of the matched pairs) and `det_f1_min` (the worst
image's 2 x matched / (reference + candidate boxes)); two images without boxes agree."""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Literal, NamedTuple

import numpy as np
from pydantic import Field, model_validator

from trtflow.errors import StageError
from trtflow.metrics.contract import BuiltInMetric, Gives, Sample, per_precision
from trtflow.strict import CUSTOM_KIND, Strict


class Boxes(NamedTuple):
    """One image's detections: boxes [K, 4] as x1, y1, x2, y2, scores [K], classes [K]."""
    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    @classmethod
    def empty(cls) -> "Boxes":
        return cls(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64))

    def take(self, keep: np.ndarray) -> "Boxes":
        return Boxes(self.boxes[keep], self.scores[keep], self.classes[keep])


LAYOUTS = {"yolov5": "[N, A, 5+C] (cx, cy, w, h, objectness, C class scores)",
           "yolov8": "[N, 4+C, A] or [N, A, 4+C] (cx, cy, w, h, C class scores)",
           "end2end": "[N, K, 6] after the model's NMS (x1, y1, x2, y2, score, class)"}


def layout_of(shape: tuple[int, ...], where: str) -> str:
    """The layout an output's shape shows: only a channels-first [N, 4+C, A] is unambiguous (YOLOv8/11); a
    channels-last [N, A, D] is YOLOv5's, a transposed YOLOv8's or an end-to-end model's alike."""
    if len(shape) == 3 and 5 <= shape[1] < shape[2]:
        return "yolov8"
    options = "; ".join(f"{k}: {v}" for k, v in LAYOUTS.items())
    raise StageError(f"{where}: the output's shape {list(shape)} does not say which head layout it is ({options}): "
                     f"give layout: {' | '.join(LAYOUTS)}, or decode: package.module:function for another head")


def _channels_last(x: np.ndarray, least: int, layout: str, where: str) -> np.ndarray:
    """One image's head as [A, D] with D at least `least`: yolov8's channels on the smaller of its two axes."""
    if x.ndim != 2 or (x.shape[1] if layout == "yolov5" else max(x.shape)) < least:
        raise StageError(f"{where}: layout {layout} is {LAYOUTS[layout]}, not an output of shape [N, "
                         f"{', '.join(map(str, x.shape))}]")
    return x.T if layout == "yolov8" and x.shape[0] < x.shape[1] else x


def _xyxy(cxcywh: np.ndarray) -> np.ndarray:
    half = cxcywh[:, 2:4] / 2
    return np.concatenate([cxcywh[:, :2] - half, cxcywh[:, :2] + half], 1)


def decode(x: np.ndarray, layout: str, where: str) -> Boxes:
    """One image's candidate boxes from a built-in layout: each anchor's best class, scored (objectness x class
    score for yolov5)."""
    x = x.astype(np.float64)
    if layout == "end2end":
        if x.ndim != 2 or x.shape[1] != 6:
            raise StageError(f"{where}: layout end2end is {LAYOUTS['end2end']}, not an output of shape [N, "
                             f"{', '.join(map(str, x.shape))}]")
        return Boxes(x[:, :4], x[:, 4], np.rint(np.nan_to_num(x[:, 5], nan=-1)).astype(np.int64))
    first = 5 if layout == "yolov5" else 4
    x = _channels_last(x, first + 1, layout, where)
    cls = np.nan_to_num(x[:, first:], nan=-np.inf)
    best = cls.argmax(1)
    score = cls[np.arange(len(x)), best]
    if layout == "yolov5":
        score = score * x[:, 4]
    return Boxes(_xyxy(x[:, :4]), score, best.astype(np.int64))


def suppress(found: Boxes, score_threshold: float, nms_iou: float | None, most: int) -> Boxes:
    """The boxes scoring above the threshold (finite ones), class-aware non-maximum suppression (OpenCV's; None:
    none, the model did it), at most `most` by score."""
    import cv2  # here: a pipeline's schema reads this module's declarations

    b, s = found.boxes, found.scores
    ok = np.isfinite(b).all(1) & np.isfinite(s) & (s > score_threshold) & (b[:, 2] >= b[:, 0]) & (b[:, 3] >= b[:, 1])
    found = found.take(ok)
    if nms_iou is None or not len(found.scores):
        order = np.argsort(-found.scores, kind="stable")[:most]
        return found.take(order)
    b = found.boxes - found.boxes.min()
    # one NMS over every class: each class's boxes moved apart so that no two classes overlap
    shifted = b + (found.classes - found.classes.min())[:, None] * (b.max() + 1)
    xywh = np.concatenate([shifted[:, :2], shifted[:, 2:] - shifted[:, :2]], 1)
    rank = (found.scores - found.scores.min() + 1).astype(np.float32)  # OpenCV takes no negative score (a logit)
    keep = np.asarray(cv2.dnn.NMSBoxes(xywh, rank, 0.0, nms_iou), np.int64).reshape(-1)
    keep = keep[np.argsort(-found.scores[keep], kind="stable")][:most]
    return found.take(keep)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of `a` [n, 4] with every box of `b` [m, 4] (x1, y1, x2, y2)."""
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(hi - lo, 0, None).prod(2)
    area_a = (a[:, 2:] - a[:, :2]).prod(1)
    area_b = (b[:, 2:] - b[:, :2]).prod(1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def match(ref: Boxes, got: Boxes, match_iou: float) -> list[float]:
    """The IoUs of the pairs matched: the candidate's boxes by descending score, each to the unmatched reference
    box of its class it overlaps most, at least `match_iou`."""
    iou = iou_matrix(got.boxes, ref.boxes)
    iou[got.classes[:, None] != ref.classes[None, :]] = -1.0
    taken = np.zeros(len(ref.scores), bool)
    found = []
    for i in np.argsort(-got.scores, kind="stable"):
        row = np.where(taken, -1.0, iou[i])
        if not row.size:
            break
        j = int(row.argmax())
        if row[j] >= match_iou:
            taken[j] = True
            found.append(float(row[j]))
    return found


Decoder = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], Any]


class BoxDecoder:
    """A detector's outputs into boxes per image: the built-in decoder of `layout` (auto: from the output's
    shape), or the user's function `decoder` (`decoder_ref` naming it) of every output by name and the feed; then
    those kept as `suppress` keeps them. `where`: the key path that declared it, for errors."""

    def __init__(self, layout: str = "auto", decoder: Decoder | None = None, decoder_ref: str = "",
                 where: str = "detections", score_threshold: float = 0.25, nms_iou: float = 0.45,
                 max_detections: int = 300) -> None:
        self.layout, self.decoder, self.decoder_ref, self.where = layout, decoder, decoder_ref, where
        self.score_threshold, self.max_detections = score_threshold, max_detections
        self.nms_iou = None if layout == "end2end" else nms_iou  # an end-to-end model did its own

    @classmethod
    def declared(cls, spec: BoxDecoding, where: str) -> BoxDecoder:
        """The decoder a pipeline's block declares (the detections metric, validate's labels.boxes)."""
        from trtflow.usercode import import_callable

        func = import_callable(spec.decode, f"{where}.decode", 2) if spec.decode else None
        return cls(spec.layout, func, spec.decode or "", where, spec.score_threshold, spec.nms_iou,
                   spec.max_detections)

    def _custom(self, outputs: dict[str, np.ndarray], feed: dict[str, np.ndarray]) -> list[Boxes]:
        try:
            made = self.decoder(outputs, feed)  # type: ignore[misc]
        except Exception as exc:  # the user's code: one line naming it
            raise StageError(f"{self.where}.decode '{self.decoder_ref}' raised {type(exc).__name__}: {exc}") from None
        out = []
        try:
            for boxes, scores, classes in made:
                b = np.asarray(boxes, np.float64).reshape(-1, 4)
                s, c = np.asarray(scores, np.float64).ravel(), np.asarray(classes).ravel()
                if np.asarray(boxes).size != 4 * len(s) or len(c) != len(s):
                    raise ValueError
                out.append(Boxes(b, s, np.rint(np.nan_to_num(c.astype(np.float64), nan=-1)).astype(np.int64)))
        except (TypeError, ValueError):
            raise StageError(f"{self.where}.decode '{self.decoder_ref}' must return one (boxes [K, 4] x1 y1 x2 y2, "
                             f"scores [K], classes [K]) per image of the batch, got {type(made).__name__}") from None
        return out

    def images(self, x: np.ndarray, outputs: dict[str, np.ndarray] | None,
               feed: dict[str, np.ndarray] | None) -> list[Boxes]:
        """Each image's boxes from the output `x` (the built-in layouts) or from every output and the feed."""
        if self.decoder is not None:
            if outputs is None or feed is None:
                raise StageError(f"{self.where}.decode needs every output of the model: call add() with the Sample")
            return self._custom(outputs, feed)
        layout = self.layout if self.layout != "auto" else layout_of(x.shape, self.where)
        return [decode(image, layout, self.where) for image in x]

    def kept(self, x: np.ndarray, outputs: dict[str, np.ndarray] | None,
             feed: dict[str, np.ndarray] | None) -> list[Boxes]:
        """Each image's boxes (`images`), suppressed."""
        return [suppress(b, self.score_threshold, self.nms_iou, self.max_detections)
                for b in self.images(x, outputs, feed)]


class Detections:
    """The metric (see the module): the boxes `decoder` keeps on each side, matched at `match_iou`."""

    def __init__(self, decoder: BoxDecoder, match_iou: float = 0.5) -> None:
        self.decoder, self.where, self.match_iou = decoder, decoder.where, match_iou
        self.ref_boxes = self.got_boxes = 0
        self.ious: list[float] = []
        self.worst = 1.0
        self.images = 0

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        feed = sample.feed if sample else None
        refs = self.decoder.kept(ref, sample.reference if sample else None, feed)
        gots = self.decoder.kept(got, sample.candidate if sample else None, feed)
        if len(refs) != len(gots):
            raise StageError(f"{self.where}: decoded {len(refs)} image(s) of the reference, {len(gots)} of the "
                             f"candidate")
        for r, g in zip(refs, gots):
            found = match(r, g, self.match_iou)
            self.ref_boxes += len(r.scores)
            self.got_boxes += len(g.scores)
            self.ious += found
            total = len(r.scores) + len(g.scores)
            self.worst = min(self.worst, 2 * len(found) / total if total else 1.0)
            self.images += 1

    def result(self) -> dict[str, float]:
        if not self.images:
            return {}
        matched = len(self.ious)
        return {"det_recall": matched / self.ref_boxes if self.ref_boxes else 1.0,
                "det_precision": matched / self.got_boxes if self.got_boxes else 1.0,
                "det_iou": float(np.mean(self.ious)) if matched else (0.0 if self.ref_boxes or self.got_boxes
                                                                      else 1.0),
                "det_f1_min": self.worst, "reference_boxes": self.ref_boxes}


class BoxDecoding(Strict):
    """How a detector's outputs become boxes: a built-in decoder for a head layout, or the user's function, and
    which of them are kept (score, class-aware NMS, how many)."""
    layout: Literal["auto", "yolov5", "yolov8", "end2end"] = Field(
        "auto", description="yolov5: [N, A, 5+C] (cx, cy, w, h, objectness, C class scores); yolov8: [N, 4+C, A] "
                            "or [N, A, 4+C] (cx, cy, w, h, C class scores); end2end: [N, K, 6] after the model's "
                            "own NMS (x1, y1, x2, y2, score, class); auto: yolov8 where the output is [N, 4+C, A] "
                            "(channels first), else give it")
    decode: str | None = Field(None, pattern=CUSTOM_KIND, description=(
        "instead of a layout, package.module:function(outputs, feed) -> one (boxes [K, 4] x1 y1 x2 y2, scores "
        "[K], classes [K]) per image of the batch; outputs: every output of the model by name (heads spread "
        "over several outputs), feed: the inputs"))
    score_threshold: float = Field(0.25, description="a box scoring at most this is no detection")
    nms_iou: float = Field(0.45, ge=0, le=1, description="non-maximum suppression: a box overlapping a better one "
                                                          "of its class by more than this IoU is dropped (not for "
                                                          "end2end)")
    max_detections: int = Field(300, ge=1, le=100_000, description="per image, the best-scoring boxes kept")

    @model_validator(mode="after")
    def _layout_or_decoder(self) -> "BoxDecoding":
        if self.decode is not None and self.layout != "auto":
            raise ValueError("give layout (a built-in decoder) or decode (your function), not both")
        return self


class DetectionsMetric(BoxDecoding, BuiltInMetric):
    """A detector's boxes, decoded from its outputs, suppressed (class-aware NMS) and matched one-to-one to the
    reference's (same class, IoU at least match_iou, greedily by the candidate's score)."""
    GIVES: ClassVar[dict[str, Gives]] = {
        "det_recall": Gives(True, bounds=per_precision(0.99, 0.95, 0.9), example="detections: {layout: yolov8}"),
        "det_precision": Gives(True, bounds=per_precision(0.99, 0.95, 0.9), example="detections: {layout: yolov8}"),
        "det_iou": Gives(True, bounds=per_precision(0.98, 0.95, 0.9), example="detections: {layout: yolov8}"),
        "det_f1_min": Gives(True, weighed=False, example="detections: {layout: yolov8}")}
    REPORTS: ClassVar[tuple[str, ...]] = ("reference_boxes",)
    match_iou: float = Field(0.5, gt=0, le=1, description="a candidate box matches a reference box of its class "
                                                          "overlapping it by at least this IoU")

    def code_refs(self) -> list[str]:
        return [self.decode] if self.decode else []

    def measure(self, where: str) -> Detections:
        return Detections(BoxDecoder.declared(self, where), self.match_iou)


METRIC = DetectionsMetric
