"""A segmentation output against mask images (validate's `labels: {masks: ...}`): each labelled image's class
map (the argmax along the class axis, or a one-channel map above a threshold) taken back through the
preprocessing onto the mask, as drawn on the image as read, and pooled into one confusion matrix: mean IoU over
the classes present and pixel accuracy. Pixels the mask marks `ignore`, and those the preprocessing cropped
away, are not scored."""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from trtflow.errors import StageError
from trtflow.stages.compare.labels import Labelled, PerFile, Scored


def mask_files(paths: list[Path], images: list[str], where: str) -> dict[str, Path]:
    """Image file name -> its mask (the mask file with the image's name, any extension); every image needs one."""
    by_stem = {p.stem: p for p in paths}
    out = {name: by_stem[Path(name).stem] for name in images if Path(name).stem in by_stem}
    missing = [n for n in images if n not in out]
    if missing:
        raise StageError(f"{where}: {len(missing)} sample file(s) have no mask of their name "
                         f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): give one mask per image")
    return out


def read_mask(path: Path, where: str) -> np.ndarray:
    mask = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if mask is None:
        raise StageError(f"{where}: {path.name} is not an image OpenCV reads")
    if mask.ndim != 2:
        raise StageError(f"{where}: {path.name} has {mask.shape[2]} channels: a mask is one class index per pixel "
                         f"(a one-channel or palette PNG)")
    return mask.astype(np.int64)


class MaskTally(PerFile):
    """The confusion matrix of every labelled image's pixels (label x predicted class), each image once."""

    def __init__(self, output: str, masks: dict[str, Path], axis: int, threshold: float | None, ignore: int,
                 where: str) -> None:
        super().__init__(output, masks)
        self.axis, self.threshold, self.ignore, self.where = axis, threshold, ignore, where
        self.confusion: np.ndarray | None = None

    def _class_maps(self, x: np.ndarray) -> tuple[np.ndarray, int]:
        """[N, H, W] class per pixel, and how many classes there are."""
        axis = self.axis % x.ndim
        if self.threshold is not None:
            if x.ndim == 4 and x.shape[axis] != 1:
                raise StageError(f"{self.where}: threshold is for a one-channel map; the output has {x.shape[axis]} "
                                 f"channels along axis {self.axis}: leave threshold out (argmax)")
            maps = x if x.ndim == 3 else np.take(x, 0, axis=axis)
            return (np.nan_to_num(maps, nan=-np.inf) > self.threshold).astype(np.int64), 2
        if x.ndim != 4:
            raise StageError(f"{self.where}: the output's shape {list(x.shape)} is not [N, C, H, W] or [N, H, W, C]"
                             f" (give labels.masks.axis, or threshold for a one-channel map)")
        scores = np.nan_to_num(x.astype(np.float64), nan=-np.inf)
        return np.moveaxis(scores, axis, -1).argmax(-1), x.shape[axis]

    def add(self, scored: Scored) -> None:
        maps, classes = self._class_maps(scored.outputs[self.output])
        if self.confusion is None:
            self.confusion = np.zeros((classes, classes), np.int64)
        for r, path in self.first_seen(len(maps), scored.files):
            truth = read_mask(self.labels[path.name], self.where)
            predicted = maps[r]
            if scored.pre is not None:
                frame = scored.pre.frame(path)
                if frame.image != truth.shape:
                    raise StageError(f"{self.where}: {self.labels[path.name].name} is {truth.shape[0]}x"
                                     f"{truth.shape[1]}, its image {path.name} {frame.image[0]}x{frame.image[1]}")
                h, w = scored.size or (frame.height, frame.width)
                frame = frame.scaled(predicted.shape[0] / h, predicted.shape[1] / w)
                # each mask pixel takes the class of the map pixel it lands on; off the map: not scored
                predicted = cv2.warpAffine(predicted.astype(np.float32), frame.matrix(), truth.shape[::-1],
                                           flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
                                           borderMode=cv2.BORDER_CONSTANT, borderValue=-1).astype(np.int64)
            elif predicted.shape != truth.shape:
                raise StageError(f"{self.where}: {self.labels[path.name].name} is {truth.shape[0]}x{truth.shape[1]},"
                                 f" the output's map {predicted.shape[0]}x{predicted.shape[1]}")
            scored_px = (truth != self.ignore) & (predicted >= 0)
            wrong = scored_px & (truth >= classes)
            if wrong.any():
                raise StageError(f"{self.where}: {self.labels[path.name].name} holds class {int(truth[wrong][0])}; "
                                 f"the output has {classes} classes (mark unscored pixels {self.ignore}, "
                                 f"labels.masks.ignore)")
            t, p = truth[scored_px], predicted[scored_px]
            self.confusion += np.bincount(t * classes + p, minlength=classes * classes).reshape(classes, classes)

    def result(self) -> Labelled | None:
        if not self.seen or self.confusion is None:
            return None
        c = self.confusion.astype(np.float64)
        hits = np.diag(c)
        union = c.sum(0) + c.sum(1) - hits
        present = union > 0
        miou = float((hits[present] / union[present]).mean()) if present.any() else 1.0
        accuracy = float(hits.sum() / c.sum()) if c.sum() else 1.0
        return Labelled(samples=len(self.seen), values={"miou": miou, "pixel_accuracy": accuracy}, main="miou")
