"""An output that is an image, judged as pixels (psnr, pixels_within, ssim)."""
from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, model_validator

from trtflow.metrics.contract import BuiltInMetric, Gives, Sample, per_precision


class ImagePixels:
    """An image output against the reference's, pixel by pixel after clipping both to `low..high`: PSNR over every
    pixel of every sample (capped at 100 dB: identical images), the share of values within `within` levels
    (a level: (high - low) / levels), and scikit-image's SSIM per sample (a 7x7 window, the channels averaged),
    their mean. A non-finite candidate value counts as the farthest from the reference."""

    def __init__(self, low: float, high: float, layout: str = "nchw", levels: int = 255, within: float = 1.0) -> None:
        self.low, self.high, self.layout = low, high, layout
        self.step = (high - low) / levels
        self.within = within
        self.squared = self.values = self.close = 0.0
        self.ssims: list[float] = []

    def _hwc(self, x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        if x.ndim == 4 and self.layout == "nchw":
            x = np.moveaxis(x, 1, -1)
        elif x.ndim == 3:
            x = x[..., None]  # one channel, no channel axis
        return x

    def add(self, ref: np.ndarray, got: np.ndarray, sample: Sample | None = None) -> None:
        from skimage.metrics import structural_similarity

        r = np.clip(self._hwc(ref), self.low, self.high)
        g = self._hwc(got)
        g = np.clip(np.where(np.isfinite(g), g, np.where(r - self.low > self.high - r, self.low, self.high)),
                    self.low, self.high)
        diff = np.abs(r - g)
        self.squared += float((diff ** 2).sum())
        self.values += diff.size
        self.close += float((diff <= self.within * self.step * (1 + 1e-9)).sum())
        span = self.high - self.low
        for a, b in zip(r, g):
            side = min(a.shape[0], a.shape[1])
            window = min(7, side if side % 2 else side - 1)
            if window >= 3:
                self.ssims.append(float(structural_similarity(a, b, data_range=span, channel_axis=-1,
                                                              win_size=window)))

    def result(self) -> dict[str, float]:
        if not self.values:
            return {}
        mse = self.squared / self.values
        span = self.high - self.low
        out = {"psnr": 100.0 if mse == 0 else min(100.0, 10 * float(np.log10(span * span / mse))),
               "pixels_within": self.close / self.values}
        if self.ssims:
            out["ssim"] = float(np.mean(self.ssims))
        return out


class ImageMetric(BuiltInMetric):
    """An output that is an image (super-resolution, restoration, style transfer, depth maps shown as images):
    judged as pixels, after clipping to `range`. Gives psnr (dB over every sample's pixels), pixels_within (the
    share of pixel values within `within` levels of the reference's, a level being 1/`levels` of the range), and
    ssim (scikit-image's structural similarity, the mean over samples), all better higher."""
    # an image: 95% of pixel values within one level (8-bit) of FP32's; waifu2x's INT8 moved a third by two or more
    GIVES: ClassVar[dict[str, Gives]] = {
        "psnr": Gives(True, weighed=False, bounds=per_precision(50.0, 40.0, 35.0), example="image: {range: [0, 1]}"),
        "pixels_within": Gives(True, bounds=per_precision(0.999, 0.99, 0.95), example="image: {range: [0, 1]}"),
        "ssim": Gives(True, bounds=per_precision(0.999, 0.995, 0.98), example="image: {range: [0, 1]}")}
    range: tuple[float, float] = Field((0.0, 1.0), description="the values a pixel takes, [black, white] (0..1, "
                                                               "0..255, -1..1)", examples=[[0, 255]])
    layout: Literal["nchw", "nhwc"] = Field("nchw", description="where the channel axis is (a batch first)")
    levels: int = Field(255, ge=1, le=65535, description="how many steps the range is shown in (255: 8-bit)")
    within: float = Field(1.0, gt=0, description="pixels_within counts values at most this many levels from the "
                                                 "reference's")

    @model_validator(mode="after")
    def _a_range(self) -> "ImageMetric":
        if not self.range[1] > self.range[0]:
            raise ValueError(f"range: [{self.range[0]:g}, {self.range[1]:g}] is empty: give [black, white]")
        return self

    def measure(self, where: str) -> ImagePixels:
        return ImagePixels(self.range[0], self.range[1], self.layout, self.levels, self.within)


METRIC = ImageMetric
