"""Names that come from a pipeline file, a model or a store never become a path outside, code or markup: the names
that become directories are checked where they enter (one rule, `trtflow.names`), with the key path; generated code
carries no value formatted into it."""
from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.assets import SQUEEZENET
from tests.triton_server import stub_backend_utils
from trtflow.errors import SpecError
from trtflow.pipelines.loader import load_pipeline

BASE = """version: 1
name: {name}
model: m.onnx
stages:
  prepare: {{kind: prepare}}
  build:
    kind: build
    targets: {targets}
    profiles:
      p: {{input: {{min: [1, 3, 224, 224], opt: [1, 3, 224, 224], max: [1, 3, 224, 224]}}}}
      {profile!r}: {{input: {{min: [1, 3, 224, 224], opt: [1, 3, 224, 224], max: [1, 3, 224, 224]}}}}
  release: {{kind: release, select: {{require: built, prefer: size}}, triton: {triton}}}
"""
GOOD = {"name": "t", "targets": "[native]", "profile": "q", "triton": "{}"}


def refusal(tmp_path: Path, **edit: str) -> str:
    (tmp_path / "m.onnx").write_bytes(SQUEEZENET.read_bytes())
    (tmp_path / "p.yaml").write_text(BASE.format(**{**GOOD, **edit}))
    with pytest.raises(SpecError) as err:
        load_pipeline(tmp_path / "p.yaml")
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_well_named_pipeline_loads(tmp_path):
    (tmp_path / "m.onnx").write_bytes(SQUEEZENET.read_bytes())
    (tmp_path / "p.yaml").write_text(BASE.format(**GOOD))
    assert load_pipeline(tmp_path / "p.yaml").spec.stages["build"].profiles.keys() == {"p", "q"}


@pytest.mark.parametrize("edit, where", [
    # the case: with profile 'p', this cell's directory was p.native/../../../../../ESCAPED.native
    ({"profile": "p.native/../../../../../ESCAPED"}, "p.yaml:11: stages.build.profiles.p.native/../../../../../"
                                                     "ESCAPED: 'p.native/../../../../../ESCAPED' is not a name"),
    ({"profile": "a.b"}, "stages.build.profiles.a.b: 'a.b' is not a name"),  # a cell would read as two names
    ({"profile": "-rf"}, "stages.build.profiles.-rf: '-rf' is not a name"),
    ({"profile": "x" * 65}, "is 65 characters long: at most 64"),
    ({"targets": "[native, ../../x]"}, "stages.build.targets[1]: '../../x' is not a name"),
    ({"targets": "['sm86/..']"}, "stages.build.targets[0]: 'sm86/..' is not a name"),
    ({"name": "a" * 101}, "p.yaml:2: name: 'aaaa"),
    ({"name": "'..'"}, "name: '..' is not a name"),
    ({"triton": "{model_name: " + "m" * 300 + "}"}, "stages.release.triton.model_name: 'mmm"),
    ({"triton": "{model_name: 'a/../b'}"}, "stages.release.triton.model_name: 'a/../b' is not a name"),
    ({"triton": "{gpus: [-1]}"}, "stages.release.triton.gpus[0]: Input should be greater than or equal to 0"),
    ({"triton": "{gpus: [1099511627776]}"}, "stages.release.triton.gpus[0]: Input should be less than or equal "
                                            "to 255"),
], ids=["escaping-profile", "dotted-profile", "option-profile", "long-profile", "escaping-target", "dotted-target",
        "long-pipeline-name", "dotdot-pipeline-name", "long-model-name", "slash-model-name", "negative-gpu",
        "huge-gpu"])
def test_names_that_become_paths_are_refused_where_they_enter(tmp_path, edit, where):
    assert where in refusal(tmp_path, **edit)


def test_stage_and_output_names_follow_the_same_rule(tmp_path):
    (tmp_path / "m.onnx").write_bytes(SQUEEZENET.read_bytes())
    for stages, where in [
        ("  " + "s" * 65 + ": {kind: prepare}\n", "is 65 characters long: at most 64"),
        ("  mine: {kind: pkg.mod:fn, outputs: {'../out': file}}\n", "stages.mine.outputs.../out: '../out' is not a "
                                                                    "name"),
    ]:
        (tmp_path / "p.yaml").write_text(f"version: 1\nname: t\nmodel: m.onnx\nstages:\n{stages}")
        with pytest.raises(SpecError) as err:
            load_pipeline(tmp_path / "p.yaml")
        assert where in str(err.value)


HOSTILE = 'x"""\nimport os; os.system("touch PWNED")\n"""'


def test_a_tensor_name_never_becomes_code_in_the_generated_model_py(tmp_path, monkeypatch):
    """An engine input named `x\"\"\"` + a line of Python: the generated preprocessing model is constant code (every
    generated .py parses to the same tree whatever the names), the name is data in preprocess.json, and importing
    and initializing the model, as Triton's Python backend does, runs nothing."""
    from tests.assets import IMAGENET
    from trtflow.stages.release.triton import config as triton_config
    from trtflow.stages.release.triton import preprocess
    from trtflow.stages.release.triton.contract import Contract, ProfileRange

    def generate(name: str, where: Path) -> Path:
        pb = triton_config.model_config_pb2()
        engine = pb.ModelConfig(name="m", platform="tensorrt_plan", max_batch_size=4)
        engine.input.add(name=name, data_type=pb.TYPE_FP32, dims=[3, 224, 224])
        engine.output.add(name='logits"""', data_type=pb.TYPE_FP32, dims=[1000])
        ranges = Contract(inputs=[], outputs=[], max_batch_size=4, dynamic_batching=False, profiles=[ProfileRange(
            name="p", shapes={name: ([1, 3, 224, 224], [1, 3, 224, 224], [4, 3, 224, 224])})])
        preprocess.write(where, "m", 1, engine, IMAGENET, ranges)
        return where

    hostile, plain = generate(HOSTILE, tmp_path / "hostile"), generate("input", tmp_path / "plain")
    generated = sorted(hostile.rglob("*.py"))
    assert generated, "the preprocessing model was written"
    for path in generated:
        tree = ast.parse(path.read_text())
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        assert not any("PWNED" in s or '"""' in s for s in strings), path
        assert ast.dump(tree) == ast.dump(ast.parse((plain / path.relative_to(hostile)).read_text())), path
    spec_file = hostile / "m_preprocess" / "1" / "preprocess.json"
    assert json.loads(spec_file.read_text())["output"] == HOSTILE

    stub_backend_utils(monkeypatch)
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("served", hostile / "m_preprocess" / "1" / "model.py")
    served = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(served)
    model = served.TritonPythonModel()
    model.initialize({"model_config": "{}"})
    assert model.output == HOSTILE
    assert not list(tmp_path.rglob("PWNED")) and not Path("PWNED").exists()


@pytest.mark.parametrize("node", ["a'b", "x\n  evil: 1", "p]q, [r", "\u2028z"])
def test_the_repair_yaml_to_paste_reads_back_the_node_names(node):
    """validate's repair suggests YAML to paste into the pipeline: a node named with a quote or a line break must
    read back as that node (it broke the list, or added a key of the attacker's)."""
    import re

    import yaml

    from trtflow.stages.validate.repair import yaml_fix
    for precision, key in (("fp16", "block_nodes"), ("int8", "exclude_nodes")):
        stage = yaml.safe_load(yaml_fix(precision, [node], "v"))["stages"]["v"]
        assert list(stage) == [key]
        (value,) = stage[key]
        assert (re.fullmatch(value, node) is not None) if precision == "fp16" else value == node


def test_the_preprocessing_model_refuses_an_image_no_profile_takes(tmp_path, monkeypatch):
    """Triton's config says -1 where a profile bounds a dimension: the preprocessing model checks the engine's
    profile ranges itself, and an image whose tensor falls outside fails its own request, naming the range."""
    import numpy as np

    from tests.assets import IMAGENET, PHOTOS
    from trtflow.stages.release.triton import config as triton_config
    from trtflow.stages.release.triton import preprocess
    from trtflow.stages.release.triton.contract import Contract, ProfileRange
    pb = triton_config.model_config_pb2()
    engine = pb.ModelConfig(name="m", platform="tensorrt_plan", max_batch_size=4)
    engine.input.add(name="input", data_type=pb.TYPE_FP32, dims=[3, -1, -1])
    engine.output.add(name="logits", data_type=pb.TYPE_FP32, dims=[1000])
    small = Contract(inputs=[], outputs=[], max_batch_size=4, dynamic_batching=False, profiles=[ProfileRange(
        name="small", shapes={"input": ([1, 3, 32, 32], [1, 3, 64, 64], [4, 3, 128, 128])})])
    preprocess.write(tmp_path, "m", 1, engine, IMAGENET, small)
    stub_backend_utils(monkeypatch)
    spec = importlib.util.spec_from_file_location("ranged", tmp_path / "m_preprocess" / "1" / "model.py")
    served = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(served)
    model = served.TritonPythonModel()
    model.initialize({"model_config": "{}"})
    (outputs, error), = model.execute([{"IMAGE": sys.modules["triton_python_backend_utils"].Tensor(
        "IMAGE", np.frombuffer(PHOTOS[0].read_bytes(), np.uint8))}])
    assert outputs == [] and error == ("the image gives a tensor of shape [1, 3, 224, 224], which the engine does "
                                       "not take: dimension 2 is 224, profile 'small' takes 32..128")


def test_the_repaired_suffix_has_one_rule():
    """validate names its repair of a variant (and of each engine) with one suffix; release and the YAML check
    strip exactly that suffix, whatever dots the variant's own name has."""
    from trtflow import names

    assert names.repaired("fp16") == "fp16.repaired" and names.repaired("fp16.b4.native") == "fp16.b4.native.repaired"
    assert names.is_repaired("int8.repaired") and not names.is_repaired("int8") and not names.is_repaired("repaired")
    assert names.unrepaired(names.repaired("int8.static")) == "int8.static" and names.unrepaired("fp16") == "fp16"
