"""onnxsim, imported without PyTorch (`trtflow.no_torch`: 5.3 s -> 1 s for every prepare stage)."""
from __future__ import annotations

from types import ModuleType

from trtflow.no_torch import torch_hidden


def onnxsim() -> ModuleType:
    with torch_hidden():
        import onnxsim as module
    return module
