"""Stage `validate`'s report: per candidate its accuracy against the reference, the bounds it missed, where it
goes wrong and the pictures; the repair of the variant (`Repair`, its `Round`s: `repair.py` finds it); the
verdict."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from trtflow import markdown as md
from trtflow.precisions import Precision
from trtflow.stages.compare.records import Accuracy, Labelled, Layerwise, OutputAccuracy
from trtflow.stages.onnx.records import Composition
from trtflow.text import listed


class Reference(BaseModel):
    model: str  # the stage that made it ("source" for the pipeline's model)
    runtime: str


def shapes_text(shapes: list[dict[str, list[int]]], most: int = 3) -> str:
    """Input shapes in words: 'x [1, 3, 48, 512]' (several: '; ' between, the first `most`)."""
    return listed([", ".join(f"{k} {v}" for k, v in s.items()) for s in shapes], most, sep="; ")


class ShapeResult(BaseModel):
    """A candidate at one shape: a profile's min, opt or max (or the data as given, where no profile is dynamic),
    how its samples were made, its metrics and its verdict."""
    name: str  # "<profile>.<point>", or "data"
    shapes: list[dict[str, list[int]]]  # the input shapes its samples had
    data: str  # how its samples were made
    samples: int
    outputs: dict[str, OutputAccuracy]  # as Accuracy.outputs
    passed: bool
    violations: list[str]

    def cells(self) -> list[str]:
        """Its row in the report's and the model card's table (SHAPE_HEADER), unescaped."""
        outs = self.outputs.values()
        named = len(self.outputs) > 1
        task = "; ".join(f"{o + ' ' if named else ''}{k} {v:.4g}" for o, m in self.outputs.items()
                         for k, v in m.task_values.items()) or "-"
        return [self.name, shapes_text(self.shapes), str(self.samples),
                f"{min(o.cosine for o in outs):.6f}" if outs else "-",
                f"{max(o.max_abs for o in outs):.4g}" if outs else "-",
                str(sum(max(0, o.added_nonfinite()) for o in outs)), task,
                "passes" if self.passed else "fails: " + "; ".join(self.violations), self.data]


SHAPE_HEADER = ["shape", "inputs", "samples", "cosine (worst output)", "max abs", "NaN/Inf added", "task metrics",
                "verdict", "data"]


class CandidateResult(BaseModel):
    name: str
    variant: str
    precision: Precision
    runtime: str
    engine: str | None
    data: str  # what the samples were
    shapes: list[dict[str, list[int]]]
    bounds: dict[str, dict[str, float]]  # output -> metric -> bound
    accuracy: Accuracy
    passed: bool
    violations: list[str]
    not_on_tensorrt: str  # why TensorRT did not run it here ("" when it did)
    warnings: list[str]
    plots: list[str] = []
    layerwise: Layerwise | None = None
    per_shape: list[ShapeResult] = []  # a row per shape it was checked at (reports before it have none)
    labelled: Labelled | None = None  # its accuracy against the data's labels (validate's `labels:`)
    composition: Composition | None = None  # its variant's compute by precision, as TensorRT builds it

    def summary(self) -> list[str]:
        verdict = "passes" if self.passed else "**fails**"
        lines = [f"#### {md.code(self.name)} ({md.text(self.precision)}) {verdict}", "",
                 f"runtime: {md.text(self.runtime)} · {self.accuracy.samples} samples at shapes "
                 + md.text(shapes_text(self.shapes, 4))
                 + (f" · graph measured: {md.code(self.accuracy.graph)}" if self.accuracy.graph else ""), ""]
        if self.composition:
            lines += [self.composition.markdown(), ""]
        lines += self.accuracy.table()
        if self.per_shape:
            lines += ["", "per shape:", ""] + shape_table(self.per_shape)
        if self.labelled is not None:
            lines += ["", f"against the labels: {md.text(self.labelled.text())}"]
        lines += [f"\n**fails**: {md.text(v)}" for v in self.violations]
        loc = self.layerwise
        if loc:
            first, largest = loc.first_bad, (loc.worst[0] if loc.worst and loc.worst[0].added > 0 else None)
            found = (f"{md.code(first.node)} ({md.text(first.op)}), cosine {first.cosine:.5f}, "
                     f"non-finite {first.nonfinite}" if first else "none found")
            lines += ["", f"**first node past its bound** (the first, in the reference's order, whose output's "
                          f"cosine < {loc.bound} on {loc.samples} samples, {md.text(loc.on)}): " + found]
            nan = loc.first_nonfinite
            if nan is not None:
                lines += ["", f"**first non-finite output**: {md.code(nan.node)} ({md.text(nan.op)}) made "
                              f"{nan.nonfinite} NaN/Inf values where the reference's are finite; what feeds it is "
                              f"where to look (a value FP16 rounds to 0 or past 65504)"]
            if largest is not None:
                lines += ["", f"**largest drift**: {md.code(largest.node)} ({md.text(largest.op)}) adds "
                              f"{largest.added:.2e} of 1 - cosine over its inputs" +
                          (" (the same node)" if first is not None and first.node == largest.node else
                           "; the first node past its bound is where the error first shows, this one is where most "
                           "of it comes from")]
            lines += ["", "| node | op | cosine | drift added | RMS error / RMS reference | reference max |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {md.code(w.node, cell=True)} | {md.text(w.op)} | {w.cosine:.5f} | {w.added:.2e} | "
                      f"{w.rms_rel:.3g} | {w.reference_max:.4g} |" for w in loc.worst]
            if loc.overflow:
                lines += ["", "reference activations beyond FP16's 65504: " + ", ".join(
                    f"{md.code(o.tensor)} ({o.reference_max:.4g})" for o in loc.overflow)]
            if loc.sentinels and self.precision == "fp16":  # a failing FP16 variant: they may be what turned inf
                lines += ["", "masks or sentinels beyond FP16's 65504 (one constant value each, which FP16 makes "
                              "infinite: harmless where it only masks): " + ", ".join(
                                  f"{md.code(o.tensor)} ({o.reference_max:.4g})" for o in loc.sentinels)]
            if loc.clipping:
                lines += ["", "INT8 ranges that do not fit the data: " + ", ".join(
                    f"{md.code(o.tensor)} (clipped {o.clipped:.2%}, range use {o.range_use:.3f})"
                    for o in loc.clipping)]
        lines += ["", " ".join(md.image(p, p) for p in self.plots), ""]
        return lines


def shape_table(rows: list[ShapeResult]) -> list[str]:
    """The Markdown table of a candidate's shapes: one row each, a failing one's verdict in bold."""
    lines = ["| " + " | ".join(SHAPE_HEADER) + " |", "|" + "---|" * len(SHAPE_HEADER)]
    for r in rows:
        cells = [md.text(c) for c in r.cells()]
        if not r.passed:
            cells[7] = f"**{cells[7]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return lines


class Round(BaseModel):
    """One rebuild-and-check: the nodes given back (or tried without), the set checked, what still failed."""
    give_back: list[str] | None = None
    without: list[str] | None = None
    nodes: list[str]
    violations: list[str]


class Repair(BaseModel):
    """What the search found for one variant; `model` (not written to reports) is the repaired variant."""

    variant: str
    precision: str
    passed: bool
    nodes: list[str] = []
    of: int | None = None  # the variant's FP16 / quantized nodes
    rounds: list[Round] = []
    note: str | None = None
    yaml: str | None = None
    warnings: list[str] = []
    shapes: list[str] = []  # the shapes (validate's shape sets) each round was checked at: those that failed
    model: Any = Field(None, exclude=True)  # an onnx.ModelProto (whatever Variant.rebuild makes)


class ValidateReport(BaseModel):
    reference: Reference
    data: str
    candidates: list[CandidateResult]
    repair: Repair | None
    passed: bool
    shipped: list[str] = []  # the candidates that pass: the only ones to measure and deploy
    not_shipped: dict[str, str] = {}  # candidate -> why it must not be deployed
    excluded: dict[str, str] = {}  # optional variant -> why it failed and was left out (the run went on)
    warnings: list[str]
    labelled: Labelled | None = None  # the FP32 reference's accuracy against the data's labels

    @classmethod
    def read(cls, path: Path) -> "ValidateReport":
        return cls.model_validate_json(path.read_text())

    def checked_as(self, name: str, variant: str) -> CandidateResult | None:
        """The result that judged the engine `name` of `variant`: its own, else its variant's where validate
        checked the variant rather than engines (a result with no engine); None: validate did not check it."""
        results = {c.name: c for c in self.candidates}
        own, of_variant = results.get(name), results.get(variant)
        if own is not None:
            return own
        return of_variant if of_variant is not None and of_variant.engine is None else None

    def refuses(self, name: str, variant: str) -> str | None:
        """Why the engine `name` of `variant` must not be deployed, or None: it passed (itself, or as the variant
        when validate checked variants rather than engines)."""
        checked = self.checked_as(name, variant)
        if checked is None:
            return "validate did not check it"
        return None if checked.name in self.shipped else self.not_shipped.get(checked.name, "failed validation")

    def summary(self) -> str:
        ok = sum(c.passed for c in self.candidates)
        lines = [f"### validate · {ok}/{len(self.candidates)} candidates pass · reference: "
                 f"{md.text(self.reference.model)} on {md.text(self.reference.runtime)}", "",
                 f"sample data: {md.text(self.data)}", ""]
        if self.labelled is not None:
            lines += [f"**against the labels**: FP32 {md.text(self.labelled.text())}; each candidate's below "
                      f"(agreement with FP32 is what its verdict weighs)", ""]
        if self.not_shipped:
            lines += ["**not to be deployed**: " + "; ".join(f"{md.code(n)}: {md.text(why)}"
                                                             for n, why in self.not_shipped.items()), ""]
        for c in self.candidates:
            lines += c.summary()
        if self.repair:
            lines += _repair_summary(self.repair)
        lines += [f"**warning**: {md.text(w)}" for w in self.warnings]
        return "\n".join(lines) + "\n"


def _repair_summary(rep: Repair) -> list[str]:
    lines = [f"#### repair of {md.code(rep.variant)} ({md.text(rep.precision)})", ""]
    if rep.note:
        return lines + [md.text(rep.note), ""]
    given = "kept in FP32" if rep.precision == "fp16" else "left unquantized"
    lines += [("**repaired**: " if rep.passed else "**not repaired** ") +
              f"{len(rep.nodes)} of {rep.of} node(s) {given}: " + ", ".join(md.code(n) for n in rep.nodes) +
              f" ({len(rep.rounds)} rebuild-and-check rounds"
              + (f", each checked at {', '.join(md.text(n) for n in rep.shapes)}" if rep.shapes else "") + ")", ""]
    lines += ["| round | nodes | passes |", "|---|---|---|"]
    lines += [f"| {i} | {_round_change(h)} | {'yes' if not h.violations else md.text(h.violations[0])} |"
              for i, h in enumerate(rep.rounds, 1)]
    if rep.yaml:
        lines += [""] + md.block(rep.yaml, "yaml")
    return lines + [""]


def _round_change(h: Round) -> str:
    """'+ a, b' for nodes given back in a repair round, '- a' for nodes tried without; long lists shortened (a table
    cell)."""
    sign, nodes = ("+", h.give_back) if h.give_back is not None else ("-", h.without or [])
    shown = ", ".join(md.code(n, cell=True) for n in nodes[:3])
    return f"{sign} {shown}" + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
