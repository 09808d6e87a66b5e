"""An image's size from its header, before anything decodes it: `trtflow init --data` proposes a profile from it, and
validate refuses a mask over MAX_PIXELS (or of another size than its image) before OpenCV allocates its pixels.
Pillow reads the header (its `open` is lazy); a PNG's chunks can be walked through to IEND for their CRCs
(`png_damage`), never inflated. (stages/image/preprocess.py, copied into the Triton model with OpenCV alone, cannot
import it.)"""
from __future__ import annotations

import struct
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow.files import open_regular
from trtflow.text import first_line

if TYPE_CHECKING:
    from PIL import Image

# one image's pixels: under Pillow's decompression-bomb refusal (2 x Image.MAX_IMAGE_PIXELS, 178,956,970), which the
# parity stage's torchvision reference opens images through, and OpenCV's (2**30), which the stages decode with
MAX_PIXELS = 2**27
FORMATS = ("PNG", "JPEG", "BMP", "WEBP", "TIFF")  # Pillow's names of the formats OpenCV decodes too
_TURNED = (5, 6, 7, 8)  # EXIF orientations a quarter turn away: OpenCV's IMREAD_COLOR/GRAYSCALE swap H, W


class Refusal(ValueError):
    """An image refused from its header: `why` follows the file's name in a line ("is a broken image: ..."), `fix`
    says what to do ("resize it")."""

    def __init__(self, why: str, fix: str) -> None:
        super().__init__(why)
        self.why, self.fix = why, fix


class NotAnImage(Refusal):
    """No header Pillow reads among FORMATS: OpenCV may still decode it (PPM, EXR), unbounded."""


class TooLarge(Refusal):
    """More pixels than MAX_PIXELS: refused whatever decodes it."""


@dataclass(frozen=True)
class Header:
    width: int
    height: int
    format: str  # Pillow's name, one of FORMATS
    turned: bool  # its EXIF orientation is a quarter turn away

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def as_read(self) -> tuple[int, int]:
        """(height, width) as the stages decode it (OpenCV's IMREAD_COLOR or IMREAD_GRAYSCALE: EXIF applied)."""
        return (self.width, self.height) if self.turned else (self.height, self.width)

    @property
    def stored(self) -> tuple[int, int]:
        """(height, width) as stored (OpenCV's IMREAD_UNCHANGED, which ignores the EXIF orientation: masks)."""
        return self.height, self.width


def read_header(path: Path, whose: str = "trtflow", chunks: bool = False) -> Header:
    """`path`'s header, refused (`Refusal`) where it is no image of FORMATS, broken, or over MAX_PIXELS (`whose`
    limit it is, for the line); with `chunks`, a PNG's chunks walked to IEND too (`png_damage`), for a reader that
    decodes nothing to find a truncated or damaged file."""
    from PIL import Image

    over = f"over {whose}'s limit of {MAX_PIXELS:,} (MAX_PIXELS)"
    try:
        header = _header(path)
        walked = chunks and header.format == "PNG" and header.pixels <= MAX_PIXELS
        damage = png_damage(path) if walked else None
    except Image.DecompressionBombError:  # over twice Pillow's limit, so over MAX_PIXELS: Pillow gives no size
        bomb = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        raise TooLarge(f"declares more than {bomb:,} pixels, {over}", "resize it") from None
    except Image.UnidentifiedImageError:
        raise NotAnImage(f"is not an image ({', '.join(FORMATS)}) Pillow can read", "remove it") from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for a broken file (OSError, SyntaxError...)
        raise Refusal(f"is a broken image: {first_line(exc)[:200]}", "replace it") from None
    if damage:
        raise Refusal(f"is a broken image: {damage}", "replace it")
    if header.pixels > MAX_PIXELS:
        raise TooLarge(f"is {header.width}x{header.height} pixels ({header.pixels:,}), {over}", "resize it")
    return header


def _header(path: Path) -> Header:
    from PIL import Image

    fh, _ = open_regular(path)
    with fh, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # read_header's MAX_PIXELS says it, once
        with Image.open(fh, formats=FORMATS) as image:
            width, height = image.size
            return Header(width, height, image.format or "", _orientation(image) in _TURNED)


def png_damage(path: Path) -> str | None:
    """What is wrong with a PNG's chunks (truncated, a CRC that does not hold), None where they run whole to IEND.
    Read in blocks: Pillow's verify() holds each chunk whole, and one IDAT may be the whole file."""
    fh, _ = open_regular(path)
    with fh:
        fh.seek(8)  # the signature, which Pillow matched
        while True:
            head = fh.read(8)
            if len(head) < 8:
                return "truncated (no IEND chunk)"
            length, kind = struct.unpack(">I4s", head)
            crc, left = zlib.crc32(kind), length
            while left:
                block = fh.read(min(left, 1 << 20))
                if not block:
                    return f"truncated in its {kind.decode('latin-1')!r} chunk"
                crc, left = zlib.crc32(block, crc), left - len(block)
            stored = fh.read(4)
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
