"""Triton's own model configuration schema: `model_config_pb2`, as `tritonclient` ships it.

`tritonclient.grpc`'s package import needs grpcio (its `[grpc]` extra, which pins protobuf < 7 while everything
else here runs on protobuf 7): the generated module itself needs only protobuf, so it is loaded from its file,
without the package around it.
"""
from __future__ import annotations

import importlib.util
import sys
from functools import cache
from types import ModuleType
from typing import Any

from trtflow.errors import StageError

MODULE = "tritonclient.grpc.model_config_pb2"
# Triton's data types that trtflow writes as numpy arrays (the preprocessing's tensor, warmup files, the card's
# request example): Triton's name -> numpy's
NUMPY = {"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_UINT8": "uint8", "TYPE_INT8": "int8",
         "TYPE_INT32": "int32", "TYPE_INT64": "int64", "TYPE_BOOL": "bool"}


@cache
def model_config_pb2() -> ModuleType:
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    found = importlib.util.find_spec("tritonclient")
    locations = list(found.submodule_search_locations or []) if found else []
    for base in locations:
        spec = importlib.util.spec_from_file_location(MODULE, f"{base}/grpc/model_config_pb2.py")
        if spec is None or spec.loader is None:
            continue
        try:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except (OSError, ImportError):
            continue
        sys.modules[MODULE] = module
        return module
    raise StageError("Triton's model configuration schema was not found: install tritonclient (a dependency of "
                     "trtflow: pip install -e . again)")


def parse(text: str) -> Any:
    """A config.pbtxt as Triton reads it (`ModelConfig` in protobuf text format); a ValueError names what Triton
    would not accept."""
    from google.protobuf import text_format

    try:
        return text_format.Parse(text, model_config_pb2().ModelConfig())
    except text_format.ParseError as exc:
        raise ValueError(f"not a Triton model configuration: {exc}") from None


def to_text(config: Any) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(config)
