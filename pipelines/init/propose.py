"""What init writes for a model: its facts, the data's, the task and the profile, or the refusal naming the flag
that would say what they do not."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trtflow import names
from trtflow.errors import SpecError
from trtflow.pipelines.init.data import read_data
from trtflow.pipelines.init.model import read_model
from trtflow.pipelines.init.profile import parse_shape
from trtflow.pipelines.init.profile import propose as propose_profile
from trtflow.pipelines.init.task import guess
from trtflow.pipelines.init.write import Proposal


def default_output(model: Path) -> Path:
    return model.parent / "pipeline.yaml"


def propose(model: Path, *, out: Path, command: str, data: str | None = None, task: str | None = None,
            layout: str | None = None, shapes: Sequence[str] = (), name: str | None = None,
            cwd: Path | None = None) -> Proposal:
    """What init writes for `model`, or the SpecError (exit 2) naming the flag that would say what it cannot
    infer."""
    if not model.is_file():
        raise SpecError(f"{model}: no such file", hint="give the path of an ONNX model")
    name = name if name is not None else model.stem
    why = names.problem(name, names.DOTTED, names.MODEL_MAX_LENGTH)
    if why:
        raise SpecError(f"pipeline name: {why}", hint="give --name")
    given = [parse_shape(s) for s in shapes]
    facts = read_model(model)
    samples = read_data(data, cwd or Path.cwd()) if data is not None else None
    plan = guess(facts, task, layout)
    profile = propose_profile(facts, samples, given)
    return Proposal(command, name, out, facts, samples, plan, profile)
