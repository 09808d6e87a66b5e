"""What the build stage produced, as the stages after it see it: one candidate per engine, each knowing the
model variant and the profiles it was built from (or, without a build stage, one per model variant)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from trtflow.artifact import Artifact
from trtflow.errors import StageError
from trtflow.stages.onnx.graph import precision


@dataclass
class Candidate:
    name: str
    variant: str
    precision: str
    model: Path  # the ONNX variant the engine was built from
    engine: Path | None = None
    module: str = ""  # TensorRT module that built the engine
    profiles: list[dict[str, Any]] = field(default_factory=list)  # [{name, shapes: {input: [min, opt, max]}}]


def engine_candidates(inputs: dict[str, Any], stage: str, exclude: str | None = None) -> list[Candidate]:
    """The built engines of `inputs["engines"]`, matched with their variants among `inputs["models"]`; without
    engines, every model variant (but the one whose digest is `exclude`, the reference)."""
    models: list[Artifact] = inputs.get("models") or []
    models = models if isinstance(models, list) else [models]
    by_variant = {m.origin or m.path.stem: m for m in models}
    engines = inputs.get("engines")
    if engines is None:
        found = [Candidate(v, v, precision(onnx.load(str(m.path), load_external_data=False)), m.path)
                 for v, m in by_variant.items() if m.digest != exclude]
        if not found:
            raise StageError(f"{stage}: nothing to {stage}: no build stage and no model variant other than the "
                             f"reference; add a precision/calibrate or build stage before it, or set inputs.engines")
        return found
    found = []
    for cell_dir in sorted(p for p in engines.path.iterdir() if p.is_dir()):
        spec_file, info_file = cell_dir / "spec.json", cell_dir / "build.json"
        if not spec_file.exists() or not info_file.exists():
            continue
        spec, info = json.loads(spec_file.read_text()), json.loads(info_file.read_text())
        if info.get("status") != "ok":
            continue
        variant = spec["variant"]
        model = by_variant.get(variant)
        if model is None:
            raise StageError(f"{stage}: engine '{spec['name']}' was built from model variant '{variant}', which is "
                             f"not among this stage's models ({', '.join(by_variant) or 'none'}): add "
                             f"'{variant}' to inputs.models")
        found.append(Candidate(spec["name"], variant, spec["precision"], model.path, cell_dir / "engine.plan",
                               spec.get("module", ""), spec["profiles"]))
    if not found:
        raise StageError(f"{stage}: the build output {engines.path} holds no built engine")
    return found
