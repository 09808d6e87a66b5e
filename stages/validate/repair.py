"""Repair a failing FP16 or INT8 variant: the smallest set of nodes to keep in FP32 (FP16) or leave unquantized
(INT8) found by following the layerwise localization (Polygraphy's flowchart: find the failing layer, keep it in
higher precision, check again), each round rebuilt through the same code the precision/calibrate stages use.

Round by round: give back the first node that goes wrong and the nodes adding the most drift (1, then 2, 4, ...
of them), rebuild, check the gate, localize again. Where the variant makes a NaN or Inf, the first node whose
output turns non-finite and the nodes feeding it (nearest first) are given back before anything else: the value
that breaks is often made one node earlier (FP16 rounding `x + 1e-10` to `x`, then `log(0)`), with no drift to
rank. Once it passes, the last batch is bisected and chunks of the set are tried without (while rounds last), so
the set stays small. What it found is a `Repair` of the report's (`report.py`).
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import onnx

from trtflow.stages.compare.records import Layerwise
from trtflow.stages.onnx import fp16, model_io
from trtflow.stages.onnx.fp16_emulation import emulate, emulated, half_nodes, keeps_io_types
from trtflow.stages.ort import fp16_remainder, qdq, quant_prep
from trtflow.stages.ort.probe import probe
from trtflow.stages.validate.report import Repair, Round
from trtflow.yaml_text import YamlLines, scalar

Check = Callable[[onnx.ModelProto], list[str]]  # simulated model -> gate violations ([] = passes)
Locate = Callable[[onnx.ModelProto], Layerwise]  # simulated model -> where it goes wrong


@dataclass
class Variant:
    """How to rebuild one variant with some nodes given back, and its simulation."""
    rebuild: Callable[[list[str]], tuple[onnx.ModelProto, onnx.ModelProto]]  # nodes -> (variant, simulation)
    fixable: Callable[[str], str | None]  # a node that goes wrong -> the node to give back for it
    size: int  # how many nodes run in the lower precision as built
    upstream: Callable[[str], Iterable[str]] = lambda name: ()  # a node -> the nodes feeding it, nearest first
    warnings: list[str] = field(default_factory=list)


def feeders(reference: onnx.ModelProto) -> Callable[[str], Iterator[str]]:
    """node -> the nodes upstream of it in `reference`, breadth first (the nearest first), lazily."""
    producer = {o: n for n in reference.graph.node for o in n.output}
    by_name = {n.name: n for n in reference.graph.node}

    def upstream(name: str) -> Iterator[str]:
        seen, todo = {name}, [name]
        while todo:
            node = by_name.get(todo.pop(0))
            for t in node.input if node is not None else ():
                up = producer.get(t)
                if up is not None and up.name not in seen:
                    seen.add(up.name)
                    todo.append(up.name)
                    yield up.name
    return upstream


def fp16_variant(reference: onnx.ModelProto, variant: onnx.ModelProto, work: Path, probe_feed: dict) -> Variant:
    half = half_nodes(variant, reference) or set()
    fp32 = {n.name: "FP32 in the variant" for n in reference.graph.node if n.name not in half}
    keep_io = keeps_io_types(variant)

    def runs(candidate: onnx.ModelProto) -> None:
        path = work / "repair_candidate.onnx"
        model_io.save(candidate, path)
        probe(path, probe_feed, work)

    def rebuild(nodes: list[str]) -> tuple[onnx.ModelProto, onnx.ModelProto]:
        blocked = {**fp32, **{n: "kept in FP32 by validate's repair" for n in nodes}}
        model, plan, _ = fp16.convert_valid(reference, blocked, set(), keep_io, runs)
        return model, emulate(reference, plan.half, keep_io)

    names = {n.name for n in reference.graph.node}
    return Variant(rebuild, lambda n: n if n in names and n in half else None, len(half), feeders(reference))


def int8_variant(reference_path: Path, reference: onnx.ModelProto, variant: onnx.ModelProto, work: Path) -> Variant:
    how = qdq.recipe(variant)
    quantized = how.quantized(reference)
    pre = work / "repair_pre.onnx"
    # the calibrate stage quantized the pre-processed model: so must the rebuild, or it is another variant
    warnings = [f"repair: {w}" for w in quant_prep.pre_process(reference_path, pre, work)]

    def rebuild(nodes: list[str]) -> tuple[onnx.ModelProto, onnx.ModelProto]:
        out = work / "repair_int8.onnx"
        qdq.write(pre, out, work / "repair_ranges.json", how.tensors, how.per_channel, how.quantize_ops,
                  how.excluded | set(nodes), how.quantize_outputs)
        model = model_io.load(out)
        if how.fp16_remainder is None:
            return model, model  # Q/DQ runs as fake quantization as it is
        # the nodes given back leave INT8 for the remainder's FP16, as calibrate's exclude_nodes does
        model, _ = fp16_remainder.convert(model, how.fp16_remainder, None, work)
        return model, emulated(model)

    upstream = feeders(reference)

    def fixable(name: str) -> str | None:
        """The node itself if quantized, else the nearest quantized node upstream of it."""
        return next((n for n in itertools.chain([name], upstream(name)) if n in quantized), None)

    return Variant(rebuild, fixable, len(quantized), upstream, warnings)


def search(v: Variant, first: Layerwise, check: Check, locate: Locate, rounds: int, variant: str,
           precision: str, limit: int | None = None) -> Repair:
    """Give nodes back until the gate passes, then take back what is not needed (at most `rounds` rebuilds).

    Grow, doubling each round (1, 2, 4, ... nodes, in the order the latest localization ranks them): one planted
    fault is fixed by the first round, an error spread over many layers is still reached in a few. Then bisect
    the last batch for the shortest passing prefix, and drop the remaining nodes that are not needed, latest
    first, in halving chunks. The growth stops once more than `limit` nodes are given back: past it, a fix would
    be no repair anyway."""
    given: list[str] = []
    history: list[Round] = []
    loc, best, violations, failing = first, None, ["not repaired"], 0
    step = 1
    while len(history) < rounds and (limit is None or len(given) <= limit):
        picks = _next(v, loc, given, step)
        if not picks:
            break
        failing = len(given)
        given += picks
        best, sim = v.rebuild(given)
        violations = check(sim)
        history.append(Round(give_back=picks, nodes=list(given), violations=violations))
        if not violations:
            break
        loc = locate(sim)
        step *= 2
    if violations:
        return Repair(variant=variant, precision=precision, passed=False, nodes=given, of=v.size, rounds=history,
                      warnings=v.warnings)

    def passes(trial: list[str]) -> bool:
        nonlocal best
        model, sim = v.rebuild(trial)
        left = check(sim)
        history.append(Round(without=[n for n in given if n not in trial], nodes=trial, violations=left))
        if not left:
            best = model
        return not left

    lo, hi = failing, len(given)  # given[:lo] fails, given[:hi] passes
    while hi - lo > 1 and len(history) < rounds:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if passes(given[:mid]) else (mid, hi)
    given = given[:hi]
    chunk = len(given) // 2
    while chunk and len(history) < rounds:
        end = len(given)
        while end > 0 and len(history) < rounds:
            start = max(0, end - chunk)
            trial = given[:start] + given[end:]
            if trial and passes(trial):
                given = trial
            end = start
        chunk //= 2
    return Repair(variant=variant, precision=precision, passed=True, nodes=given, of=v.size, rounds=history,
                  model=best, warnings=v.warnings, yaml=yaml_fix(precision, given, variant))


def _next(v: Variant, loc: Layerwise, given: list[str], count: int) -> list[str]:
    """The next `count` nodes to give back: for the first node that goes wrong, then for the nodes adding the
    most drift. Where a node's output turns non-finite, that node and then the nodes feeding it, the nearest
    first."""
    bad = loc.first_nonfinite
    if bad is not None:
        picks = _fixes(v, itertools.chain([bad.node], v.upstream(bad.node)), given, count)
        if picks:
            return picks
    rows = loc.rows or loc.worst
    ranked = ([loc.first_bad] if loc.first_bad else []) + sorted(rows, key=lambda r: -r.added)
    return _fixes(v, (row.node for row in ranked), given, count)


def _fixes(v: Variant, nodes: Iterable[str], given: list[str], count: int) -> list[str]:
    """The first `count` distinct nodes to give back for `nodes`, in order, not given back already."""
    picks: list[str] = []
    for name in nodes:
        node = v.fixable(name)
        if node is not None and node not in given and node not in picks:
            picks.append(node)
            if len(picks) == count:
                break
    return picks


def yaml_fix(precision: str, nodes: list[str], stage: str) -> str:
    """The lines to paste into the precision / calibrate stage so the fix lives in the pipeline file (node names
    are anyone's text: written by the one YAML writer, so none can end its line)."""
    w = YamlLines()
    w.add("stages:")
    w.add(f"  {scalar(stage)}:")
    if precision == "fp16":
        w.add(f"    block_nodes: {scalar([re.escape(n) for n in nodes], interpolated=True)}",
              "kept in FP32 (validate's repair)")
    else:
        w.add(f"    exclude_nodes: {scalar(nodes, interpolated=True)}", "left unquantized (validate's repair)")
    return w.text()
