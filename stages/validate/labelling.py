"""Validate's `labels:` read and checked before anything runs (every sample file labelled, the output and the
charset there), and a fresh tally per side and candidate: classes, text, COCO boxes or masks."""
from __future__ import annotations

from pathlib import Path
from typing import Union

import onnx

from trtflow.artifact import Inputs
from trtflow.errors import StageError
from trtflow.metrics.builtin.detections import BoxDecoder
from trtflow.pipelines.params.validate import ValidateStage
from trtflow.stages.compare import labels as labels_mod
from trtflow.stages.compare.label_boxes import BoxTally, read_coco
from trtflow.stages.compare.label_masks import MaskTally, mask_files
from trtflow.text import did_you_mean

Tally = Union[labels_mod.Tally, labels_mod.TextTally, BoxTally, MaskTally]
WHERE = "validate: labels.file"
CHARSET_BYTES = 2**20  # one character a line: PaddleOCR's Chinese dictionary (6 623 characters) is 26 KB


class LabelSet:
    """The labels read and checked, and how to count against them."""

    def __init__(self, params: ValidateStage, inputs: Inputs, model: onnx.ModelProto, outputs: list[str]) -> None:
        spec = self.spec = params.labels
        if spec.output not in outputs:
            raise StageError(f"validate: labels.output: the model has no output '{spec.output}'"
                             f"{did_you_mean(spec.output, outputs) or '; outputs: ' + ', '.join(outputs)}")
        paths = [a.path for a in inputs.many("labels")]
        files = [a.path.name for a in inputs.many("images" if params.data.images else "tensors")]
        files = files[:params.data.samples]
        self.charset: list[str] = []
        if spec.masks is not None:
            self.masks = mask_files(paths, files, WHERE)
            return
        path = paths[0]
        if spec.boxes is not None:
            self.coco = read_coco(path, WHERE)
            found = {Path(i.file_name).name for i in self.coco.images}
            self.decoder = BoxDecoder.declared(spec.boxes, "validate: labels.boxes")
        elif spec.text is not None:
            self.texts = dict(labels_mod.read_pairs(path, WHERE))
            self.charset = self._charset(spec.text.charset, inputs, model)
            found = set(self.texts)
        else:
            self.classes = labels_mod.load(path, spec.classes, WHERE)
            found = set(self.classes)
        missing = [f for f in files if f not in found]
        if missing:
            raise StageError(f"{WHERE}: {len(missing)} sample file(s) have no label ({', '.join(missing[:3])}"
                             f"{', ...' if len(missing) > 3 else ''}): label every file data names")

    def _charset(self, charset: str, inputs: Inputs, model: onnx.ModelProto) -> list[str]:
        if charset.startswith("model:"):
            key = charset.removeprefix("model:")
            meta = {p.key: p.value for p in model.metadata_props}
            if key not in meta:
                raise StageError(f"validate: labels.text.charset: the model has no metadata entry '{key}'"
                                 + (f" (it has: {', '.join(sorted(meta)[:5])})" if meta else " (it has none)")
                                 + "; give the charset file instead")
            chars = meta[key].split("\n")
        else:
            path = inputs.many("charset")[0].path
            chars = labels_mod.read_text(path, CHARSET_BYTES, "validate: labels.text.charset").split("\n")
        chars = [c.rstrip("\r") for c in chars if c.rstrip("\r")]
        return chars + ([" "] if self.spec.text.space else [])

    def tally(self) -> Tally:
        spec = self.spec
        if spec.masks is not None:
            m = spec.masks
            return MaskTally(spec.output, self.masks, m.axis, m.threshold, m.ignore, "validate: labels.masks")
        if spec.boxes is not None:
            return BoxTally(spec.output, self.coco, self.decoder, spec.boxes.category_ids, "validate: labels.boxes")
        if spec.text is not None:
            return labels_mod.TextTally(spec.output, self.texts, self.charset, spec.text.axis)
        return labels_mod.Tally(spec.output, self.classes, spec.k)
