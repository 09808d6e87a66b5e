"""An ONNX model's external data: the files its tensors keep their data in, each checked before a byte of it is
read. A location is a string in the model, which is anyone's file: `../../dev/zero` or `/dev/zero` would be read for
ever, a FIFO would block the read, a symlink could lead anywhere. Only a regular file inside the model's directory,
named by a relative location, is taken (ONNX itself takes no other); anything else is one SpecError (exit 2) naming
the model, the tensor and the location. `trtflow init`, the source model's digest (`plan`, `run`) and every stage
loading a model with its data (`stages/onnx/model_io.py`) check through here."""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from trtflow.errors import SpecError
from trtflow.files import sha256

if TYPE_CHECKING:
    import onnx

BESIDE = "save the model with its external data as files beside it, named by a relative location"


def locations(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(tensor name, location) for every tensor of `model` that keeps its data in an external file."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors

    return [(tensor.name, entry.value) for tensor in _get_all_tensors(model)
            if tensor.data_location == onnx.TensorProto.EXTERNAL
            for entry in tensor.external_data if entry.key == "location"]


def files(model_file: Path, model: onnx.ModelProto) -> list[Path]:
    """The external-data files `model` (read from `model_file` without its data) refers to, each checked."""
    return sorted({checked(model_file, tensor, location) for tensor, location in locations(model)})


def combined(own: str, extra: list[tuple[str, str]]) -> str:
    """An ONNX model's digest as the store records it: its file's sha256 (`own`), or, with external data, that
    combined with each external file's (name, sha256)."""
    if not extra:
        return own
    h = hashlib.sha256(own.encode())
    for name, digest in extra:
        h.update(f"{name}\0{digest}\n".encode())
    return h.hexdigest()


def files_of(model_file: Path) -> list[Path]:
    """The external-data files the ONNX model at `model_file` refers to (none for a self-contained model, or one
    ONNX cannot read: judging it is not this function's job), each checked before a byte of it is read."""
    import onnx

    try:
        model = onnx.load(str(model_file), load_external_data=False)
    except Exception:  # noqa: BLE001 - the stage that reads the model says what is wrong with it
        return []
    return files(model_file, model)


def model_digest(model_file: Path) -> str:
    """The digest the store gives an ONNX model file (flows/digest.py), computed here without its cache."""
    return combined(sha256(model_file), [(f.name, sha256(f)) for f in files_of(model_file)])


def checked(model_file: Path, tensor: str, location: str) -> Path:
    """`model_file`'s directory / `location`, when that is a regular file inside the directory (nothing opened:
    a FIFO or a device is refused by its stat); else SpecError."""
    base = Path(model_file).parent.resolve()
    where = f"tensor '{_shown(tensor)}' keeps its data in '{_shown(location)}'"
    if not location or "\0" in location:
        raise SpecError(f"{where}, which names no file", file=str(model_file), hint=BESIDE)
    lexical = Path(os.path.normpath(base / location))
    if not lexical.is_relative_to(base):
        raise SpecError(f"{where}, outside the model's directory {base}", file=str(model_file), hint=BESIDE)
    if os.path.isabs(location):
        raise SpecError(f"{where}, an absolute path (ONNX reads external data only by a location relative to the "
                        f"model)", file=str(model_file), hint=BESIDE)
    path = base / location
    try:
        leads_out = not path.resolve().is_relative_to(base)
    except (OSError, RuntimeError):  # a symlink loop: refused below as a symlink
        leads_out = False
    if leads_out:
        raise SpecError(f"{where}, which leads outside the model's directory {base} through a symlink",
                        file=str(model_file), hint="put the file itself beside the model, not a link to it")
    try:
        mode = path.lstat().st_mode
    except OSError:
        raise SpecError(f"{where}, which does not exist", file=str(model_file),
                        hint="copy the model together with its external data files") from None
    if stat.S_ISLNK(mode):
        raise SpecError(f"{where}, which is a symlink (ONNX reads no external data through a link)",
                        file=str(model_file), hint="put the file itself beside the model, not a link to it")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a device or a socket"
        raise SpecError(f"{where}, which is not a regular file but {kind}", file=str(model_file), hint=BESIDE)
    return Path(model_file).parent / location


def _shown(text: str) -> str:
    """A name from the model, on one line of an error (its control characters escaped)."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
