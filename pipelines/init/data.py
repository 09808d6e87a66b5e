"""The sample data `--data` names (a directory or a glob): images, whose sizes propose the spatial dimensions of a
profile, or saved tensors (.npy / .npz), whose shapes do. Both read from their headers only: nothing is decoded or
loaded, and a file over the limits below is refused before the stages would decode it whole."""
from __future__ import annotations

import glob as globbing
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from trtflow import image_header
from trtflow.errors import SpecError
from trtflow.image_header import Refusal, read_header
from trtflow.text import first_line

IMAGES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
TENSORS = (".npy", ".npz")
MAX_PIXELS = image_header.MAX_PIXELS  # one image's pixels: the stages refuse more too
MAX_ELEMENTS = 2**28  # one saved array's elements (1 GiB of float32): the stages load each sample whole
_LEAVE_OUT = "give --data a glob that leaves it out"


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
    """(height, width) as the stages will decode the image (EXIF orientation applied), from its header; a PNG's
    chunks are read through to IEND for their CRCs (a truncated or damaged file), its pixels never inflated."""
    try:
        return read_header(path, whose="init", chunks=True).as_read
    except Refusal as exc:
        raise SpecError(f"--data: {path} {exc.why}", hint=f"{exc.fix}, or {_LEAVE_OUT}") from None


def _tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Each array's shape from its .npy header (an .npz: from each member's, read through the zip): no array is
    loaded, and one over MAX_ELEMENTS or shorter than its header says is refused."""
    try:
        if path.suffix.lower() == ".npy":
            with open(path, "rb") as f:
                return {"": _array_shape(f, path.stat().st_size, f"--data: {path}")}
        with zipfile.ZipFile(path) as npz:
            shapes = {}
            for member in npz.infolist():
                if not member.filename.endswith(".npy"):  # not an array: np.load gives its bytes
                    continue
                name = member.filename.removesuffix(".npy")
                with npz.open(member) as f:
                    shapes[name] = _array_shape(f, member.file_size, f"--data: {path}, array '{name}',")
            return shapes
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise SpecError(f"--data: {path} does not load as a NumPy array: {first_line(exc)[:200]}",
                        hint="save plain numeric arrays with numpy.save or numpy.savez") from None


def _array_shape(f: IO[bytes], size: int, where: str) -> tuple[int, ...]:
    """The shape an .npy header gives (`size`: the bytes of the whole .npy); refused, naming `where`, where it holds
    objects, is over MAX_ELEMENTS or is shorter than its header says."""
    import math

    import numpy as np

    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
    if dtype.hasobject:
        raise SpecError(f"{where} holds Python objects (pickled), not numbers",
                        hint="save plain numeric arrays with numpy.save or numpy.savez")
    elements = math.prod(shape)
    if elements > MAX_ELEMENTS:
        raise SpecError(f"{where} is {list(shape)}: {elements:,} elements, over init's limit of {MAX_ELEMENTS:,} "
                        f"(MAX_ELEMENTS)", hint="save smaller samples, one or a few per file")
    if f.tell() + elements * dtype.itemsize > size:
        raise SpecError(f"{where} is truncated: {size:,} bytes, less than its header's {list(shape)} {dtype} takes",
                        hint="save it again with numpy.save or numpy.savez")
    return tuple(int(d) for d in shape)
