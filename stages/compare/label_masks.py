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
from trtflow.image_header import Refusal, read_header
from trtflow.stages.compare.labels import PerFile, Scored
from trtflow.stages.compare.records import Labelled
from trtflow.text import first_line


def mask_files(paths: list[Path], images: list[str], where: str) -> dict[str, Path]:
    """Image file name -> its mask (the mask file with the image's name, any extension); every image needs one, each
    an image whose header is read and within MAX_PIXELS."""
    by_stem = {p.stem: p for p in paths}
    out = {name: by_stem[Path(name).stem] for name in images if Path(name).stem in by_stem}
    missing = [n for n in images if n not in out]
    if missing:
        raise StageError(f"{where}: {len(missing)} sample file(s) have no mask of their name "
                         f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): give one mask per image")
    for mask in out.values():
        mask_size(mask, where)
    return out


def mask_size(path: Path, where: str) -> tuple[int, int]:
    """(height, width) of a mask as stored, from its header: refused before any decode where it has none Pillow
    reads (nothing would bound its decode), is broken or is over MAX_PIXELS."""
    try:
        return read_header(path).stored
    except Refusal as exc:
        raise StageError(f"{where}: mask {path.name} {exc.why} ({exc.fix}: a mask is a one-channel PNG of class "
                         f"ids)") from None


def read_mask(path: Path, where: str) -> np.ndarray:
    """A mask's class ids per pixel as OpenCV decodes them (uint8 or uint16: never widened whole); its header is
    read first (`mask_size`), and TIFF's floats refused."""
    mask_size(path, where)
    try:
        mask = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    except cv2.error as exc:
        raise StageError(f"{where}: mask {path.name}: OpenCV refuses it: "
                         f"{getattr(exc, 'err', '') or first_line(exc)[:200]}") from None
    if mask is None:
        raise StageError(f"{where}: {path.name} is not an image OpenCV reads")
    if mask.ndim != 2:
        raise StageError(f"{where}: {path.name} has {mask.shape[2]} channels: a mask is one class index per pixel "
                         f"(a one-channel or palette PNG)")
    if mask.dtype.kind not in "ui":  # a float TIFF: NaN has no class, and truncating guesses one
        raise StageError(f"{where}: {path.name} holds {mask.dtype} values: a mask is integer class ids (an 8- or "
                         f"16-bit PNG)")
    return mask


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
            mask = self.labels[path.name]
            predicted = self._on_mask(maps[r], mask, path, scored)  # the mask's size checked before it is decoded
            self._count(read_mask(mask, self.where), predicted, classes, mask)

    def _on_mask(self, predicted: np.ndarray, mask: Path, image: Path, scored: Scored) -> np.ndarray:
        """The class map on the mask's pixels (-1 where the preprocessing cropped the image away); a mask whose
        header gives another size than its image's (or the output map's) refused."""
        size = mask_size(mask, self.where)
        if scored.pre is None:
            if predicted.shape != size:
                raise StageError(f"{self.where}: {mask.name} is {size[0]}x{size[1]}, the output's map "
                                 f"{predicted.shape[0]}x{predicted.shape[1]}")
            return predicted
        frame = scored.pre.frame(image)
        if frame.image != size:
            raise StageError(f"{self.where}: {mask.name} is {size[0]}x{size[1]}, its image {image.name} "
                             f"{frame.image[0]}x{frame.image[1]}")
        h, w = scored.size or (frame.height, frame.width)
        frame = frame.scaled(predicted.shape[0] / h, predicted.shape[1] / w)
        # each mask pixel takes the class of the map pixel it lands on; off the map: not scored
        return cv2.warpAffine(predicted.astype(np.float32), frame.matrix(), size[::-1],
                              flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
                              borderMode=cv2.BORDER_CONSTANT, borderValue=-1).astype(np.int32)

    def _count(self, truth: np.ndarray, predicted: np.ndarray, classes: int, mask: Path) -> None:
        """The scored pixels (not `ignore`, on the map) into the confusion matrix; widened to int64 only there."""
        scored_px = (truth != self.ignore) & (predicted >= 0)
        not_a_class = scored_px & ((truth < 0) | (truth >= classes))
        if not_a_class.any():
            raise StageError(f"{self.where}: {mask.name} holds class {int(truth[not_a_class][0])}; the output has "
                             f"{classes} classes (mark unscored pixels {self.ignore}, labels.masks.ignore)")
        t, p = truth[scored_px].astype(np.int64), predicted[scored_px].astype(np.int64)
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
