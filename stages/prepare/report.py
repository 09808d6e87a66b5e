"""Stage `prepare`'s report: the model before and after (opsets, nodes, weights, IO), what was converted,
sanitized and simplified with the check of each, the dynamic dimensions, and the TensorRT pre-flight."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trtflow import markdown as md
from trtflow.stages.compare.records import OutputDiff
from trtflow.stages.onnx.records import DynamicDim, GraphTensor, Inventory, Piece, RenamedDim, TensorSpec
from trtflow.stages.trt.records import PreflightReport

ONNX_DOMAIN = "ai.onnx"


class Source(BaseModel):
    path: str
    digest: str
    external_data: bool


class ModelCheck(BaseModel):
    """A transformed model against the model before it, in ONNX Runtime (`ort.runner.compare_models`): `ok`
    None where it could not be compared (`skipped` says why)."""
    ok: bool | None = None
    skipped: str | None = None
    rtol: float | None = None
    atol: float | None = None
    input_shapes: dict[str, list[int]] = {}
    runtime: str | None = None
    samples: int = 0
    outputs: dict[str, OutputDiff] = {}
    directions: dict[str, dict[str, bool]] = {}  # always empty (kept: reports stored it)
    violations: list[str] = []
    data: str | None = None  # what the inputs were

    def worst(self) -> str:
        parts = [f"{name}: {r.error or 'max |diff| %.3g' % (r.max_abs or 0)}"
                 for name, r in self.outputs.items() if not r.ok]
        return ", ".join(parts) or "mismatch"

    def text(self) -> str:
        if self.ok is None:
            return f"not verified ({md.text(self.skipped)})"
        worst = max((o.max_abs or 0.0 for o in self.outputs.values()), default=0.0)
        return (f"{'matches' if self.ok else 'DIFFERS'} on {self.samples} {md.text(self.data or 'random')} "
                f"input(s) (max abs diff {worst:.3g}, rtol {self.rtol:g}, atol {self.atol:g}, "
                f"{md.text(self.runtime)})")


class Conversion(BaseModel):
    """The opset conversion, checked."""
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    source: int | None = Field(alias="from")
    to: int
    check: ModelCheck


class Simplification(BaseModel):
    requested: bool
    applied: bool = False
    tool: str | None = None
    seconds: float | None = None
    check: ModelCheck | None = None
    reason: str | None = None  # why it was not applied


class RewriteRecord(BaseModel):
    """One rewrite tried: on which node, by which rule (a built-in rule's name, or your function), and whether it
    was kept; `max_abs` is ONNX Runtime's largest difference over the outputs, before and after."""
    node: str
    op_type: str
    rule: str
    summary: str = ""
    kept: bool = False
    max_abs: float | None = None
    reason: str | None = None  # why it was not kept
    check: str | None = None  # the check, said

    def line(self) -> str:
        verdict = (f"kept, max abs diff {self.max_abs:.3g}" if self.kept
                   else f"not kept: {self.reason}")
        return f"{self.node} ({self.op_type}) by {self.rule}: {verdict}"

    def row(self) -> str:
        diff = f"{self.max_abs:.3g}" if self.max_abs is not None else "-"
        return (f"| {md.code(self.node, cell=True)} | {md.text(self.op_type)} | {md.code(self.rule, cell=True)} | "
                f"{md.text(self.summary)} | {diff} | {'kept' if self.kept else md.text(self.reason)} |")


class OffloadedNode(BaseModel):
    name: str
    op_type: str
    why: str


class OffloadRecord(BaseModel):
    """What `offload: onnxruntime` gave ONNX Runtime: the nodes and why, and the chain they cut the model into
    (each TensorRT piece proved by a trial build; `rounds` of cutting until every one built)."""
    parser: str | None  # the parser whose partition it started from
    nodes: list[OffloadedNode]  # the nodes ONNX Runtime runs
    tensorrt_nodes: int
    pieces: list[Piece]
    rounds: int
    trials: int

    def lines(self) -> list[str]:
        out = ["", (f"**Offloaded to ONNX Runtime**: {len(self.nodes)} node(s) run on ONNX Runtime in FP32, "
                    f"{self.tensorrt_nodes} on TensorRT, in {len(self.pieces)} pieces (from the partition of "
                    f"{md.text(self.parser or 'no parser')}, {self.trials} trial build(s) in {self.rounds} "
                    f"round(s))"), "",
               "| piece | runtime | nodes | reads | hands on |", "|---|---|---|---|---|"]
        out += [f"| {i} | {p.runtime} | {len(p.nodes)} | {_specs(p.inputs)} | {_specs(p.outputs)} |"
                for i, p in enumerate(self.pieces)]
        out += ["", "| node on ONNX Runtime | op | why |", "|---|---|---|"]
        out += [f"| {md.code(n.name, cell=True)} | {md.text(n.op_type)} | {md.text(n.why)} |" for n in self.nodes]
        return out


def _specs(specs: list[TensorSpec]) -> str:
    return "<br>".join(f"{md.code(t.name, cell=True)} {md.text(t.dtype)} {md.text(t.dims())}" for t in specs)


class PrepareReport(BaseModel):
    source: Source
    before: Inventory  # the model as given
    after: Inventory  # ... and as prepared
    full_check: Any
    sanitized_dims: list[RenamedDim]
    conversion: Conversion | None
    simplification: Simplification
    dynamic_dims: list[DynamicDim]
    constants_to_initializers: int
    rewrites: list[RewriteRecord] = []  # each rewrite tried, kept or not (issue #68)
    preflight: PreflightReport  # or why it did not run (of the model as rewritten)
    offload: OffloadRecord | None = None  # what ONNX Runtime runs (`offload: onnxruntime`, where needed)
    timings: dict[str, float]
    warnings: list[str]

    def summary(self, model_name: str) -> str:
        b, a = self.before, self.after
        lines = [f"### prepare · {md.code(model_name)}", "",
                 "| | before | after |", "|---|---|---|",
                 f"| default opset | {b.opsets.get(ONNX_DOMAIN)} | {a.opsets.get(ONNX_DOMAIN)} |",
                 f"| nodes | {b.nodes} | {a.nodes} |",
                 f"| initializers | {b.initializers} ({b.initializer_bytes / 1e6:.1f} MB) | "
                 f"{a.initializers} ({a.initializer_bytes / 1e6:.1f} MB) |",
                 f"| inputs | {_io(b.inputs)} | {_io(a.inputs)} |",
                 f"| outputs | {_io(b.outputs)} | {_io(a.outputs)} |", ""]
        conv = self.conversion
        if conv:
            lines.append(f"- **opset conversion** {conv.source} → {conv.to}: {conv.check.text()}")
        s = self.simplification
        if s.requested:
            lines.append("- **simplification**: " + (
                f"applied ({md.text(s.tool)}), {s.check.text() if s.check else '-'}" if s.applied
                else f"not applied: {md.text(s.reason)}"))
        if self.constants_to_initializers:
            lines.append(f"- **{self.constants_to_initializers} Constant nodes** turned into initializers")
        if self.sanitized_dims:
            dims = [md.code(f"{d.tensor}[{d.axis}]") + f" {md.text(repr(d.was))}→" + md.code(d.now)
                    for d in self.sanitized_dims]
            lines.append("- **sanitized dims**: " + ", ".join(dims))
        dyn = self.dynamic_dims
        lines.append("- **dynamic input dims**: " + (
            ", ".join(md.code(f"{d.input}[{d.axis}]") + f" ({md.code(d.name)})" for d in dyn)
            + " — each needs a min/opt/max in the build's profiles" if dyn else "none (static shapes)"))
        if self.rewrites:
            lines += ["", ("**Rewrites** (nodes TensorRT's parser refused, replaced by nodes it takes; each checked "
                           "on ONNX Runtime before it was kept)"), "",
                      "| node | op | rule | replaced by | max abs diff | |", "|---|---|---|---|---|---|"]
            lines += [r.row() for r in self.rewrites] + [""]
        lines += _preflight_lines(self.preflight)
        if self.offload:
            lines += self.offload.lines()
        if self.warnings:
            lines += ["", "**Warnings**", ""] + [f"- {md.text(w)}" for w in self.warnings]
        lines += ["", "Top ops after: " + ", ".join(f"{md.text(op)} ×{n}" for op, n in sorted(
            ((op, n) for ops in a.ops.values() for op, n in ops.items()), key=lambda x: -x[1])[:8])]
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


def _io(items: list[GraphTensor]) -> str:
    return "<br>".join(f"{md.code(i.name, cell=True)} {md.text(i.dtype)} {md.text(i.shape)}" for i in items)
