"""One rule applied to one node of a model: the model in, a new model out (nothing checked here: see rule.py)."""
from __future__ import annotations

import contextlib

import onnx
import onnx_graphsurgeon as gs

from trtflow.stages.onnx.rewrites.rule import Rewrite


class Refused(Exception):
    """The rule does not apply to the node: why, one line."""


def apply(model: onnx.ModelProto, node_name: str, rule: Rewrite) -> onnx.ModelProto:
    """`model` with node `node_name` replaced by `rule` (shapes inferred first: most rules need them static). Raises
    Refused where the rule does not apply, KeyError where no node has that name."""
    with contextlib.suppress(Exception):  # a rule that needs shapes says so through `refuses`
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    graph = gs.import_onnx(model)
    node = next((n for n in graph.nodes if n.name == node_name), None)
    if node is None:
        raise KeyError(node_name)
    why = rule.refuses(node, graph)
    if why is not None:
        raise Refused(why)
    rule.replace(node, graph)
    graph.cleanup().toposort()
    out = gs.export_onnx(graph, do_type_check=False)
    out.ir_version = model.ir_version
    del out.opset_import[:]
    out.opset_import.extend(model.opset_import)
    for p in model.metadata_props:
        out.metadata_props.add(key=p.key, value=p.value)
    return out
