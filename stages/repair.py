"""Repair a failing FP16 or INT8 variant: the smallest set of nodes to keep in FP32 (FP16) or leave unquantized
(INT8) found by following the layerwise localization (Polygraphy's flowchart: find the failing layer, keep it in
higher precision, check again), each round rebuilt through the same code the precision/calibrate stages use.

Round by round: take the first node that goes wrong (else the node adding the most drift) not yet given back,
rebuild, check the gate, localize again. Once it passes, each node is tried without (while rounds last), so the
set stays small.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import onnx

from trtflow.stages.onnx import fp16, model_io
from trtflow.stages.onnx.fp16_emulation import emulate, half_nodes, keeps_io_types
from trtflow.stages.ort import qdq, quant_prep
from trtflow.stages.ort.probe import probe

Check = Callable[[onnx.ModelProto], list[str]]  # simulated model -> gate violations ([] = passes)
Locate = Callable[[onnx.ModelProto], dict[str, Any]]  # simulated model -> layerwise result


@dataclass
class Variant:
    """How to rebuild one variant with some nodes given back, and its simulation."""
    rebuild: Callable[[list[str]], tuple[onnx.ModelProto, onnx.ModelProto]]  # nodes -> (variant, simulation)
    fixable: Callable[[str], str | None]  # a node that goes wrong -> the node to give back for it


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
    return Variant(rebuild, lambda n: n if n in names and n in half else None)


def int8_variant(reference_path: Path, reference: onnx.ModelProto, variant: onnx.ModelProto, work: Path) -> Variant:
    quantized = qdq.quantized_nodes(variant)
    ops = sorted(set(quantized.values()))
    skipped = sorted(n.name for n in reference.graph.node if n.op_type in ops and n.name not in quantized)
    tensors, per_channel = qdq.activation_ranges(variant), qdq.is_per_channel(variant)
    pre = work / "repair_pre.onnx"
    quant_prep.pre_process(reference_path, pre, work)

    def rebuild(nodes: list[str]) -> tuple[onnx.ModelProto, onnx.ModelProto]:
        out = work / "repair_int8.onnx"
        qdq.write(pre, out, work / "repair_ranges.json", tensors, per_channel, ops, set(skipped) | set(nodes))
        model = model_io.load(out)
        return model, model  # Q/DQ runs as fake quantization as it is

    producer = {o: n for n in reference.graph.node for o in n.output}
    by_name = {n.name: n for n in reference.graph.node}

    def fixable(name: str) -> str | None:
        """The node itself if quantized, else the nearest quantized node upstream of it."""
        todo, seen = [name], set()
        while todo:
            n = todo.pop(0)
            if n in seen or n not in by_name:
                continue
            seen.add(n)
            if n in quantized:
                return n
            todo += [producer[t].name for t in by_name[n].input if t in producer]
        return None

    return Variant(rebuild, fixable)


def search(v: Variant, first: dict[str, Any], check: Check, locate: Locate, rounds: int) -> dict[str, Any]:
    """Give nodes back round by round until the gate passes (at most `rounds` rebuilds)."""
    given: list[str] = []
    history: list[dict[str, Any]] = []
    loc, best, violations = first, None, ["not repaired"]
    while len(history) < rounds:
        pick = _next(v, loc, given)
        if pick is None:
            break
        given.append(pick)
        best, sim = v.rebuild(given)
        violations = check(sim)
        history.append({"give_back": pick, "nodes": list(given), "violations": violations})
        if not violations:
            break
        loc = locate(sim)
    if violations:
        return {"passed": False, "nodes": given, "rounds": history, "model": None}
    for n in list(given):  # prune: each node tried without, while rounds last
        if len(given) == 1 or len(history) >= rounds:
            break
        trial = [g for g in given if g != n]
        model, sim = v.rebuild(trial)
        left = check(sim)
        history.append({"without": n, "nodes": trial, "violations": left})
        if not left:
            given, best = trial, model
    return {"passed": True, "nodes": given, "rounds": history, "model": best}


def _next(v: Variant, loc: dict[str, Any], given: list[str]) -> str | None:
    ranked = ([loc["first_bad"]] if loc.get("first_bad") else []) + list(loc.get("worst", []))
    for row in ranked:
        node = v.fixable(row["node"])
        if node is not None and node not in given:
            return node
    return None


def yaml_fix(precision: str, nodes: list[str], stage: str) -> str:
    """The lines to paste into the precision / calibrate stage so the fix lives in the pipeline file."""
    if precision == "fp16":
        items = ", ".join(f"'{re.escape(n)}'" for n in nodes)
        return f"stages:\n  {stage}:\n    block_nodes: [{items}]   # kept in FP32 (validate's repair)\n"
    items = ", ".join(f"'{n}'" for n in nodes)
    return f"stages:\n  {stage}:\n    exclude_nodes: [{items}]   # left unquantized (validate's repair)\n"
