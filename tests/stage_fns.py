"""Small user stages (kind: tests.stage_fns:NAME) used to exercise the runner without ONNX work.

Written as users write theirs: against the public API, `from trtflow import ...`."""
from __future__ import annotations

import os
import time
from pathlib import Path

from trtflow import StageError, StageFailed, StageResult

CALLS: list[str] = []


def copy_model(params, inputs, out_dir: Path) -> StageResult:
    """Copy the input model, appending params['tag'] so different params give different outputs."""
    CALLS.append("copy_model")
    data = inputs["model"].path.read_bytes() + str(params.params.get("tag", "")).encode()
    (out_dir / "model.onnx").write_bytes(data)
    return StageResult(outputs={"model": out_dir / "model.onnx"}, summary=f"copied {len(data)} bytes",
                       metrics={"bytes": len(data)})


def count_bytes(params, inputs, out_dir: Path) -> StageResult:
    CALLS.append("count_bytes")
    n = inputs["model"].path.stat().st_size
    (out_dir / "report.json").write_text(f'{{"bytes": {n}}}')
    return StageResult(outputs={"report": out_dir / "report.json"}, summary=f"{n} bytes")


def fail(params, inputs, out_dir: Path) -> StageResult:
    (out_dir / "model.onnx").write_bytes(b"half")  # written, then the stage fails: must not be published
    raise StageError("planted failure")


def die(params, inputs, out_dir: Path) -> StageResult:
    (out_dir / "model.onnx").write_bytes(b"half")
    os._exit(17)  # a crash inside native code looks like this to the parent


def sleep(params, inputs, out_dir: Path) -> StageResult:
    time.sleep(float(params.params.get("seconds", 30)))
    return StageResult(outputs={})


def no_outputs(params, inputs, out_dir: Path) -> StageResult:
    return StageResult(outputs={})


def verdict_fail(params, inputs, out_dir: Path) -> StageResult:
    (out_dir / "report.json").write_text('{"verdict": "fail"}')
    raise StageFailed("checked, and it is wrong", StageResult(outputs={"report": out_dir / "report.json"},
                                                              summary="# why it failed"))


def engines(params, inputs, out_dir: Path) -> StageResult:
    """A directory output of several files, as the build stage publishes (one engine per cell)."""
    CALLS.append("engines")
    data = inputs["model"].path.read_bytes()
    for cell in ("fp32", "fp16"):
        (out_dir / "engines" / cell).mkdir(parents=True)
        (out_dir / "engines" / cell / "engine.plan").write_bytes(cell.encode() + data[:1000])
    return StageResult(outputs={"engines": out_dir / "engines"}, summary="2 engines")
