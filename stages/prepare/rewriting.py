"""Prepare's rewrites (issue #68): the user's own rewrites, then, for every node TensorRT's parser refuses, the
built-in rules keyed by its op (stages/onnx/rewrites/), each kept only once it is checked: ONNX Runtime gives the
same outputs before and after within the check's tolerance, and the parser takes what replaced the node. A rule that
does not apply, or fails its check, is recorded with why (the measured difference) and the node stays."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from trtflow.errors import StageError
from trtflow.stages.onnx import graph as onnx_graph
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.rewrites import rules_for
from trtflow.stages.onnx.rewrites.apply import Refused, apply
from trtflow.stages.onnx.rewrites.rule import Rewrite, added_for
from trtflow.stages.prepare.report import RewriteRecord
from trtflow.stages.trt.preflight import cause_of, no_rewrite, run_preflight
from trtflow.stages.trt.records import ParseFailure, PreflightReport
from trtflow.text import first_line
from trtflow.usercode import import_callable

Check = Callable[[Path, Path], Any]  # the stage's ModelCheck of a new model against the one before


class Rewriter:
    """Applies rewrites one at a time to the prepared model in `work`, each checked against the model before it."""

    def __init__(self, model: onnx.ModelProto, path: Path, work: Path, check: Check, external: bool):
        self.model, self.path, self.work, self.check, self.external = model, path, work, check, external
        self.records: list[RewriteRecord] = []
        self._n = 0

    def user(self, ref: str) -> None:
        """Your function `package.module:function` (an ONNX model in, one out), always applied; a result that
        fails the check stops the stage with the measured difference."""
        func = import_callable(ref, "prepare: rewrites", 1)
        try:
            new = func(self.model)
        except Exception as exc:  # noqa: BLE001 - the user's code, said in one line
            raise StageError(f"prepare: rewrites: {ref} failed: {type(exc).__name__}: {first_line(exc)}") from None
        if not isinstance(new, onnx.ModelProto):
            raise StageError(f"prepare: rewrites: {ref} returned {type(new).__name__}, not an onnx.ModelProto")
        record = RewriteRecord(node="(model)", op_type="-", rule=ref, summary="your rewrite")
        reason = self._try(new, record, parse=False)
        if reason is not None:
            raise StageError(f"prepare: rewrites: {ref} changes the model's outputs: {reason}",
                             hint="fix the function, or take it out of prepare.rewrites")

    def refused(self, failures: list[ParseFailure]) -> None:
        """The built-in rules for each node the parser refused, the first that passes its checks kept. A refusal
        that names no node (the parser's ScatterElements importer) stands for every node of its op."""
        onnx_graph.name_nodes(self.model)  # a rewrite finds its node by name; exporters leave some unnamed
        tried: set[str] = set()
        for failure in failures:
            rules = rules_for(failure.op_type, failure.domain)
            for node in self._nodes(failure) if rules else []:
                if node not in tried:
                    tried.add(node)
                    any(self._rule(node, failure.op_type, rule) for rule in rules)

    def _nodes(self, failure: ParseFailure) -> list[str]:
        if failure.node:
            return [failure.node]
        return [n.name for n in self.model.graph.node if n.op_type == failure.op_type]

    def _rule(self, node: str, op_type: str, rule: Rewrite) -> bool:
        record = RewriteRecord(node=node, op_type=op_type, rule=rule.name, summary=rule.summary)
        try:
            new = apply(self.model, node, rule)
        except Refused as why:
            record.reason = f"does not apply: {why}"
            self.records.append(record)
            return False
        except KeyError:
            return False  # the node is gone (an earlier rewrite replaced it)
        return self._try(new, record, parse=True) is None

    def _try(self, new: onnx.ModelProto, record: RewriteRecord, parse: bool) -> str | None:
        """Keep `new` where both checks pass (None); else why not."""
        self._n += 1
        path = self.work / f"rewrite-{self._n}.onnx"
        model_io.save(new, path, external=self.external or None)
        check = self.check(self.path, path)
        record.check = check.text()
        record.max_abs = max((o.max_abs or 0.0 for o in check.outputs.values()), default=None)
        reason = _check_failed(check) or (_parser_refuses(path, record.node) if parse else None)
        record.kept, record.reason = reason is None, reason
        self.records.append(record)
        if reason is None:
            self.model, self.path = new, path
        return reason


def _check_failed(check: Any) -> str | None:
    if check.ok is None:
        return f"could not be checked on ONNX Runtime ({check.skipped})"
    return None if check.ok else f"ONNX Runtime's outputs differ ({check.worst()})"


def _parser_refuses(path: Path, node: str) -> str | None:
    """Why the parser refuses what replaced `node`; None where it takes it (other refused nodes do not count)."""
    report: PreflightReport = run_preflight(path)
    if not report.ran:
        return f"the parser could not be asked ({report.reason})"
    mine = [f for f in report.failures if added_for(node, f.node)]
    return None if not mine else f"the parser refuses its replacement: {mine[0].op_type}: {mine[0].reason}"


def explain(failure: ParseFailure, records: list[RewriteRecord], enabled: bool) -> str:
    """What to do about a node the parser still refuses after prepare's rewrites: why trtflow's rule for it was not
    kept, or that turning rewrites on fixes it, or the other ways out."""
    rules = rules_for(failure.op_type, failure.domain)
    if not rules:
        return f"{cause_of(failure)}; no rewrite of trtflow's covers it: {no_rewrite(failure)}"
    names = ", ".join(r.name for r in rules)
    if not enabled:
        return (f"{cause_of(failure)}; trtflow rewrites it into nodes the parser takes (rule {names}): set "
                f"prepare.rewrites: auto (the default)")
    tried = [r for r in records if r.node == failure.node and not r.kept]
    why = "; ".join(f"{r.rule} {r.reason}" for r in tried) or f"rule {names} was not tried"
    return f"{cause_of(failure)}; trtflow's rewrite was not kept ({why}): {no_rewrite(failure)}"
