"""The stage graph: what each stage consumes, resolved and checked (missing references, cycles, types).

Each stage kind declares its input slots and its outputs (`kinds.py`). An omitted slot gets a default: the
nearest earlier stage (in file order) of the kinds the slot prefers, or the pipeline's model (`source`) for an
ONNX slot.
"""
from __future__ import annotations

import graphlib
from dataclasses import dataclass

from trtflow.pipelines.kinds import USER, kind_of
from trtflow.pipelines.loader import LoadedPipeline
from trtflow.pipelines.row import ANY_KIND, Slot
from trtflow.pipelines.schema import StageBase
from trtflow.text import suggestion

SOURCE = "source"  # the pipeline's `model:` file, as an artifact


@dataclass(frozen=True)
class Edge:
    slot: str
    stage: str  # producing stage, or SOURCE
    output: str  # output name ("model" for SOURCE)
    type: str


@dataclass
class StageNode:
    name: str
    spec: StageBase
    inputs: dict[str, list[Edge]]  # slot -> edges (one unless the slot takes many)
    many: dict[str, bool]

    @property
    def upstream(self) -> set[str]:
        return {e.stage for edges in self.inputs.values() for e in edges if e.stage != SOURCE}


@dataclass
class StageGraph:
    nodes: dict[str, StageNode]
    order: list[str]  # topological, file order where free

    def closure(self, names: list[str]) -> list[str]:
        """`names` and everything they depend on, in run order."""
        want: set[str] = set()
        todo = list(names)
        while todo:
            n = todo.pop()
            if n not in want:
                want.add(n)
                todo += self.nodes[n].upstream
        return [n for n in self.order if n in want]

    def downstream(self, name: str) -> list[str]:
        out = {name}
        for n in self.order:
            if self.nodes[n].upstream & out:
                out.add(n)
        return [n for n in self.order if n in out]


def build_graph(p: LoadedPipeline) -> StageGraph:
    stages = p.spec.stages
    names = list(stages)
    nodes = {name: _node(p, names, idx) for idx, name in enumerate(names)}
    graph = StageGraph(nodes, _order(p, nodes, names))
    for name in graph.order:
        spec = stages[name]
        upstream = {n: stages[n] for n in graph.closure([name]) if n != name}
        wrong = kind_of(spec).wiring(spec, upstream)
        if wrong is not None:
            message, key, hint = wrong
            raise p.error(message, ("stages", name) + key, hint=hint)
    return graph


def _node(p: LoadedPipeline, names: list[str], idx: int) -> StageNode:
    """Stage `names[idx]` with its inputs: those its `inputs:` names, then each slot's default from the stages
    before it."""
    stages, name = p.spec.stages, names[idx]
    spec = stages[name]
    kind = kind_of(spec)
    slots = kind.slots_for(spec)
    inputs: dict[str, list[Edge]] = {}
    many: dict[str, bool] = {}
    base = ("stages", name, "inputs")
    for slot_name, given in spec.inputs.items():
        if kind is not USER and slot_name not in slots:
            raise p.error(f"stage kind '{spec.kind}' has no input '{slot_name}'", base + (slot_name,),
                          hint=suggestion(slot_name, list(slots)) or f"inputs: {', '.join(slots)}")
        slot = slots.get(slot_name)
        refs = given if isinstance(given, list) else [given]
        if slot is not None and not slot.many and len(refs) != 1:
            raise p.error(f"input '{slot_name}' takes one reference, got {len(refs)}", base + (slot_name,))
        inputs[slot_name] = [_resolve(p, names, name, slot_name, ref, slot, base + (slot_name,)) for ref in refs]
        many[slot_name] = isinstance(given, list)
    for slot_name, slot in slots.items():
        if slot_name in inputs:
            continue
        edges = [Edge(slot_name, e.stage, e.output, e.type) for e in _default(stages, names[:idx], slot)]
        if edges:
            inputs[slot_name] = edges
            many[slot_name] = slot.many
        elif slot.required:
            raise p.error(f"no earlier stage produces the '{slot.type}' this {spec.kind} stage needs",
                          ("stages", name), hint=f"add a stage that produces it, or set inputs.{slot_name}")
    return StageNode(name, spec, inputs, many)


def _order(p: LoadedPipeline, nodes: dict[str, StageNode], names: list[str]) -> list[str]:
    """The stages in an order that runs every stage after its inputs, the file's order where it is free."""
    sorter = graphlib.TopologicalSorter({n: nodes[n].upstream for n in names})
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        cycle = exc.args[1]
        raise p.error(f"the stages form a cycle: {' -> '.join(cycle)}", ("stages", cycle[0], "inputs"),
                      hint="a stage cannot consume its own output, directly or through others") from None
    order: list[str] = []
    position = {n: i for i, n in enumerate(names)}
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=position.__getitem__)
        order += ready
        sorter.done(*ready)
    return order


def _resolve(p: LoadedPipeline, names: list[str], me: str, slot_name: str, ref: str, slot: Slot | None,
             path: tuple) -> Edge:
    stage_name, _, output = ref.partition(".")
    if stage_name == SOURCE:
        if slot is not None and slot.type != "onnx":
            raise p.error(f"'source' is an ONNX model, but input '{slot_name}' needs '{slot.type}'", path)
        return Edge(slot_name, SOURCE, "model", "onnx")
    if stage_name == me:
        raise p.error(f"stage '{me}' cannot consume its own output", path)
    if stage_name not in p.spec.stages:
        raise p.error(f"reference to a stage that does not exist: '{stage_name}'", path,
                      hint=suggestion(stage_name, names + [SOURCE]) or f"stages: {', '.join(names)}")
    outs = outputs_of(p.spec.stages[stage_name])
    _report_kind(p, stage_name, slot_name, slot, path)
    if output:
        if output not in outs:
            raise p.error(f"stage '{stage_name}' has no output '{output}'", path,
                          hint=f"outputs: {', '.join(outs) or 'none'}")
        if slot is not None and outs[output] != slot.type:
            raise p.error(f"'{ref}' is of type '{outs[output]}', but input '{slot_name}' needs '{slot.type}'", path)
        return Edge(slot_name, stage_name, output, outs[output])
    if slot is None:  # a custom stage's input: take the single output, or the model
        if len(outs) == 1:
            (output, typ), = outs.items()
            return Edge(slot_name, stage_name, output, typ)
        if "model" in outs:
            return Edge(slot_name, stage_name, "model", outs["model"])
        raise p.error(f"stage '{stage_name}' has several outputs; name one as '{stage_name}.<output>'", path,
                      hint=f"outputs: {', '.join(outs)}")
    matching = [o for o, t in outs.items() if t == slot.type]
    if not matching:
        kind = p.spec.stages[stage_name].kind
        raise p.error(f"stage '{stage_name}' ({kind}) produces no '{slot.type}' for input '{slot_name}'", path,
                      hint=f"it produces: {', '.join(f'{o} ({t})' for o, t in outs.items())}")
    return Edge(slot_name, stage_name, matching[0], slot.type)


def _report_kind(p: LoadedPipeline, stage_name: str, slot_name: str, slot: Slot | None, path: tuple) -> None:
    """A report slot takes the report of the kinds it names: every kind's report is JSON, so the type alone would
    let a benchmark's report stand for a validation (and fail only when the stage reads it). A custom stage's
    JSON is the user's to shape."""
    if slot is None or slot.type != "json" or not slot.prefer or ANY_KIND in slot.prefer:
        return
    spec = p.spec.stages[stage_name]
    if kind_of(spec) is USER or spec.kind in slot.prefer:
        return
    wanted = " or ".join(f"a {k} stage's" for k in slot.prefer)
    raise p.error(f"'{stage_name}' is a {spec.kind} stage: input '{slot_name}' takes {wanted} report", path,
                  hint=f"name a {' or '.join(slot.prefer)} stage there, or leave '{slot_name}' out for the nearest one")


def _default(stages: dict[str, StageBase], earlier: list[str], slot: Slot) -> list[Edge]:
    found: list[Edge] = []
    for name in reversed(earlier):
        spec = stages[name]
        if spec.kind in slot.prefer or ANY_KIND in slot.prefer:
            out = next((o for o, t in outputs_of(spec).items() if t == slot.type), None)
            if out:
                found.append(Edge("", name, out, slot.type))
                if not slot.many:
                    break
    if not found and slot.source_ok:
        found.append(Edge("", SOURCE, "model", "onnx"))
    found.reverse()
    return found


def outputs_of(spec: StageBase) -> dict[str, str]:
    """Output name -> artifact type, as the stage's kind (or, for a user's stage, its declaration) says."""
    return kind_of(spec).outputs_for(spec)
