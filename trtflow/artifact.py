"""The contract every stage implements, with no Prefect and no TensorRT in sight.

A stage is a plain function ``run(params, inputs, out_dir) -> StageResult``: it reads only ``inputs`` (name ->
`Artifact`, or a list of them), writes only under ``out_dir`` and returns what it wrote.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Artifact:
    """One file (or directory) produced by a stage or given as the pipeline's source."""

    path: Path
    type: str  # "onnx", "preprocess", "engines", "ranges", "json", ...
    digest: str  # sha256 of the content (for a model with external data: of all its files)
    origin: str = ""  # the stage that produced it ("source" for the pipeline's model)


@dataclass
class StageResult:
    outputs: dict[str, Path]  # output name -> path under out_dir
    summary: str = ""  # Markdown shown as the stage's Prefect artifact
    metrics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
