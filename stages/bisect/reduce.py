"""Reduce a failing model to a small subgraph that still fails the same check, for a bug report (the job of
`polygraphy debug reduce`): `trtflow reduce MODEL --check fp16|int8|parse|build|command`.

Subgraphs are cut with ONNX's own extraction (`onnx.utils.Extractor`); a tensor that becomes a subgraph input is
fed the value the whole FP32 model gives it on the same samples (ONNX Runtime), so a value-dependent failure (an
FP16 overflow, a clipped INT8 range) survives the cut, and the subgraph's inputs get the shapes they really have.

The search, each step a few checks of the failing model:
1. outputs: bisect over prefixes of the topological order (each prefix's outputs are every tensor it hands on) for
   the first node at which the check fails; keep that node's outputs as the only outputs;
2. inputs: bisect over suffixes of that output's cone for the smallest one that still fails;
3. a linear pass cuts each remaining node (its outputs become inputs) and keeps every cut after which it still
   fails — steps 1 and 2 assume a failure that, once present, stays; this pass does not.
A subgraph that fails in another way than the whole model (another op rejected, another build error) does not
count as failing.
"""
from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper

from trtflow import child
from trtflow.errors import TrtflowError
from trtflow.stages.compare.accuracy import Comparison
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.graph import constants_to_initializers
from trtflow.stages.ort.runner import RUNTIME, session
from trtflow.text import first_line

Feeds = dict[str, np.ndarray]


@dataclass
class Failure:
    message: str  # one line, for the user
    signature: str = ""  # failures with different signatures are different failures ("" matches any)


Check = Callable[[onnx.ModelProto, list[Feeds], Path], "Failure | None"]


class Values:
    """What the whole FP32 model computes for any of its tensors on the samples (ONNX Runtime, every node output
    exposed; fetched per request and kept, so memory holds only tensors some subgraph was fed or checked with)."""

    def __init__(self, model: onnx.ModelProto, feeds: list[Feeds], work: Path):
        exposed = onnx.ModelProto()
        exposed.CopyFrom(model)
        have = {o.name for o in model.graph.output}
        self.produced = [t for n in model.graph.node for t in n.output if t]
        exposed.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in self.produced if t not in have)
        path = work / "reduce_exposed.onnx"
        model_io.save(exposed, path)
        self.sess = session(path)
        self.feeds = feeds
        self.cache: list[dict[str, np.ndarray]] = [dict(f) for f in feeds]
        # dtype and shape of every tensor (a dimension that differs between samples stays symbolic)
        self.info: dict[str, tuple[np.dtype, list[int | None]]] = {}
        for feed in feeds:
            for name, value in zip(self.produced, self.sess.run(self.produced, feed)):
                self._note(name, value)
            for name, value in feed.items():
                self._note(name, value)

    def _note(self, name: str, value: np.ndarray) -> None:
        value = np.asarray(value)
        old = self.info.get(name)
        shape: list[int | None] = list(value.shape)
        if old is not None:
            shape = [a if a == b else None for a, b in zip(old[1], shape)] if len(old[1]) == len(shape) else shape
        self.info[name] = (value.dtype, shape)

    def get(self, names: list[str]) -> list[Feeds]:
        missing = [n for n in names if n not in self.cache[0]]
        if missing:
            for cache, feed in zip(self.cache, self.feeds):
                cache.update(zip(missing, self.sess.run(missing, feed)))
        return [{n: c[n] for n in names} for c in self.cache]

    def value_info(self, name: str) -> onnx.ValueInfoProto:
        dtype, shape = self.info[name]
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype),
                                             [d if d is not None else f"{name}_dim{i}" for i, d in enumerate(shape)])


class Graph:
    """The model's nodes in topological order, and subgraphs of it cut by tensor names."""

    def __init__(self, model: onnx.ModelProto, values: Values):
        self.model, self.values = model, values
        self.nodes = list(model.graph.node)
        self.producer = {t: i for i, n in enumerate(self.nodes) for t in n.output if t}
        self.inits = {i.name for i in model.graph.initializer}
        self.consumers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for t in n.input:
                self.consumers.setdefault(t, []).append(i)
        self.outputs = [o.name for o in model.graph.output]
        typed = onnx.ModelProto()
        typed.CopyFrom(model)
        del typed.graph.value_info[:]
        typed.graph.value_info.extend(values.value_info(t) for t in values.produced if t in values.info)
        for vi in list(typed.graph.input) + list(typed.graph.output):
            if vi.name in values.info:
                vi.CopyFrom(values.value_info(vi.name))
        self.extractor = onnx.utils.Extractor(typed)

    def cone(self, outputs: list[str], cuts: set[str]) -> tuple[list[int], list[str]]:
        """The nodes (topological order) computing `outputs` when the tensors in `cuts` and the model's inputs
        are given, and the inputs that subgraph reads."""
        nodes: set[int] = set()
        inputs: list[str] = []
        todo = list(outputs)
        seen: set[str] = set()
        while todo:
            t = todo.pop()
            if t in seen or not t or t in self.inits:
                continue
            seen.add(t)
            if t in cuts or t not in self.producer:
                inputs.append(t)
                continue
            i = self.producer[t]
            if i not in nodes:
                nodes.add(i)
                todo += list(self.nodes[i].input)
        return sorted(nodes), sorted(inputs)

    def prefix_outputs(self, k: int) -> list[str]:
        """What nodes[0..k] hand on: their outputs read by a later node or by the model's outputs."""
        last = set(self.outputs)
        return [t for i in range(k + 1) for t in self.nodes[i].output
                if t and (t in last or any(c > k for c in self.consumers.get(t, [])))]

    def extract(self, inputs: list[str], outputs: list[str]) -> onnx.ModelProto:
        sub = self.extractor.extract_model(inputs, outputs)
        constants_to_initializers(sub)
        sub.graph.name = "reduced"
        return sub


@dataclass
class Result:
    model: onnx.ModelProto
    failure: Failure
    nodes_before: int
    steps: list[dict[str, Any]] = field(default_factory=list)
    checks: int = 0
    seconds: float = 0.0

    @property
    def nodes(self) -> list[str]:
        return [f"{n.op_type} '{n.name}'" for n in self.model.graph.node]


class _Search:
    """The check over subgraphs of `g`, each cut checked once: a failure counts only where it is the original's."""

    def __init__(self, g: Graph, values: Values, check: Check, work: Path) -> None:
        self.g, self.values, self.check, self.work = g, values, check, work
        self.checks = 0
        self.memo: dict[tuple[tuple[str, ...], tuple[str, ...]], Failure | None] = {}
        self.original: Failure | None = None

    def fails(self, inputs: list[str], outputs: list[str]) -> Failure | None:
        key = (tuple(inputs), tuple(sorted(outputs)))
        if key not in self.memo:
            self.checks += 1
            sub = self.g.extract(inputs, outputs)
            try:
                found = self.check(sub, self.values.get(inputs), self.work)
            except Exception as exc:  # noqa: BLE001 - a subgraph the runtime cannot even load is not this failure
                found = None if self.original is not None else Failure(f"the check itself failed: {first_line(exc)}")
            original = self.original
            same = found is not None and (original is None or not original.signature
                                          or found.signature == original.signature)
            self.memo[key] = found if same else None
        return self.memo[key]


def reduce(model: onnx.ModelProto, check: Check, feeds: list[Feeds], work: Path,
           progress: Callable[[str], None] = lambda _: None) -> Result:
    t0 = time.perf_counter()
    values = Values(model, feeds, work)
    g = Graph(model, values)
    search = _Search(g, values, check, work)
    graph_inputs = sorted({i.name for i in model.graph.input} - g.inits)
    original = search.original = search.fails(graph_inputs, g.outputs)
    if original is None:
        raise TrtflowError("reduce: the whole model passes this check: nothing to reduce (use more --samples, "
                           "other --shapes or another --check?)")
    progress(f"the whole model fails: {original.message}")
    steps = [{"step": "whole model", "nodes": len(g.nodes), "failure": original.message}]
    end, hi, outputs, cone = _first_failing_node(search)
    progress(f"outputs: first failing at {end.op_type} '{end.name}' (node {hi + 1} of {len(g.nodes)})")
    steps.append({"step": "outputs", "node": end.name, "nodes": len(cone), "checks": search.checks})
    ins, cuts, nodes = _smallest_suffix(search, cone, outputs)
    progress(f"inputs: {len(nodes)} nodes left")
    steps.append({"step": "inputs", "nodes": len(nodes), "checks": search.checks})
    ins, nodes = _cut_each(search, nodes, cuts, ins, outputs)
    progress(f"linear pass: {len(nodes)} nodes left")
    steps.append({"step": "linear", "nodes": len(nodes), "checks": search.checks})

    final = search.fails(ins, outputs)
    assert final is not None  # every accepted step was checked to fail
    reduced = g.extract(ins, outputs)
    return Result(reduced, final, len(g.nodes), steps, search.checks, round(time.perf_counter() - t0, 2))


def _first_failing_node(search: _Search) -> tuple[onnx.NodeProto, int, list[str], list[int]]:
    """1. The first node at which a prefix of the graph fails (bisected): it, its index, the outputs that fail
    there (its own, or all the prefix hands on where the failure shows only in those) and their cone."""
    g = search.g
    lo, hi = -1, len(g.nodes) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        _, ins = g.cone(g.prefix_outputs(mid), set())
        if search.fails(ins, g.prefix_outputs(mid)):
            hi = mid
        else:
            lo = mid
    end = g.nodes[hi]
    outputs = [t for t in end.output if t]
    cone, ins = g.cone(outputs, set())
    if not search.fails(ins, outputs):  # the failure shows in what the prefix hands on, not in this node alone
        outputs = g.prefix_outputs(hi)
        cone, ins = g.cone(outputs, set())
    return end, hi, outputs, cone


def _smallest_suffix(search: _Search, cone: list[int], outputs: list[str]) -> tuple[list[str], set[str], list[int]]:
    """2. The smallest failing suffix of that cone (bisected): its inputs, the tensors cut and its nodes."""
    g = search.g

    def suffix(j: int) -> tuple[list[str], set[str]]:
        keep = set(cone[j:])
        cuts = {t for i in cone[j:] for t in g.nodes[i].input if t in g.producer and g.producer[t] not in keep}
        return g.cone(outputs, cuts)[1], cuts

    lo, hi = 0, len(cone) - 1
    if search.fails(suffix(hi)[0], outputs):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if search.fails(suffix(mid)[0], outputs):
            lo = mid
        else:
            hi = mid
    ins, cuts = suffix(lo)
    nodes, _ = g.cone(outputs, cuts)
    return ins, cuts, nodes


def _cut_each(search: _Search, nodes: list[int], cuts: set[str], ins: list[str],
              outputs: list[str]) -> tuple[list[str], list[int]]:
    """3. Each remaining node cut (the outputs' producers last) while the rest still fails: inputs and nodes."""
    g = search.g
    for i in sorted(nodes, reverse=True):
        if any(t in outputs for t in g.nodes[i].output):
            continue
        trial = cuts | {t for t in g.nodes[i].output if t}
        trial_nodes, trial_ins = g.cone(outputs, trial)
        if i in trial_nodes or set(trial_nodes) == set(nodes):
            continue
        if search.fails(trial_ins, outputs):
            cuts, nodes, ins = trial, trial_nodes, trial_ins
    return ins, nodes


def sample_feeds(model: onnx.ModelProto, path: Path, data: Path | None, shapes: dict[str, list[int]], samples: int,
                 seed: int) -> list[Feeds]:
    """The samples to reduce on: `data` (.npz by input name, or .npy for a one-input model; an extra leading axis
    holds several samples), else seeded random values (integer inputs indexing a table stay within it)."""
    from trtflow.stages.onnx.graph import index_bounds
    from trtflow.stages.ort.runner import fit_to_input, random_input, session_shapes

    inputs = session(path).get_inputs()
    for name in shapes:
        if name not in {i.name for i in inputs}:
            raise TrtflowError(f"reduce: --shapes: {path} has no input '{name}' (inputs: "
                               f"{', '.join(i.name for i in inputs)})")
    if data is None:
        rng = np.random.default_rng(seed)
        bounds = index_bounds(model)
        shapes = session_shapes(inputs, shapes)
        return [{i.name: random_input(i, shapes, rng, bounds.get(i.name)) for i in inputs} for _ in range(samples)]
    try:
        loaded = np.load(data)
        arrays = dict(loaded) if isinstance(loaded, np.lib.npyio.NpzFile) else {inputs[0].name: loaded}
    except (OSError, ValueError) as exc:
        raise TrtflowError(f"reduce: --data {data}: not a readable .npz/.npy file ({first_line(exc)})") from None
    per_input = {}
    for i in inputs:
        if i.name not in arrays:
            raise TrtflowError(f"reduce: --data {data} has no array '{i.name}' (has: {', '.join(arrays) or 'none'})")
        x = arrays[i.name]
        fitted = [fit_to_input(v, i) for v in (list(x) if x.ndim == len(i.shape) + 1 else [x])[:samples]]
        if not fitted or any(v is None for v in fitted):
            raise TrtflowError(f"reduce: --data {data}: '{i.name}' has shape {list(x.shape)}, which does not fit "
                               f"the input's {list(i.shape)}")
        per_input[i.name] = fitted
    count = min(len(v) for v in per_input.values())
    return [{name: v[k] for name, v in per_input.items()} for k in range(count)]


# --- checks ------------------------------------------------------------------------------------------------------

def _mismatch(reference: onnx.ModelProto, candidate: onnx.ModelProto, feeds: list[Feeds], work: Path,
              bound: float) -> Failure | None:
    """Any float output whose cosine over the samples is below `bound`, or non-finite where the reference is not."""
    model_io.save(reference, work / "reduce_ref.onnx")
    model_io.save(candidate, work / "reduce_cand.onnx")
    ref, cand = session(work / "reduce_ref.onnx"), session(work / "reduce_cand.onnx")
    names = [o.name for o in reference.graph.output]
    cmp = Comparison()  # validate's comparator, so a subgraph fails here as the whole model fails there
    for feed in feeds:
        feed = {k: v for k, v in feed.items() if k in {i.name for i in ref.get_inputs()}}
        outs = [(n, r, c) for n, r, c in zip(names, ref.run(names, feed), cand.run(names, feed))
                if np.issubdtype(np.asarray(r).dtype, np.floating)]
        cmp.add({n: r for n, r, _ in outs}, {n: c for n, _, c in outs})
    found = cmp.result(RUNTIME)
    for n, m in found.outputs.items():
        added = m.added_nonfinite()
        if added > 0:
            found.violations.append(f"output '{n}': {added} non-finite values where the FP32 model's are finite")
        elif m.cosine < bound:
            found.violations.append(f"output '{n}': cosine {m.cosine:.6f} < {bound}")
    return None if found else Failure(found.violations[0], "mismatch")


def fp16_check(bound: float) -> Check:
    """The subgraph in FP16 (the precision stage's conversion, no automatic fallback, simulated per node on ONNX
    Runtime) against itself in FP32."""
    from trtflow.stages.onnx import fp16
    from trtflow.stages.onnx.fp16_emulation import emulate

    def check(sub: onnx.ModelProto, feeds: list[Feeds], work: Path) -> Failure | None:
        plan = fp16.plan(sub, {}, set())
        return _mismatch(sub, emulate(sub, plan.half, True), feeds, work, bound)
    return check


def int8_check(bound: float, variant: onnx.ModelProto | None, quantize_ops: list[str] | None = None) -> Check:
    """The subgraph quantized (Q/DQ, fake quantization on ONNX Runtime) at the ranges of `variant` — a Q/DQ model
    of the same FP32 model, e.g. the calibrate stage's — and at MinMax of the samples for tensors it has no range
    for, against itself in FP32. Only the node types (and nodes) `variant` quantized are quantized; a variant with
    an FP16 remainder gives the subgraph one (emulated per node)."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorData, TensorsData

    from trtflow.stages.onnx.fp16_emulation import emulated
    from trtflow.stages.ort import fp16_remainder, qdq

    how = qdq.recipe(variant) if variant is not None else None
    given = how.tensors.data if how else {}
    ops = how.quantize_ops if how else (quantize_ops or ["Conv", "ConvTranspose", "Gemm", "MatMul"])
    per_channel = how.per_channel if how else True

    def check(sub: onnx.ModelProto, feeds: list[Feeds], work: Path) -> Failure | None:
        tensors = {t for n in sub.graph.node for t in list(n.input) + list(n.output)}
        ref_path = work / "reduce_int8_ref.onnx"
        exposed = onnx.ModelProto()
        exposed.CopyFrom(sub)
        inits = {i.name for i in sub.graph.initializer}
        internal = sorted({t for n in sub.graph.node for t in n.output if t} - {o.name for o in sub.graph.output})
        exposed.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in internal)
        model_io.save(exposed, ref_path)
        sess = session(ref_path)
        names = [o.name for o in sess.get_outputs()]
        peak: dict[str, float] = {}
        for feed in feeds:
            for n, v in list(zip(names, sess.run(names, feed))) + list(feed.items()):
                v = np.asarray(v)
                if np.issubdtype(v.dtype, np.floating) and v.size:
                    peak[n] = max(peak.get(n, 0.0), float(np.abs(v[np.isfinite(v)]).max(initial=0.0)))
        data = {t: TensorData(lowest=np.array(-m, np.float32), highest=np.array(m, np.float32))
                for t, m in peak.items() if t not in inits}
        data.update({t: r for t, r in given.items() if t in tensors})
        skipped = {n.name for n in sub.graph.node if how and n.name in how.excluded}
        pre, out = work / "reduce_int8_in.onnx", work / "reduce_int8.onnx"
        model_io.save(sub, pre)
        qdq.write(pre, out, work / "reduce_ranges.json", TensorsData(CalibrationMethod.MinMax, data), per_channel,
                  ops, skipped)
        quantized = model_io.load(out)
        if how and how.fp16_remainder is not None:  # the variant's remainder is FP16: so is the subgraph's
            quantized = emulated(fp16_remainder.convert(quantized, how.fp16_remainder, None, work)[0])
        return _mismatch(sub, quantized, feeds, work, bound)
    return check


def _masked(error: str) -> str:
    """An error message with its numbers and quoted names masked: the same failure at other shapes or nodes."""
    return re.sub(r"\d+", "#", re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", error))[:200]


def tensorrt_check(build: bool) -> Check:
    """The installed TensorRT flavour's parser (and, with `build`, a build at the subgraph's real input shapes)
    rejects the subgraph. Parse failures match by the rejected op types, build failures by the error's text."""
    from trtflow.stages.trt.preflight import run_preflight

    def check(sub: onnx.ModelProto, feeds: list[Feeds], work: Path) -> Failure | None:
        path = work / "reduce_trt.onnx"
        model_io.save(sub, path)
        shapes = {k: list(np.asarray(v).shape) for k, v in feeds[0].items()} if build else None
        report = run_preflight(path, shapes)
        if not report.ran:
            raise TrtflowError(f"reduce: {report.reason}")
        if not report.parsed or report.failures:
            ops = sorted({f.op_type or "?" for f in report.failures})
            said = report.failures[0].reason if report.failures else ""
            reason = first_line(said or (report.log or ["the parser failed"])[-1])
            return Failure(f"{report.runtime} rejects {', '.join(ops)}: {reason}", "parse:" + ",".join(ops))
        trial = report.failed_build()
        if build and trial is not None:
            if trial.needs_gpu:
                raise TrtflowError("reduce: this TensorRT needs a GPU to build; --check parse works without one")
            error = trial.error or ""
            return Failure(f"{report.runtime} build fails: {first_line(error)}", "build:" + _masked(error))
        return None
    return check


def command_check(command: str, timeout: float) -> Check:
    """A user's command fails (non-zero exit) on the subgraph: `{model}` in it is replaced by the subgraph's
    path (appended when absent); the inputs' real values are saved beside it as `{inputs}` (.npz)."""
    def check(sub: onnx.ModelProto, feeds: list[Feeds], work: Path) -> Failure | None:
        path, inputs = work / "reduce_candidate.onnx", work / "reduce_inputs.npz"
        model_io.save(sub, path)
        np.savez(inputs, **feeds[0])
        argv = [a.replace("{model}", str(path)).replace("{inputs}", str(inputs)) for a in shlex.split(command)]
        if "{model}" not in command:
            argv.append(str(path))
        try:
            ended = child.run(argv, timeout, cwd=work, what="reduce: the --command")
        except OSError as exc:
            raise TrtflowError(f"reduce: --command: cannot run {argv[0]!r}: {exc.strerror}") from None
        if isinstance(ended, child.TimedOut):
            return Failure(f"the command did not finish within {timeout:g} s", "timeout")
        if ended.returncode == 0:
            return None
        return Failure(f"the command {ended.text()}", f"exit:{ended.returncode}")
    return check
