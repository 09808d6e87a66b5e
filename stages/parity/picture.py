"""One picture of the worst sample: deploy tensor, training tensor, and where they differ."""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from trtflow import phases
from trtflow.stages.parity.diagnosis import align

HEIGHT = 256  # a small tensor is enlarged (nearest neighbour: each pixel a block) to about this height...
MAX_WIDTH = 2048  # ...but not past this width: a text line (48x320, three panels) was 4880 px, 371 KB of PNG in
# every run's Prefect artifact, shown scaled down to the page anyway


def _to_hwc(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    if x.ndim == 3 and x.shape[0] in (1, 3) and x.shape[-1] not in (1, 3):
        x = x.transpose(1, 2, 0)
    if x.ndim == 2:
        x = x[:, :, None]
    return x


@phases.timed("plots")
def worst_picture(deploy: np.ndarray, train: np.ndarray, out: Path, title: str) -> Path:
    d, t = align(deploy, train)
    d, t = _to_hwc(d), _to_hwc(t)
    lo, hi = float(t.min()), float(t.max())  # one scale for both, so a difference in level shows
    span = (hi - lo) or 1.0

    def show(x: np.ndarray) -> np.ndarray:
        img = np.clip((x - lo) / span * 255.0, 0, 255).astype(np.uint8)
        if img.shape[2] == 1:
            img = np.repeat(img, 3, axis=2)
        return cv2.cvtColor(img[:, :, :3], cv2.COLOR_RGB2BGR)  # tensors are RGB, OpenCV writes BGR

    diff = np.abs(d - t).mean(axis=2)
    heat = cv2.applyColorMap(np.clip(diff / (diff.max() or 1.0) * 255, 0, 255).astype(np.uint8), cv2.COLORMAP_JET)
    gap = np.full((d.shape[0], 8, 3), 255, np.uint8)
    row = np.concatenate([show(d), gap, show(t), gap, heat], axis=1)
    scale = max(1, min(HEIGHT // row.shape[0], MAX_WIDTH // row.shape[1]))
    if scale > 1:
        row = cv2.resize(row, None, fx=scale, fy=scale, interpolation=cv2.INTER_NEAREST)
    banner = np.full((28, row.shape[1], 3), 255, np.uint8)
    cv2.putText(banner, f"{title}  (max |diff| {diff.max():.3g})", (6, 19), cv2.FONT_HERSHEY_SIMPLEX, 0.5,
                (0, 0, 0), 1, cv2.LINE_AA)
    cv2.imwrite(str(out), np.concatenate([banner, row], axis=0))
    return out
