"""Where a variant first drifts from the reference: every intermediate tensor of both, on the same inputs, compared
in the reference's topological order (Polygraphy's "compare layerwise", on ONNX Runtime). What it finds, `Layerwise`
(a `LayerRow` per tensor), is a record of `compare/records.py`.

One sample at a time, and a batched sample one item at a time (where every input's first dimension is dynamic: the
statistics are sums, the same either way), and only per-tensor statistics are kept, so memory grows neither with
the number of samples nor with the batch (every intermediate tensor of PP-OCRv4's recognizer at batch 32, 48 x 640
is 26 GB).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import onnx
from onnx import helper

from trtflow.stages.compare.records import LayerRow, Layerwise
from trtflow.stages.compare.tensor_stats import TensorStats
from trtflow.stages.onnx import model_io
from trtflow.stages.onnx.graph import subgraphs
from trtflow.stages.ort import memory
from trtflow.stages.ort.ranges import expose_all, float_outputs
from trtflow.stages.ort.runner import session

CANDIDATE = "candidate::"


def _paired(reference: onnx.ModelProto, candidate: onnx.ModelProto, names: list[str], work: Path,
            tensors: tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]],
            ) -> Callable[[dict[str, np.ndarray]], tuple[list[np.ndarray], list[np.ndarray]]]:
    """feed -> (reference's values, candidate's values) of `names`. Both models in one ONNX Runtime session where
    they read the same inputs under the same opsets (the candidate's names prefixed): one run; otherwise each
    model with its float tensors (`tensors`) exposed, run one after the other."""
    same_inputs = [(i.name, i.type) for i in reference.graph.input] == [(i.name, i.type) for i in candidate.graph.input]
    same_opsets = {(o.domain, o.version) for o in reference.opset_import} == \
        {(o.domain, o.version) for o in candidate.opset_import}
    if not (same_inputs and same_opsets):
        expose_all(reference, work / "layerwise_ref.onnx", tensors[0])
        expose_all(candidate, work / "layerwise_cand.onnx", tensors[1])
        ref, cand = session(work / "layerwise_ref.onnx"), session(work / "layerwise_cand.onnx")
        return lambda feed: (_run(ref, names, feed), _run(cand, names, feed))
    inputs = {i.name for i in candidate.graph.input}

    def renamed(t: str) -> str:
        return t if not t or t in inputs else CANDIDATE + t

    pair = onnx.ModelProto()
    pair.CopyFrom(reference)
    cand = onnx.ModelProto()
    cand.CopyFrom(candidate)
    for node in cand.graph.node:
        node.name = CANDIDATE + node.name
        node.input[:] = [renamed(t) for t in node.input]
        node.output[:] = [renamed(t) for t in node.output]
        for graph in subgraphs(node):
            _rename_outer_refs(graph, renamed)
    for init in cand.graph.initializer:
        init.name = renamed(init.name)
    pair.graph.node.extend(cand.graph.node)
    pair.graph.initializer.extend(cand.graph.initializer)
    del pair.graph.value_info[:]
    del pair.graph.output[:]
    pair.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in names + [renamed(t) for t in names])
    path = work / "layerwise_pair.onnx"
    model_io.save(pair, path)
    sess = session(path)
    fetch = names + [renamed(t) for t in names]

    def run(feed: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        values = _run(sess, fetch, feed)
        return values[:len(names)], values[len(names):]
    return run


def paired(reference: onnx.ModelProto, candidate: onnx.ModelProto, work: Path
           ) -> tuple[list[str], Callable[[dict[str, np.ndarray]], tuple[list[np.ndarray], list[np.ndarray]]]]:
    """The float tensors both models produce (in the reference's order), and feed -> (reference's values,
    candidate's values) of those."""
    ref_tensors, cand_tensors = float_outputs(reference), float_outputs(candidate)
    cand_names = {vi.name for vi in cand_tensors}
    common = [vi.name for vi in ref_tensors if vi.name in cand_names]
    return common, _paired(reference, candidate, common, work, (ref_tensors, cand_tensors))


def _batched(model: onnx.ModelProto) -> bool:
    """Every input's first dimension is dynamic (a symbol, or -1 as PaddlePaddle writes it): a batch of independent
    items."""
    weights = {t.name for t in model.graph.initializer}
    dims = [vi.type.tensor_type.shape.dim for vi in model.graph.input if vi.name not in weights]
    return bool(dims) and all(len(d) > 0 and not (d[0].HasField("dim_value") and d[0].dim_value > 0) for d in dims)


def _items(feed: dict[str, np.ndarray]) -> Iterable[dict[str, np.ndarray]]:
    """A batched feed's items, each a batch of one (the feed itself where its inputs' batches differ)."""
    sizes = {v.shape[0] if v.ndim else None for v in feed.values()}
    if len(sizes) != 1 or None in sizes:
        return (feed,)
    (n,) = sizes
    return ({k: v[i:i + 1] for k, v in feed.items()} for i in range(n))


def _run(sess: Any, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """`sess.run` without copying every output: OrtValue.numpy() is a view that keeps the tensor alive. One item
    whose every tensor does not fit the memory budget is refused naming its shape and the estimate (memory.py)."""
    from onnxruntime import OrtValue

    graph = memory.graph_of(sess)
    if graph is not None:
        memory.plan(graph, feed)

    values = sess.run_with_ort_values(names, {k: OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v))
                                              for k, v in feed.items()})
    return [v.numpy() for v in values]


def _rename_outer_refs(graph: onnx.GraphProto, renamed: Callable[[str], str]) -> None:
    """Inside an If/Loop body, names defined outside it (not by the body itself) follow the renaming."""
    local = {i.name for i in graph.input} | {i.name for i in graph.initializer} | \
        {t for n in graph.node for t in n.output}
    for node in graph.node:
        node.input[:] = [t if t in local else renamed(t) for t in node.input]
        for sub in subgraphs(node):
            _rename_outer_refs(sub, lambda t, local=local: t if t in local else renamed(t))


def compare(reference: onnx.ModelProto, candidate: onnx.ModelProto, feeds: Iterable[dict[str, np.ndarray]],
            work: Path, bound: float, qranges: dict[str, tuple[float, float]] | None = None,
            worst: int = 10) -> Layerwise:
    """Per tensor shared by both models (in the reference's order): cosine, RMS error relative to the
    reference's, non-finite values, FP16 overflow in the reference, and clipping by the candidate's
    quantized range. `first_bad` is the first node whose output's cosine falls below `bound` (or turns
    non-finite); `worst` ranks nodes by the drift they add over their inputs (the largest drift need not be the
    first past the bound). Values beyond FP16 that are a mask's or sentinel's constants are `sentinels`, apart
    from `overflow`."""
    common, run = paired(reference, candidate, work)
    qranges = qranges or {}
    stats = {n: TensorStats() for n in common}

    def accumulate(ref_values: list[np.ndarray], cand_values: list[np.ndarray]) -> None:
        for name, r, g in zip(common, ref_values, cand_values):
            stats[name].add(r, g, qranges.get(name))

    # the statistics of one sample are taken while ONNX Runtime runs the next (both release the GIL): at most
    # two samples' tensors are held at once
    samples = 0
    batched = _batched(reference)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for feed in feeds:
            for item in _items(feed) if batched else (feed,):
                values = run(item)
                if pending is not None:
                    pending.result()
                pending = pool.submit(accumulate, *values)
                del values
            samples += 1
        if pending is not None:
            pending.result()
    producer = {o: n for n in reference.graph.node for o in n.output}
    rows = []
    for name in common:
        s, node = stats[name], producer[name]
        before = max((stats[t].drift for t in node.input if t in stats), default=0.0)
        rows.append(LayerRow(node=node.name, op=node.op_type, tensor=name, cosine=s.cosine, rms_rel=s.rms_rel,
                             nonfinite=s.bad, reference_nonfinite=s.ref_bad, reference_max=s.ref_max, drift=s.drift,
                             added=max(0.0, s.drift - before), over_fp16=s.over_fp16, sentinel=s.sentinel,
                             **({"range": list(qranges[name]), "clipped": s.clipped / max(s.elements, 1),
                                 "range_use": s.ref_max / max(abs(qranges[name][0]), abs(qranges[name][1]), 1e-30)}
                                if name in qranges else {})))
    first = next((r for r in rows if r.nonfinite or r.cosine < bound), None)
    clipping = [r for r in rows if r.range is not None and (r.clipped > 1e-3 or r.range_use < 0.02)]
    return Layerwise(samples=samples, tensors=len(rows), bound=bound, first_bad=first,
                     first_nonfinite=next((r for r in rows if r.nonfinite), None),
                     worst=sorted(rows, key=lambda r: -r.added)[:worst],
                     overflow=[r for r in rows if r.over_fp16 and not r.sentinel][:worst],
                     sentinels=[r for r in rows if r.over_fp16 and r.sentinel][:worst],
                     clipping=sorted(clipping, key=lambda r: (-r.clipped, r.range_use))[:worst], rows=rows)
