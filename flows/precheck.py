"""What `validate` and `plan` can check beyond the YAML's shape, without running a stage: facts of the model a
stage will read, where that model is known beforehand. The pipeline's source model is; prepare, precision and
calibrate keep its input names, so a build fed through them sees the source's inputs."""
from __future__ import annotations

from pathlib import Path

from trtflow.pipelines.graph import SOURCE, StageGraph
from trtflow.pipelines.kinds import MODEL_MAKERS
from trtflow.pipelines.loader import LoadedPipeline
from trtflow.text import suggestion


def check(loaded: LoadedPipeline, graph: StageGraph) -> None:
    """Raise the SpecError of the first profile that names an input the model does not have."""
    names: list[str] | None = None
    for node in graph.nodes.values():
        profiles = getattr(node.spec, "profiles", None) if node.spec.kind == "build" else None
        if not profiles or not all(_keeps_source_inputs(graph, e.stage) for e in node.inputs.get("models", [])):
            continue
        if names is None:
            names = _input_names(loaded.model_path)
            if names is None:  # not readable as ONNX: the prepare stage says so, with its own message
                return
        for pname, shapes in profiles.items():
            for input_name in shapes:
                if input_name not in names:
                    raise loaded.error(
                        f"model '{loaded.spec.model}' has no input '{input_name}'",
                        ("stages", node.name, "profiles", pname, input_name),
                        hint=suggestion(input_name, names) or f"its inputs: {', '.join(names)}")


def _keeps_source_inputs(graph: StageGraph, stage: str) -> bool:
    if stage == SOURCE:
        return True
    node = graph.nodes[stage]
    return node.spec.kind in MODEL_MAKERS and all(_keeps_source_inputs(graph, e.stage)
                                                  for e in node.inputs.get("model", []))


def _input_names(path: Path) -> list[str] | None:
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - any unreadable model: the stage that reads it reports
        return None
    weights = {t.name for t in graph.initializer}
    return [i.name for i in graph.input if i.name not in weights]
