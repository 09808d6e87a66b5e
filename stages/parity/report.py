"""Stage `parity`'s report: per image how far the deploy preprocessing is from the training transforms, the
model's outputs on both, the diagnosis (the usual causes tried, the fix found) and the verdict; with the records
it is made of (`PixelMetrics`, `ModelParity`, `Diagnosis`, ...), which `diagnosis.py` and `stage.py` fill in."""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, WithJsonSchema

from trtflow import markdown as md
from trtflow.errors import StageError
from trtflow.pipelines.params.parity import ParityTolerances
from trtflow.stages.image.steps import Step, Steps, dump, parse


def _typed_steps(value: Any) -> Steps:
    if all(isinstance(step, Step) for step in value):
        return list(value)
    try:
        return parse(value)
    except StageError as exc:  # a validation error of the model that holds them
        raise ValueError(str(exc)) from None


# canonical steps in a report: typed in Python, their canonical JSON in the file
StepList = Annotated[Steps, PlainValidator(_typed_steps), PlainSerializer(dump),
                     WithJsonSchema({"type": "array", "items": {"type": "object"}})]


class ChannelStats(BaseModel):
    deploy_mean: float
    training_mean: float
    deploy_std: float
    training_std: float


class PixelMetrics(BaseModel):
    """One image's deploy tensor against its training tensor (inf apart where the shapes differ)."""
    model_config = ConfigDict(ser_json_inf_nan="constants")  # as Python's json writes them: inf stays inf

    shape_ok: bool
    shape: list[int] | None = None  # where they agree
    deploy_shape: list[int] | None = None  # where they do not
    training_shape: list[int] | None = None
    max_abs: float
    mean_abs: float
    psnr: float
    image: str | None = None  # parity's rows: which image, and its channels' statistics
    channels: list[ChannelStats] | None = None


class Prediction(BaseModel):
    """A classifier's top-1 class (and its score) on one image's training tensor and on its deploy tensor."""
    image: str
    training: int
    deploy: int
    training_score: float
    deploy_score: float


class ModelParity(BaseModel):
    """The model's outputs on the deploy tensors against those on the training tensors (ONNX Runtime)."""
    ran: bool
    reason: str | None = None  # why it did not run
    runtime: str | None = None
    output: str | None = None
    max_abs_diff: float | None = None
    top1: float | None = None  # a classifier's agreement
    top5: float | None = None
    predictions: list[Prediction] = []
    ok: bool = True  # within the tolerances' top1


class Tried(BaseModel):
    """One single change the search tried (its first round)."""
    cause: str = ""
    fix: str
    ok: bool = False
    mean_abs: float | None = None
    max_abs: float | None = None
    error: str | None = None  # the change does not run on these images


class ChainStep(BaseModel):
    cause: str
    fix: str  # as YAML
    mean_abs: float
    max_abs: float


class Declared(BaseModel):
    mean_abs: float | None = None
    max_abs: float | None = None


class Search(BaseModel):
    rounds: int
    max_rounds: int
    beam: int
    evaluations: int
    images: int
    seconds: float


class AfterFix(BaseModel):
    """The fix run on every image, and the model on its tensors (when all pass)."""
    images: int
    passing: int
    worst_mean_abs: float | None = None
    worst_max_abs: float | None = None
    model: ModelParity | None = None


class Diagnosis(BaseModel):
    """What the search found: the shortest chain of changes that brings the images within tolerance (`fix`,
    `steps`, `yaml`), or none and the closest single changes (`tried`)."""
    declared: Declared = Declared()
    tried: list[Tried] = []
    search: Search
    chain: list[ChainStep] = []
    cause: str | None = None
    fix: str | None = None
    steps: StepList | None = None  # the fixed deploy steps
    yaml: str | None = None
    after_fix: AfterFix | None = None


def passes(m: PixelMetrics, tol: ParityTolerances) -> bool:
    """Whether one image's metrics are within the tolerances."""
    if not m.shape_ok:
        return False
    ok = m.max_abs <= tol.max_abs and m.mean_abs <= tol.mean_abs
    if tol.min_psnr is not None:
        ok &= m.psnr >= tol.min_psnr
    return ok


class ParityReport(BaseModel):
    verdict: str  # "pass" or "fail"
    preprocess_digest: str
    steps: StepList  # the canonical deploy steps
    runtimes: dict[str, str]  # deploy, training
    tolerances: ParityTolerances
    images: list[PixelMetrics]  # per image, with its name and channel statistics
    model: ModelParity | None  # the model's outputs on deploy vs training tensors
    diagnosis: Diagnosis | None
    worst_image: str

    def failure_line(self) -> str:
        rows = self.images
        bad = [x for x in rows if not passes(x, self.tolerances)]
        worst = max(rows, key=lambda x: x.mean_abs)
        what = (f"shape {worst.deploy_shape} vs training {worst.training_shape}" if not worst.shape_ok
                else f"worst mean |diff| {worst.mean_abs:.3g}, max {worst.max_abs:.3g}")
        line = f"parity: deploy preprocessing differs from training on {len(bad)}/{len(rows)} image(s) ({what})"
        if self.model and self.model.top1 is not None:
            line += f"; model top-1 agreement {self.model.top1:.0%}"
        d = self.diagnosis
        if d and d.fix:
            line += f"; likely cause{'s' if len(d.chain) > 1 else ''}: {d.cause} — fix: {d.fix}"
        elif d is not None:
            line += f"; no usual cause, alone or up to {d.search.max_rounds} combined, explains it"
        return line

    def summary(self, picture: Path | None) -> str:
        ok = self.verdict == "pass"
        lines = [f"### parity · {'✅ pass' if ok else '❌ fail'}", "",
                 f"deploy: {md.text(self.runtimes['deploy'])} · training: {md.text(self.runtimes['training'])} · "
                 f"preprocess digest {md.code(self.preprocess_digest[:12])}", "",
                 "| image | max abs | mean abs | PSNR dB | within tolerance |", "|---|---|---|---|---|"]
        tol = self.tolerances
        for x in self.images:
            if x.shape_ok:
                lines.append(f"| {md.text(x.image)} | {x.max_abs:.4g} | {x.mean_abs:.4g} | {x.psnr:.1f} | "
                             f"{'yes' if passes(x, tol) else '**no**'} |")
            else:
                lines.append(f"| {md.text(x.image)} | shape {md.text(x.deploy_shape)} vs "
                             f"{md.text(x.training_shape)} | | | **no** |")
        lines.append(f"\ntolerances: max abs {tol.max_abs}, mean abs {tol.mean_abs}"
                     + (f", PSNR ≥ {tol.min_psnr}" if tol.min_psnr else ""))
        m, d = self.model, self.diagnosis
        if m and m.ran:
            line = f"\n**model outputs** ({md.text(m.runtime)}): max |diff| {m.max_abs_diff or 0:.4g}"
            if m.top1 is not None:
                line += f", top-1 agreement {m.top1:.0%}, top-5 {m.top5 or 0:.0%}"
            lines.append(line)
            fixed = d.after_fix.model if d and d.after_fix else None
            lines += _predictions(m.predictions, fixed.predictions if fixed else None)
        if d:
            lines += _diagnosis(d)
        if picture:
            lines += ["", f"Worst image {md.code(self.worst_image)} (deploy, training, difference): "
                          f"{md.code(picture.name)}"]
            data = picture.read_bytes()
            if len(data) < 200_000:  # inline, so the Prefect artifact shows it
                lines += ["", f"![worst](data:image/png;base64,{base64.b64encode(data).decode()})"]
        return "\n".join(lines) + "\n"


def _predictions(declared: list[Prediction], fixed: list[Prediction] | None) -> list[str]:
    """Per image, the model's top-1 class (and score) on the training tensor, on the declared deploy tensor and,
    when a fix was found, on the fixed one: a trained model shows the mistake where random weights cannot."""
    if not declared:
        return []
    head = "| image | training: class (score) | deploy as declared | after the fix |" if fixed else \
        "| image | training: class (score) | deploy |"
    lines = ["", head, "|" + "---|" * (head.count("|") - 1)]
    after = {p.image: p for p in fixed or []}
    for p in declared[:16]:
        row = (f"| {md.text(p.image)} | {p.training} ({p.training_score:.3g}) | {p.deploy} ({p.deploy_score:.3g})"
               f"{'' if p.deploy == p.training else ' **differs**'} |")
        if fixed and p.image in after:
            q = after[p.image]
            row += f" {q.deploy} ({q.deploy_score:.3g}) |"
        lines.append(row)
    if len(declared) > 16:
        lines.append(f"\n({len(declared) - 16} more in report.json)")
    return lines


def _diagnosis(d: Diagnosis) -> list[str]:
    s = d.search
    cost = (f"searched {s.evaluations} set(s) of steps on the {s.images} worst image(s) in {s.seconds:.2g} s "
            f"({s.rounds} of at most {s.max_rounds} round(s), {s.beam} kept per round)")
    if not d.fix:
        lines = ["", f"**Diagnosis**: no usual cause, alone or up to {s.max_rounds} combined, brings them into "
                     f"agreement; {cost}. Closest single changes:",
                 "", "| change tried | worst mean abs | agrees |", "|---|---|---|"]
        for t in d.tried[:6]:
            lines.append(f"| {md.text(t.fix)} | {t.mean_abs if t.mean_abs is not None else float('nan'):.4g} | "
                         f"{'yes' if t.ok else 'no'} |")
        return lines
    lines = ["", f"**Diagnosis**: {md.text(d.cause)}. Fix: " + " and ".join(md.code(c.fix) for c in d.chain), "",
             "| step | change | worst mean abs | max abs |", "|---|---|---|---|",
             f"| as declared | | {_num(d.declared.mean_abs)} | {_num(d.declared.max_abs)} |"]
    for i, c in enumerate(d.chain, 1):
        lines.append(f"| {i}. {md.text(c.cause)} | {md.code(c.fix, cell=True)} | {c.mean_abs:.4g} | {c.max_abs:.4g} |")
    a = d.after_fix
    if a:
        check = f"The fix on all {a.images} image(s): {a.passing} within tolerance"
        if a.model is not None and a.model.top1 is not None:
            check += f"; model top-1 agreement {a.model.top1:.0%}"
        lines += ["", check + "."]
    lines += [""] + md.block(d.yaml or "", "yaml") + ["", cost + "."]
    return lines


def _num(v: float | None) -> str:
    return f"{v:.4g}" if v is not None else "-"
