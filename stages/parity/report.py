"""Stage `parity`'s report: per image how far the deploy preprocessing is from the training transforms, the
model's outputs on both, the diagnosis (the usual causes tried, the fix found) and the verdict."""
from __future__ import annotations

import base64
from pathlib import Path

from pydantic import BaseModel

from trtflow import markdown as md
from trtflow.pipelines.params.parity import ParityTolerances
from trtflow.stages.parity import diagnosis as dx


class ParityReport(BaseModel):
    verdict: str  # "pass" or "fail"
    preprocess_digest: str
    steps: dx.StepList  # the canonical deploy steps
    runtimes: dict[str, str]  # deploy, training
    tolerances: ParityTolerances
    images: list[dx.PixelMetrics]  # per image, with its name and channel statistics
    model: dx.ModelParity | None  # the model's outputs on deploy vs training tensors
    diagnosis: dx.Diagnosis | None
    worst_image: str

    def failure_line(self) -> str:
        rows = self.images
        bad = [x for x in rows if not dx.passes(x, self.tolerances)]
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
                             f"{'yes' if dx.passes(x, tol) else '**no**'} |")
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


def _predictions(declared: list[dx.Prediction], fixed: list[dx.Prediction] | None) -> list[str]:
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


def _diagnosis(d: dx.Diagnosis) -> list[str]:
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
