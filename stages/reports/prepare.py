"""Stage `prepare`'s report: the model before and after (opsets, nodes, weights, IO), what was converted,
sanitized and simplified with the check of each, the dynamic dimensions, and the TensorRT pre-flight."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from trtflow import markdown as md
from trtflow.stages.trt.preflight import PreflightReport


class Source(BaseModel):
    path: str
    digest: str
    external_data: bool


class PrepareReport(BaseModel):
    source: Source
    before: dict[str, Any]  # onnx.graph.inventory() of the model as given
    after: dict[str, Any]  # ... and as prepared
    full_check: Any
    sanitized_dims: list[dict[str, Any]]
    conversion: dict[str, Any] | None  # opset conversion: from, to, its check
    simplification: dict[str, Any]  # requested, applied, tool, seconds, its check, or why not
    dynamic_dims: list[dict[str, Any]]
    constants_to_initializers: int
    preflight: PreflightReport  # or why it did not run
    timings: dict[str, float]
    warnings: list[str]

    def summary(self, model_name: str) -> str:
        b, a = self.before, self.after
        lines = [f"### prepare · {md.code(model_name)}", "",
                 "| | before | after |", "|---|---|---|",
                 f"| default opset | {b['opsets'].get('ai.onnx')} | {a['opsets'].get('ai.onnx')} |",
                 f"| nodes | {b['nodes']} | {a['nodes']} |",
                 f"| initializers | {b['initializers']} ({b['initializer_bytes'] / 1e6:.1f} MB) | "
                 f"{a['initializers']} ({a['initializer_bytes'] / 1e6:.1f} MB) |",
                 f"| inputs | {_io(b['inputs'])} | {_io(a['inputs'])} |",
                 f"| outputs | {_io(b['outputs'])} | {_io(a['outputs'])} |", ""]
        conv = self.conversion
        if conv:
            lines.append(f"- **opset conversion** {conv['from']} → {conv['to']}: {_check_text(conv['check'])}")
        s = self.simplification
        if s["requested"]:
            lines.append("- **simplification**: " + (
                f"applied ({md.text(s.get('tool'))}), {_check_text(s['check'])}" if s["applied"]
                else f"not applied: {md.text(s['reason'])}"))
        if self.constants_to_initializers:
            lines.append(f"- **{self.constants_to_initializers} Constant nodes** turned into initializers")
        if self.sanitized_dims:
            dims = [md.code(f"{d['tensor']}[{d['axis']}]") + f" {md.text(repr(d['was']))}→" + md.code(d["now"])
                    for d in self.sanitized_dims]
            lines.append("- **sanitized dims**: " + ", ".join(dims))
        dyn = self.dynamic_dims
        lines.append("- **dynamic input dims**: " + (
            ", ".join(md.code(f"{d['input']}[{d['axis']}]") + f" ({md.code(d['name'])})" for d in dyn)
            + " — each needs a min/opt/max in the build's profiles" if dyn else "none (static shapes)"))
        lines += _preflight_lines(self.preflight)
        if self.warnings:
            lines += ["", "**Warnings**", ""] + [f"- {md.text(w)}" for w in self.warnings]
        lines += ["", "Top ops after: " + ", ".join(f"{md.text(op)} ×{n}" for op, n in sorted(
            ((op, n) for ops in a["ops"].values() for op, n in ops.items()), key=lambda x: -x[1])[:8])]
        return "\n".join(lines) + "\n"


def _preflight_lines(p: PreflightReport) -> list[str]:
    if not p.ran:
        return [f"- **TensorRT pre-flight did not run**: {md.text(p.reason)}"]
    verdict = (f"parsed, {p.layers if p.layers is not None else '?'} layers" if p.parsed
               else f"**{len(p.failures)} node(s) rejected**")
    trial = p.trial_build
    if trial:
        verdict += f"; trial build at {md.text(trial.shapes)}: " + (
            f"ok, {(trial.engine_bytes or 0) / 1e6:.1f} MB engine in {trial.seconds or 0:.1f} s" if trial.ok
            else f"**failed**: {md.text(trial.error)} ({md.text(trial.hint)})")
    lines = [f"- **TensorRT pre-flight** ({md.text(p.runtime)}): {verdict}"]
    if p.failures:
        lines += ["", "| node | op | parser says | what to do |", "|---|---|---|---|"]
        lines += [f"| {md.code(f.node, cell=True)} | {md.text(f.op_type)} | {md.text(f.reason)} | "
                  f"{md.text(f.hint)} |" for f in p.failures]
    return lines


def _io(items: list[dict[str, Any]]) -> str:
    return "<br>".join(f"{md.code(i['name'], cell=True)} {md.text(i['dtype'])} {md.text(i['shape'])}" for i in items)


def _check_text(check: dict[str, Any]) -> str:
    if check.get("ok") is None:
        return f"not verified ({md.text(check.get('skipped'))})"
    worst = max((o.get("max_abs", 0.0) for o in check["outputs"].values()), default=0.0)
    return (f"{'matches' if check['ok'] else 'DIFFERS'} on {check['samples']} {md.text(check.get('data', 'random'))} "
            f"input(s) (max abs diff {worst:.3g}, rtol {check['rtol']:g}, atol {check['atol']:g}, "
            f"{md.text(check['runtime'])})")
