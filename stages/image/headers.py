"""The stages' images checked from their headers before OpenCV decodes them (trtflow/image_header.py, the reader
`init --data` and the masks use too): an image over MAX_PIXELS is refused in one line naming the file and the key
that listed it. Anything else the header reader says (no format Pillow reads, a header Pillow finds broken) is left
to OpenCV, which decodes formats and variants Pillow does not and says itself what it cannot read
(stages/image/preprocess.py, copied into Triton with OpenCV alone, cannot check headers itself)."""
from __future__ import annotations

from pathlib import Path

from trtflow.errors import StageError
from trtflow.image_header import Refusal, TooLarge, read_header


def check_images(paths: list[Path], where: str) -> None:
    """Raise StageError for the first image refused from its header; `where` is 'validate: data.images'."""
    for path in paths:
        try:
            read_header(path)
        except TooLarge as refused:
            raise StageError(f"{where}: {path.name} {refused.why}: {refused.fix}") from None
        except Refusal:
            continue
