"""The sample data `--data` names (a directory or a glob): images, whose sizes propose the spatial dimensions of a
profile, or saved tensors (.npy / .npz), whose shapes do."""
from __future__ import annotations

import glob as globbing
from dataclasses import dataclass
from pathlib import Path

from trtflow.errors import SpecError

IMAGES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
TENSORS = (".npy", ".npz")


@dataclass(frozen=True)
class DataFacts:
    pattern: Path  # the glob, absolute
    kind: str  # images | tensors
    files: tuple[Path, ...]
    sizes: tuple[tuple[int, int], ...] = ()  # images: (height, width) each
    shapes: tuple[dict[str, tuple[int, ...]], ...] = ()  # tensors: per file, the array of each input (npy: '')

    @property
    def count(self) -> int:
        return len(self.files)


def _wild(part: str) -> bool:
    return any(c in part for c in "*?[")


def _pattern(spec: str, cwd: Path) -> Path:
    """--data as an absolute glob: a directory becomes the glob of the images (or tensors) in it."""
    path = Path(spec).expanduser()
    path = path if path.is_absolute() else cwd / path
    if _wild(spec):
        return path
    if not path.is_dir():
        raise SpecError(f"--data {spec}: no such directory", hint="give a directory or a glob such as 'data/*.png'")
    suffixes = sorted({p.suffix for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGES + TENSORS})
    if not suffixes:
        raise SpecError(f"--data {spec}: no images ({', '.join(IMAGES)}) or tensors (.npy, .npz) in it",
                        hint="give a glob such as 'data/*.png'")
    if len(suffixes) == 1:
        return path / f"*{suffixes[0]}"
    # several kinds of image: one class of characters per position where the suffixes have one length
    # (.png and .jpg -> .[jp][np]g), checked below to match exactly those files
    if len({len(s) for s in suffixes}) == 1:
        return path / ("*." + "".join(f"[{''.join(sorted(set(cs)))}]" if len(set(cs)) > 1 else cs[0]
                                      for cs in zip(*(s[1:] for s in suffixes))))
    raise SpecError(f"--data {spec}: files of several kinds ({', '.join(suffixes)})",
                    hint=f"give a glob matching one kind, e.g. '{spec.rstrip('/')}/*{suffixes[0]}'")


def read_data(spec: str, cwd: Path) -> DataFacts:
    pattern = _pattern(spec, cwd)
    files = tuple(sorted(Path(p) for p in globbing.glob(str(pattern)) if Path(p).is_file()))
    if not files:
        raise SpecError(f"--data {spec}: matches no file", hint="give a directory or a glob such as 'data/*.png'")
    kinds = {"images" if f.suffix.lower() in IMAGES else "tensors" if f.suffix.lower() in TENSORS else f.suffix
             for f in files}
    if len(kinds) != 1 or not kinds <= {"images", "tensors"}:
        others = sorted(k for k in kinds if k not in ("images", "tensors"))
        raise SpecError(f"--data {spec}: matches " + (f"files init cannot read as samples ({', '.join(others)})"
                                                      if others else "both images and tensors"),
                        hint="give a glob matching only images (.png, .jpg, ...) or only .npy/.npz tensors")
    kind = kinds.pop()
    if kind == "images":
        return DataFacts(pattern, kind, files, sizes=tuple(_image_size(f) for f in files))
    return DataFacts(pattern, kind, files, shapes=tuple(_tensor_shapes(f) for f in files))


def _image_size(path: Path) -> tuple[int, int]:
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise SpecError(f"--data: {path} does not decode as an image (OpenCV)")
    return int(image.shape[0]), int(image.shape[1])


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    import numpy as np

    try:
        if path.suffix.lower() == ".npy":
            return {"": tuple(np.load(path, mmap_mode="r", allow_pickle=False).shape)}
        with np.load(path, allow_pickle=False) as npz:
            return {name: tuple(npz[name].shape) for name in npz.files}
    except (OSError, ValueError) as exc:
        raise SpecError(f"--data: {path} does not load as a NumPy array: {exc}") from None
