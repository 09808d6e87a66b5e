"""Loading and saving ONNX models, external data (models over 2 GB) included."""
from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx.external_data_helper import load_external_data_for_model

from trtflow import external_data, phases
from trtflow.errors import StageError
from trtflow.text import first_line

EXTERNAL_THRESHOLD = int(1.8 * 2**30)  # leave headroom below protobuf's 2 GB


def has_external_data(model: onnx.ModelProto) -> bool:
    from onnx.external_data_helper import _get_all_tensors
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in _get_all_tensors(model))


@phases.timed("ONNX files: load and save")
def load(path: Path, with_data: bool = True) -> onnx.ModelProto:
    """The model at `path`, its external data with it (`with_data`) once every location is checked (SpecError)."""
    path = Path(path)
    if not path.is_file():
        raise StageError(f"model file not found: {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
        if with_data:
            external_data.files(path, model)  # every location checked before a byte of it is read
            load_external_data_for_model(model, str(path.parent))
        return model
    except (DecodeError, ValueError, RuntimeError, onnx.onnx_cpp2py_export.checker.ValidationError) as exc:
        raise StageError(f"{path} is not a valid ONNX model (truncated or corrupt): "
                         f"{first_line(exc)}") from None
    except FileNotFoundError as exc:
        raise StageError(f"{path}: external data file missing: {exc.filename or exc}") from None
    except OSError as exc:
        raise StageError(f"cannot read {path}: {exc}") from None


@phases.timed("ONNX files: load and save")
def save(model: onnx.ModelProto, path: Path, external: bool | None = None) -> list[Path]:
    """Save; external data when asked, or when the model would not fit in one protobuf. Returns files written."""
    path = Path(path)
    if external is None:
        external = model.ByteSize() > EXTERNAL_THRESHOLD
    if external:
        # onnx rewrites the proto in place to point at the data file: work on a copy, keep the caller's intact
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
        _as_raw_data(model)
        data_name = path.name + ".data"
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024, convert_attribute=True)
        return [path, path.with_name(data_name)]
    onnx.save_model(model, str(path))
    return [path]


def _as_raw_data(model: onnx.ModelProto) -> None:
    """onnx moves only tensors stored as raw bytes to external data; exporters often write float_data etc."""
    from onnx import numpy_helper
    from onnx.external_data_helper import _get_all_tensors

    for t in _get_all_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL and not t.HasField("raw_data") and t.dims:
            array = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array(array, t.name))
