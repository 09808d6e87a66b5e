"""Import a library without the PyTorch it loads for features trtflow does not use.

Measured with PyTorch installed (the README's `[torch]` extra): `import onnxsim` (0.8) took 5.3 s, 1 s with PyTorch
hidden; ONNX Runtime's quantization pre-processing imports `onnxruntime.tools`, which imports PyTorch when it is
installed, for 3.6 s of a 3.9 s call on a small model. Both import PyTorch optionally; what trtflow calls of them
does not use it. Every prepare and calibrate stage's process paid that."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def torch_hidden() -> Iterator[None]:
    """Within: `import torch` raises ImportError and `importlib.util.find_spec("torch")` is None, unless PyTorch
    is already imported (then nothing changes)."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if hide and "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]
