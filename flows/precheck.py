"""What `validate` and `plan` can check beyond the YAML's shape, without running a stage: facts of the model a
stage will read, where that model is known beforehand. The pipeline's source model is; kinds whose row says
`keeps_input_names` (prepare, precision, calibrate) keep its input names, so a build fed through them sees them."""
from __future__ import annotations

from pathlib import Path

from trtflow.pipelines.graph import SOURCE, StageGraph, StageNode
from trtflow.pipelines.kinds import kind_of
from trtflow.pipelines.loader import LoadedPipeline
from trtflow.text import suggestion


def check(loaded: LoadedPipeline, graph: StageGraph) -> None:
    """Raise the SpecError of the first parameter that names an input the model does not have."""
    names: list[str] | None = None
    for node in graph.nodes.values():
        named = node.spec.named_model_inputs()
        if not named or not all(_keeps_source_inputs(graph, e.stage) for e in _model_edges(node)):
            continue
        if names is None:
            names = _input_names(loaded.model_path)
            if names is None:  # not readable as ONNX: the prepare stage says so, with its own message
                return
        for input_name, path in named:
            if input_name not in names:
                raise loaded.error(f"model '{loaded.spec.model}' has no input '{input_name}'",
                                   ("stages", node.name, *path),
                                   hint=suggestion(input_name, names) or f"its inputs: {', '.join(names)}")


def _model_edges(node: StageNode) -> list:
    slots = kind_of(node.spec).slots_for(node.spec)
    return [e for slot, edges in node.inputs.items() if slot in slots and slots[slot].type == "onnx" for e in edges]


def _keeps_source_inputs(graph: StageGraph, stage: str) -> bool:
    if stage == SOURCE:
        return True
    node = graph.nodes[stage]
    return kind_of(node.spec).keeps_input_names and all(_keeps_source_inputs(graph, e.stage)
                                                        for e in _model_edges(node))


def _input_names(path: Path) -> list[str] | None:
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - any unreadable model: the stage that reads it reports
        return None
    weights = {t.name for t in graph.initializer}
    return [i.name for i in graph.input if i.name not in weights]
