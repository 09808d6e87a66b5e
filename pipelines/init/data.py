"""The sample data `--data` names (a directory or a glob): images, whose sizes propose the spatial dimensions of a
profile, or saved tensors (.npy / .npz), whose shapes do. Both read from their headers only: nothing is decoded or
loaded, and a file over the limits below is refused before the stages would decode it whole."""
from __future__ import annotations

import glob as globbing
import struct
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from trtflow.errors import SpecError
from trtflow.text import first_line

if TYPE_CHECKING:
    from PIL import Image

IMAGES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
TENSORS = (".npy", ".npz")
# one image's pixels: under Pillow's decompression-bomb refusal (2 x Image.MAX_IMAGE_PIXELS, 178,956,970), which the
# parity stage's torchvision reference opens images through, and OpenCV's (2**30), which the stages decode with
MAX_PIXELS = 2**27
MAX_ELEMENTS = 2**28  # one saved array's elements (1 GiB of float32): the stages load each sample whole
IMAGE_FORMATS = ("PNG", "JPEG", "BMP", "WEBP", "TIFF")  # Pillow's names of the formats OpenCV decodes too
_TURNED = (5, 6, 7, 8)  # EXIF orientations a quarter turn away: OpenCV's IMREAD_COLOR, the stages' read, swaps H, W
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
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the limit below says it, once
            with Image.open(path, formats=IMAGE_FORMATS) as image:
                width, height = image.size
                turned = _orientation(image) in _TURNED
                damage = _png_damage(path) if image.format == "PNG" and width * height <= MAX_PIXELS else None
    except Image.DecompressionBombError:  # over twice Pillow's limit, so over MAX_PIXELS: Pillow gives no size
        raise SpecError(f"--data: {path} declares more than {2 * (Image.MAX_IMAGE_PIXELS or 0):,} pixels, over "
                        f"init's limit of {MAX_PIXELS:,} (MAX_PIXELS)", hint=f"resize it, or {_LEAVE_OUT}") from None
    except Image.UnidentifiedImageError:
        raise SpecError(f"--data: {path} is not an image ({', '.join(IMAGE_FORMATS)}) Pillow can read",
                        hint=f"remove it, or {_LEAVE_OUT}") from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for a broken file (OSError, SyntaxError...)
        raise _broken(path, first_line(exc)[:200]) from None
    if damage:
        raise _broken(path, damage)
    if width * height > MAX_PIXELS:
        raise SpecError(f"--data: {path} is {width}x{height} pixels ({width * height:,}), over init's limit of "
                        f"{MAX_PIXELS:,} (MAX_PIXELS)", hint=f"resize it, or {_LEAVE_OUT}")
    return (width, height) if turned else (height, width)


def _broken(path: Path, why: str) -> SpecError:
    return SpecError(f"--data: {path} is a broken image: {why}", hint=f"replace it, or {_LEAVE_OUT}")


def _png_damage(path: Path) -> str | None:
    """What is wrong with a PNG's chunks (truncated, a CRC that does not hold), None where they run whole to IEND.
    Read in blocks: Pillow's verify() holds each chunk whole, and one IDAT may be the whole file."""
    with open(path, "rb") as f:
        f.seek(8)  # the signature, which Pillow matched
        while True:
            head = f.read(8)
            if len(head) < 8:
                return "truncated (no IEND chunk)"
            length, kind = struct.unpack(">I4s", head)
            crc, left = zlib.crc32(kind), length
            while left:
                block = f.read(min(left, 1 << 20))
                if not block:
                    return f"truncated in its {kind.decode('latin-1')!r} chunk"
                crc, left = zlib.crc32(block, crc), left - len(block)
            stored = f.read(4)
            if len(stored) < 4:
                return f"truncated in its {kind.decode('latin-1')!r} chunk"
            if struct.unpack(">I", stored)[0] != crc:
                return f"damaged: its {kind.decode('latin-1')!r} chunk fails its CRC"
            if kind == b"IEND":
                return None


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation the header holds (1: none). Never Pillow's PNG getexif(): it decodes the whole image to
    look for an eXIf chunk after the pixels."""
    from PIL import Image

    raw = image.info.get("exif")
    if not raw:
        return 1
    exif = Image.Exif()
    try:
        exif.load(raw)
    except Exception:  # noqa: BLE001 - a damaged EXIF block: OpenCV ignores it too
        return 1
    value = exif.get(0x0112, 1)
    return value if isinstance(value, int) else 1


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
