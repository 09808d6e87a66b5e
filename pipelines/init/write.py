"""The pipeline file `trtflow init` writes: YAML with a comment beside each value saying where it came from."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trtflow.pipelines.init.cost import Counts, ProfileCost
from trtflow.pipelines.init.data import DataFacts
from trtflow.pipelines.init.model import ModelFacts
from trtflow.pipelines.init.profile import ProfilePlan
from trtflow.pipelines.init.task import TaskPlan
from trtflow.yaml_text import YamlLines, scalar

QDQ_OPSET = 13  # per-channel Q/DQ (the calibrate stage refuses a model below it)
TARGET_OPSET = 17  # what the examples convert to
COMMENT_AT = 48  # the column end-of-line comments start at
WIDTH = 118


@dataclass(frozen=True)
class ProfileTrial:
    """What TensorRT's trial build of the profile (FP32, at its min / opt / max) said; the CLI runs it (pipelines/
    imports no stage)."""
    runtime: str | None  # e.g. "tensorrt-rtx 1.7.1.116"; None where no TensorRT flavour is installed
    passed: bool | None  # None: not checked (`why` says why)
    seconds: float | None = None
    why: str = ""  # not checked, or failed: why (a failure init does not refuse: no flag of init's changes it)
    offload: bool = False  # the parser rejects nodes no rule rewrites: the pipeline offloads them to ONNX Runtime

    def said(self) -> str:
        where = f"TensorRT's trial build ({self.runtime})" if self.runtime else "TensorRT's trial build"
        if self.passed:
            return f"{where} passed at this profile's min / opt / max (FP32, {self.seconds:.1f} s)"
        if self.passed is None:
            return f"not checked by {where}: {self.why}"
        return f"{where} FAILS at this profile: {self.why}"


@dataclass(frozen=True)
class Proposal:
    """Everything init read and proposed: the file is written from this alone."""
    command: str
    name: str
    out: Path
    model: ModelFacts
    data: DataFacts | None
    task: TaskPlan
    profile: ProfilePlan
    trial: ProfileTrial | None = None  # set by the CLI once TensorRT was asked
    cost: ProfileCost | None = None  # set by the CLI once ONNX Runtime was asked (memory at the max, one timed pass)


def value(v: object) -> str:
    """A value as the pipeline file holds it: on one line, '$' doubled (the loader interpolates ${VAR})."""
    return scalar(v, interpolated=True)


def _rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path, base)).as_posix()


def data_glob(data: DataFacts, base: Path) -> str:
    """The data's glob relative to the pipeline file's directory (as the stages resolve it)."""
    parts = data.pattern.parts
    cut = next(i for i, p in enumerate(parts) if any(c in p for c in "*?["))
    return Path(_rel(Path(*parts[:cut]), base), *parts[cut:]).as_posix()


def _holdout(samples: int) -> int:
    return min(8, samples // 4) if samples >= 4 else (1 if samples >= 2 else 0)


def sample_counts(data: DataFacts | None) -> Counts | None:
    """The samples each stage of the file takes, as `render` writes them (for the run time init estimates)."""
    if data is None:
        return None
    n = data.count
    return Counts(min(16, n), _holdout(min(16, n)), min(128, n), _holdout(min(128, n)), min(16, n))


@dataclass(frozen=True)
class _Samples:
    """The data block the stages share: its key (images / tensors), the glob and how many files it matches."""
    key: str
    glob: str
    count: int

    def block(self, at_most: int) -> str:
        return value({self.key: self.glob, "samples": min(at_most, self.count)})


def render(p: Proposal) -> str:
    base = p.out.parent.resolve()
    samples = _Samples(p.data.kind, data_glob(p.data, base), p.data.count) if p.data is not None else None
    w = YamlLines(WIDTH, COMMENT_AT)
    w.comment("Written by trtflow init: a first pipeline, each value proposed from what the model and the data say")
    w.comment("(the comments say how); edit it, then `trtflow validate` / `trtflow run` it. The command was:")
    w.comment(f"  {p.command}")
    w.comment(f"The model ({p.model.path.name}, ONNX opset {p.model.opset}), as read from the file:")
    for t in p.model.inputs:
        dyn = t.dynamic()
        w.comment(f"  input {t.name}: {t.shown()}"
                  + (f", dynamic: dimension{'s' if len(dyn) > 1 else ''} {', '.join(map(str, dyn))}" if dyn else
                     ", every dimension fixed"))
    for t in p.model.outputs:
        w.comment(f"  output {t.name}: {t.shown()}")
    w.comment("Task" + ("s" if len(p.task.tasks()) > 1 else "") + ": "
              + (", ".join(p.task.tasks()) or "none given (each output judged by one cosine with FP32's, pooled "
                                                 "over every sample)"))
    for j in p.task.judged:
        w.comment(f"  {j.output.name}: {j.why}")
    if p.data is not None and p.data.kind == "images":
        hs = sorted(h for h, _ in p.data.sizes)
        ws = sorted(x for _, x in p.data.sizes)
        w.comment(f"Data: {samples.glob}: {p.data.count} images, {hs[0]}..{hs[-1]} x {ws[0]}..{ws[-1]} pixels "
                  f"(height x width)")
    elif samples is not None:
        w.comment(f"Data: {samples.glob}: {p.data.count} tensor files, fed to the model as they are")
    else:
        w.comment("Data: none given (--data): random inputs, and no INT8 variant (calibration needs real samples)")
    w.add("version: 1")
    w.add(f"name: {value(p.name)}")
    w.add(f"model: {value(_rel(p.model.path.resolve(), base))}")
    w.add("")
    w.add("stages:")
    _prepare(w, p)
    if samples is not None and samples.key == "images":
        _parity(w, p, samples)
    _precision(w, p, samples)
    _build(w, p)
    _validate(w, p, samples)
    w.add("")
    w.add("  benchmark:")
    w.add("    kind: benchmark", "trtexec where installed, else the built-in harness")
    w.add("    duration: 1s", "per engine and shape (gate: {baseline: previous, ...} bounds it)")
    w.add("")
    w.add("  release:")
    w.add("    kind: release", "the engine to deploy: a Triton model repository and a model card")
    w.comment("the fastest engine validate passed, losing at most 1% on the task metrics that are shares (errors in "
              "an output's units are validate's bounds)", 4)
    w.add("    select: {require: validated, prefer: throughput, max_accuracy_drop: 1%}")
    if samples is not None:
        w.add(f"    data: {samples.block(1)}", "Triton warms the engine up with a real sample")
    return w.text()


def _prepare(w: YamlLines, p: Proposal) -> None:
    w.add("  prepare:")
    w.add("    kind: prepare")
    if p.model.opset < QDQ_OPSET:
        w.add(f"    target_opset: {TARGET_OPSET}",
              f"the model ships at opset {p.model.opset}; INT8's per-channel Q/DQ needs {QDQ_OPSET}")
    shapes = {ip.tensor.name: ip.shape(1) for ip in p.profile.inputs}
    w.add(f"    input_shapes: {value(shapes)}", "the profile's opt shapes, for the random-input checks")
    if p.trial is not None and p.trial.offload:
        w.add("    offload: onnxruntime", "TensorRT rejects nodes no rule rewrites (the build's profile says which): "
                                        "ONNX Runtime runs them, TensorRT the rest, served as one Triton ensemble")


def _parity(w: YamlLines, p: Proposal, samples: _Samples) -> None:
    """The parity stage images need: every other stage feeds them through its preprocessing."""
    feed = p.profile.image
    size = [feed.height, feed.width]
    channels = next(ip.tensor.dims[1] for ip in p.profile.inputs if ip.tensor.name == feed.input)
    w.add("")
    w.add("  parity:")
    w.add("    kind: parity", "the preprocessing every stage feeds the images through")
    w.add(f"    images: {value(samples.glob)}")
    w.comment("A conventional preprocessing, not read from the model (an ONNX file does not say how it was", 4)
    w.comment("trained): resized to the profile's opt size, scaled to [0, 1], CHW. Put your model's own here", 4)
    w.comment("(mean/std, letterbox, crop...), and its training transforms below: parity then proves they agree.", 4)
    w.add("    deploy:")
    w.add(f"      - read: {'gray' if channels == 1 else 'rgb'}")
    w.add(f"      - resize: {value({'size': size, 'antialias': True})}",
          "the opt H x W; antialiased as PIL resizes")
    if feed.dtype == "uint8":
        w.add("      - dtype: uint8", "the model takes 0..255 bytes")
    else:
        w.add("      - scale: 1/255")
        if feed.dtype == "float16":
            w.add("      - dtype: float16", "the model's input type")
    w.add("      - layout: chw")
    w.add("      - batch: true")
    transforms = (["Grayscale()"] if channels == 1 else []) + [f"Resize({size})"] + \
        (["PILToTensor()"] if feed.dtype == "uint8" else ["ToTensor()"])
    w.comment("The same in torchvision on PIL images (pip install trtflow[torch]): an assumption init writes,", 4)
    w.comment("not your training code: replace it with your training transforms.", 4)
    w.add("    training:")
    w.add(f"      torchvision: {value(transforms)}")


def _metrics(p: Proposal) -> dict:
    return {name: m.model_dump(mode="json", exclude_unset=True) for name, m in p.task.metrics().items()}


def _precision(w: YamlLines, p: Proposal, samples: _Samples | None) -> None:
    metrics = _metrics(p)
    w.add("")
    w.add("  fp16:")
    w.add("    kind: precision")
    w.add("    to: fp16")
    if samples is not None:
        w.add(f"    data: {samples.block(16)}",
              "through the parity stage's preprocessing" if samples.key == "images" else "")
        w.add(f"    holdout: {_holdout(min(16, samples.count))}", "samples kept for the CPU accuracy pre-flight")
    if metrics:
        w.add(f"    metrics: &task {value(metrics)}", "the pre-flight judges what validate judges")
    if samples is None:
        return
    w.add("")
    w.add("  int8:")
    w.add("    kind: calibrate", "INT8 Q/DQ, ranges from the data")
    w.add(f"    data: {samples.block(128)}", "a real project calibrates on hundreds" if samples.count < 100 else "")
    w.add(f"    holdout: {_holdout(min(128, samples.count))}", "samples kept for the CPU accuracy pre-flight")
    if metrics:
        w.add("    metrics: *task")


def _build(w: YamlLines, p: Proposal) -> None:
    w.add("")
    w.add("  build:")
    w.add("    kind: build", "an engine per variant (FP32, FP16" + (", INT8" if p.data is not None else "")
          + ") and profile")
    w.add("    profiles:")
    for ip in p.profile.inputs:
        for note in ip.notes:
            w.comment(f"{ip.tensor.name}: {note}", 6)
    if p.trial is not None:
        w.comment(p.trial.said(), 6)
    for line in p.cost.lines() if p.cost is not None else ():
        w.comment(line, 6)
    ranges = {ip.tensor.name: {"min": ip.shape(0), "opt": ip.shape(1), "max": ip.shape(2)} for ip in p.profile.inputs}
    w.add(f"      default: {value(ranges)}")


def _validate(w: YamlLines, p: Proposal, samples: _Samples | None) -> None:
    w.add("")
    w.add("  validate:")
    w.add("    kind: validate", "every engine against the FP32 model, at min, opt and max")
    if samples is not None:
        w.add(f"    data: {samples.block(16)}")
    else:
        w.add("    data: {random: true}", "no --data: random inputs say little about a task's accuracy")
    if p.task.metrics():
        w.add("    metrics: *task")
    w.add(f"    optional: {value(['fp16'] + (['int8'] if samples is not None else []))}",
          "a variant that fails is left out (the card says why) and FP32 ships")
