"""Which nodes of a model TensorRT runs and which ONNX Runtime runs, when TensorRT cannot take the whole model
(issue #68, partial offload): the parser's own partition, each TensorRT piece then proved by a trial build.

1. The parser's partition (`supports_model_v2`, in a child process as the pre-flight runs): its subgraphs' node
   lists say which nodes it takes; a node in none of them, or one it refused, goes to ONNX Runtime. Its
   per-subgraph "supported" flag is recorded but not trusted: it says False for pieces that then parse and build.
2. `split.segments` orders the nodes into few runs of one runtime; `split.split` cuts the model into those pieces.
3. Each TensorRT piece is parsed and built on its own (`preflight.run_preflight`, at the shapes its inputs have
   when the chain runs `feeds` on ONNX Runtime). A piece that fails gives ONNX Runtime the nodes the parser
   refused in it, or, when it parsed and did not build, the nodes the builder's error names (TopK's K, a layer with
   no runner, an FP8 tensor), else all its nodes; then it is cut again, until every TensorRT piece builds. Each round moves at least one node to ONNX Runtime, so this ends; a piece already proved is
   not built again.
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import onnx
from pydantic import BaseModel

from trtflow import child
from trtflow.errors import TransientStageError
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.records import Chain, Piece, Runtime
from trtflow.stages.onnx.split import ChainSession, Feeds, Segment, prepared, segments, split
from trtflow.stages.trt.env import INSTALL_HINT, find_tensorrt
from trtflow.stages.trt.preflight import TIMEOUT_S, run_preflight
from trtflow.stages.trt.records import Backend, ParseFailure, PreflightReport, TrialBuild


class PartitionRequest(BaseModel):
    model: str


class ParserSubgraph(BaseModel):
    """One subgraph of the parser's partition: indices into the model's `graph.node`."""
    nodes: list[int]
    supported: bool  # the parser's own flag: not trusted (False for pieces that build)


class ParserPartition(BaseModel):
    """What `supports_model_v2` said of the whole model."""
    ran: bool
    runtime: str | None = None
    reason: str | None = None  # why no parser ran
    supported: bool = False  # the whole model, in the parser's view
    subgraphs: list[ParserSubgraph] = []
    failures: list[ParseFailure] = []  # the nodes it refused, and why


class NodeLabel(BaseModel):
    index: int  # in the model's `graph.node` (Constant nodes made initializers first: `split.prepared`)
    name: str
    op_type: str
    runtime: Runtime
    why: str


class PieceTrial(BaseModel):
    """A TensorRT piece parsed and built on its own."""
    nodes: list[str]
    ok: bool
    parsed: bool = False
    failures: list[ParseFailure] = []
    build: TrialBuild | None = None
    reason: str | None = None  # why no parser ran


class Partition(BaseModel):
    """Which runtime runs each node, the runs they form, the trial builds that proved the TensorRT ones, and the
    chain cut from them (its pieces' files in `chain.folder`)."""
    parser: ParserPartition
    nodes: list[NodeLabel]  # in the order the chain runs them
    segments: list[Segment]
    trials: list[PieceTrial]  # every piece built, failed ones included
    chain: Chain
    rounds: int

    def runtimes(self) -> list[Runtime]:
        return [s.runtime for s in self.segments]


# --- the parser's partition (child process) ------------------------------------------------------------------------

def parser_partition(model: Path, timeout: float = TIMEOUT_S) -> ParserPartition:
    """The parser's partition of `model`, from a child process (a crash there is a report, not ours)."""
    trt = find_tensorrt()
    if trt is None:
        return ParserPartition(ran=False, reason=f"no TensorRT flavour is installed ({INSTALL_HINT})")
    with tempfile.TemporaryDirectory(prefix="trtflow-partition-") as folder:
        outcome = child.call("trtflow.stages.trt.partition", PartitionRequest(model=str(model)), ParserPartition,
                             Path(folder), timeout, what="the TensorRT parser's partition")
    if isinstance(outcome, child.TimedOut):
        raise TransientStageError(f"the TensorRT parser's partition {outcome.text()}: no answer; run again")
    if isinstance(outcome, child.Crashed):
        return ParserPartition(ran=False, runtime=_label(trt), reason=f"the TensorRT parser process "
                               f"{outcome.text()}")
    return outcome.response


def _label(trt: Backend) -> str:
    return f"{trt.flavour} {trt.version} parser"


def _supports(request: PartitionRequest, folder: Path) -> ParserPartition:
    from trtflow.stages.trt import parse as trt_parse

    backend = find_tensorrt()
    assert backend is not None
    parsed = trt_parse.open_parser(backend)  # kept whole: the parser needs its builder, network and logger alive
    model = Path(request.model)
    supported, subgraphs = _ask(parsed.parser, model.read_bytes(), str(model))
    return ParserPartition(ran=True, runtime=_label(backend), supported=supported, subgraphs=subgraphs,
                           failures=trt_parse.failures(parsed.parser, model))


def _ask(parser: Any, data: bytes, path: str) -> tuple[bool, list[ParserSubgraph]]:
    if hasattr(parser, "supports_model_v2"):  # TensorRT 10.x, TensorRT-RTX
        ok = bool(parser.supports_model_v2(data, path))
        return ok, [ParserSubgraph(nodes=list(parser.get_subgraph_nodes(i)),
                                   supported=bool(parser.is_subgraph_supported(i)))
                    for i in range(parser.num_subgraphs)]
    ok, found = parser.supports_model(data, path)  # older TensorRT: (ok, [(nodes, supported), ...])
    return bool(ok), [ParserSubgraph(nodes=list(nodes), supported=bool(flag)) for nodes, flag in found]


# --- labels --------------------------------------------------------------------------------------------------------

def first_labels(model: onnx.ModelProto, found: ParserPartition) -> list[NodeLabel]:
    """TensorRT for the nodes of the parser's subgraphs, ONNX Runtime for the rest."""
    refused = {f.node_index: f for f in found.failures if f.node_index is not None}
    refused.update({i: f for i, n in enumerate(model.graph.node) for f in found.failures if f.node == n.name})
    where = {i: k for k, sub in enumerate(found.subgraphs) for i in sub.nodes}
    labels = []
    for i, node in enumerate(model.graph.node):
        if i in refused:
            runtime, why = "onnxruntime", f"the parser refused it: {refused[i].reason}"
        elif i in where:
            runtime, why = "tensorrt", f"in the parser's subgraph {where[i]}"
        else:
            runtime, why = "onnxruntime", found.reason or "in none of the parser's subgraphs"
        labels.append(NodeLabel(index=i, name=node.name, op_type=node.op_type, runtime=runtime, why=why))
    return labels


def _relabel(labels: list[NodeLabel], names: list[str], why: str) -> None:
    moving = set(names)
    for label in labels:
        if label.name in moving:
            label.runtime, label.why = "onnxruntime", why


# --- trial builds --------------------------------------------------------------------------------------------------

def trial(chain: Chain, piece: Piece, values: Feeds, timeout: float) -> PieceTrial:
    """Parse and build the piece alone, at the shapes its inputs had in the chain's run: from 1 (where the piece
    does not fix a dimension: a batch, a count only the data decides) up to them."""
    shapes = {t.name: [int(d) for d in values[t.name].shape] for t in piece.inputs}
    low = {t.name: [d if isinstance(fixed, int) else min(1, d) for fixed, d in zip(t.shape or [], shapes[t.name])]
           for t in piece.inputs}
    report = run_preflight(chain.path(piece), shapes, timeout=timeout, min_shapes=low)
    return _trial_of(piece, report)


def _trial_of(piece: Piece, report: PreflightReport) -> PieceTrial:
    build = report.trial_build
    return PieceTrial(nodes=piece.nodes, ok=report.parsed and build is not None and build.ok, parsed=report.parsed,
                      failures=report.failures, build=build, reason=report.reason)


def _failed(t: PieceTrial, outputs: dict[str, list[str]]) -> tuple[list[str], str]:
    """The nodes a failed trial gives to ONNX Runtime, and why: those the parser refused in the piece (when it
    names them); where it parsed and did not build, those the builder's error names (a layer is named after its node,
    a tensor after the node's output: `outputs`); else the whole piece."""
    named = [f.node for f in t.failures if f.node in t.nodes]
    if not t.parsed and named:
        return named, f"the parser refused it in its piece: {t.failures[0].reason}"
    error = t.build.error if t.build is not None else t.reason or "the piece did not parse"
    blamed = _blamed(t, outputs)
    if blamed:
        return blamed, f"the builder named it when its piece did not build: {error}"
    return t.nodes, f"its piece did not build with TensorRT: {error}"


def _blamed(t: PieceTrial, outputs: dict[str, list[str]]) -> list[str]:
    """The piece's nodes the builder's error names, by the node's name (TensorRT names a layer after it, with a
    `_<n>` suffix where it makes several) or one of its outputs' names (a tensor); none where the error names none."""
    if not t.parsed or t.build is None:
        return []
    text = " ".join(x for x in (t.build.error, t.build.detail) if x)
    def said(name: str) -> bool:
        return bool(name) and re.search(rf"(?<![\w.]){re.escape(name)}(?:_\d+)?(?![\w.])", text) is not None
    return [n for n in t.nodes if said(n) or any(said(o) for o in outputs.get(n, []))]


# --- the whole ----------------------------------------------------------------------------------------------------

def partition(model_path: Path, feeds: Feeds, work: Path, timeout: float = TIMEOUT_S) -> Partition:
    """Cut the model at `model_path` into TensorRT and ONNX Runtime pieces, each TensorRT piece proved by a trial
    build at the shapes `feeds` (one sample of the model's inputs) gives it. `work` gets the model as partitioned
    (`model.onnx`, Constants made initializers) and one folder per round of cutting (`cut1`, ...); the last one is
    `Partition.chain`'s."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    model = prepared(model_io.load(model_path))
    whole = work / "model.onnx"
    model_io.save(model, whole)
    found = parser_partition(whole, timeout)
    labels = first_labels(model, found)
    proved: dict[tuple[str, ...], PieceTrial] = {}
    rounds = 0
    while True:
        rounds += 1
        cut = segments(model, [label.runtime for label in labels])
        chain = split(model, cut, work / f"cut{rounds}")
        failed = _prove(chain, feeds, proved, timeout)
        if not failed:
            break
        outputs = {n.name: [o for o in n.output if o] for n in model.graph.node}
        for t in failed:
            _relabel(labels, *_failed(t, outputs))
    order = [i for seg in cut for i in seg.nodes]
    return Partition(parser=found, nodes=[labels[i] for i in order], segments=cut, trials=list(proved.values()),
                     chain=chain, rounds=rounds)


def trials(chain: Chain, feeds: Feeds, timeout: float = TIMEOUT_S) -> list[PieceTrial]:
    """Each TensorRT piece of `chain` parsed and built on its own, at the shapes `feeds` (the model's inputs) give
    it when the chain runs on ONNX Runtime."""
    proved: dict[tuple[str, ...], PieceTrial] = {}
    _prove(chain, feeds, proved, timeout)
    return list(proved.values())


def _prove(chain: Chain, feeds: Feeds, proved: dict[tuple[str, ...], PieceTrial], timeout: float) -> list[PieceTrial]:
    """Build each TensorRT piece not built before; the trials that failed."""
    pending = [p for p in chain.pieces if p.runtime == "tensorrt" and tuple(p.nodes) not in proved]
    if not pending:
        return []
    values = ChainSession(chain).values(feeds)
    for piece in pending:
        proved[tuple(piece.nodes)] = trial(chain, piece, values, timeout)
    return [proved[tuple(p.nodes)] for p in pending if not proved[tuple(p.nodes)].ok]


if __name__ == "__main__":
    raise SystemExit(child.serve(PartitionRequest, _supports))
