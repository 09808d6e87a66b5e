"""Bad input from a new user or an attacker (issue #11, items 11-13, 15): one line naming the file, the line or key,
exit 2, before any work, and nothing read that could hang."""
from __future__ import annotations

import os
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.assets import trtflow
from trtflow.flows import cli

HEAD = "version: 1\nname: bad\nmodel: models/cls.onnx\n"
LAUGHS = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))


def errors_of(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


@pytest.mark.parametrize("body, expected", [
    # a billion laughs: 9^9 strings once aliases are expanded
    ("l0: &l0 ['lol']\n" + LAUGHS + "stages: *l9\n",
     "pipeline.yaml:9: l5: the YAML expands to more than 100000 nodes through aliases (an alias bomb?)"),
    ("stages: &s\n  p: *s\n",
     "pipeline.yaml:4: stages.p: an alias refers to a node that contains it (a YAML structure inside itself)"),
    ("stages:\n  prepare: {kind: prepare}\n  prepare: {kind: prepare, target_opset: 13}\n",
     "pipeline.yaml:6: stages: key 'prepare' is given twice (first on line 5); YAML would keep only the last"),
    ("stages:\n  p: {kind: prepare, simplify: true, simplify: false}\n",
     "pipeline.yaml:5: stages.p: key 'simplify' is given twice (first on line 5)"),
    ("stages:\n  p: {kind: prepare, input_shapes: {input: [1, -3, 224, 224]}}\n",
     "pipeline.yaml:5: stages.p.input_shapes.input[1]: Input should be greater than or equal to 1, got -3"),
    ("stages:\n  p: {kind: prepare, input_shapes: {input: [100000, 3, 224, 224]}}\n",
     "pipeline.yaml:5: stages.p.input_shapes.input: shape [100000, 3, 224, 224] has 1.51e+10 "
     "elements"),
    ("stages:\n  c: {kind: calibrate, data: {random: true, samples: 1000000000}}\n",
     "pipeline.yaml:5: stages.c.data.samples: Input should be less than or equal to 10000, got 1000000000"),
    ("artifacts: /\nstages:\n  p: {kind: prepare}\n",
     "pipeline.yaml:4: artifacts: '/' resolves to /, a directory shared with everything else"),
    ("artifacts: /etc/trtflow\nstages:\n  p: {kind: prepare}\n",
     "pipeline.yaml:4: artifacts: '/etc/trtflow' resolves to /etc/trtflow, inside the system directory /etc"),
    # YAML's infinities and NaN (issue #27: `timeout: .inf` was an OverflowError, `.nan` a stage "timed out after
    # nan s")
    ("stages:\n  p: {kind: prepare, timeout: .inf}\n",
     "pipeline.yaml:5: stages.p.timeout: a duration must be a finite number of seconds, not inf"),
    ("stages:\n  p: {kind: prepare, timeout: .nan}\n",
     "pipeline.yaml:5: stages.p.timeout: a duration must be a finite number of seconds, not nan"),
    ("stages:\n  v: {kind: validate, tolerances: {logits: {max_abs: .nan}}}\n",
     "pipeline.yaml:5: stages.v.tolerances.logits.max_abs: Input should be a finite number"),
    ("stages:\n  v: {kind: validate, tolerances: {logits: {top1: -.inf}}}\n",
     "pipeline.yaml:5: stages.v.tolerances.logits.top1: a percentage must be a finite number, not -inf"),
], ids=["alias bomb", "alias recursion", "duplicate stage", "duplicate key", "negative dim", "huge shape",
        "huge samples", "store at /", "store in /etc", "timeout inf", "timeout nan", "tolerance nan",
        "fraction -inf"])
def test_bad_pipeline_files_are_one_line(write_yaml, capsys, body, expected):
    path = write_yaml(HEAD + body)
    assert cli.main(["validate", str(path)]) == 2
    (line,) = errors_of(capsys)
    assert line.startswith(f"error: {path.parent}/{expected}"), line


def test_a_system_directory_as_store_is_refused(write_yaml, capsys):
    path = write_yaml(HEAD + "stages:\n  p: {kind: prepare}\n")
    for argv, store in ((["plan", str(path), "--store", "/usr/lib"], "/usr/lib"),
                        (["verify", "--store", "/", "--repair"], "/")):
        assert cli.main(argv) == 2
        (line,) = errors_of(capsys)
        assert line.startswith(f"error: --store {store}: resolves to "), line


def _external_model(directory, location: str) -> None:
    """A model whose weight lives in external data at `location` (written as a real file, then redirected)."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(directory / "ext.onnx"), save_as_external_data=True, location="ext.data",
                    size_threshold=0)
    model = onnx.load(str(directory / "ext.onnx"), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save_model(model, str(directory / "ext.onnx"))


# location -> what the error says of it (issue #49: `trtflow init` and the prepare stage said exit 1, "not a valid
# ONNX model (truncated or corrupt)"); `_plant` makes the files some of them name
EXTERNAL = {
    "../outside.bin": "outside the model's directory",
    "../../../../../../../dev/zero": "outside the model's directory",
    "/dev/zero": "outside the model's directory",
    "nothere.bin": "which does not exist",
    "fifo": "which is not a regular file but a FIFO",
    "out-link.bin": "which leads outside the model's directory",
    "in-link.bin": "which is a symlink",
}


def _plant(models, location: str):
    """models/ext.onnx keeping its weight in `location`, and what `location` names: a real file beside the folder,
    a FIFO (reading it would block for ever), a symlink to that outside file, a symlink to the real data inside."""
    (models.parent / "outside.bin").write_bytes(np.ones(16, np.float32).tobytes())
    _external_model(models, location)
    if location == "fifo":
        os.mkfifo(models / "fifo")
    elif location == "out-link.bin":
        (models / location).symlink_to("../outside.bin")
    elif location == "in-link.bin":
        (models / location).symlink_to("ext.data")
    return models / "ext.onnx"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize("location", EXTERNAL)
def test_external_data_is_read_only_inside_the_models_directory(write_yaml, workdir, capsys, location, command):
    model = _plant(workdir / "models", location)
    path = write_yaml("version: 1\nname: ext\nmodel: models/ext.onnx\nstages:\n  p: {kind: prepare}\n")
    assert cli.main([command, str(path)]) == 2
    (line,) = errors_of(capsys)
    assert line.startswith(f"error: {model}: tensor 'w' keeps its data in '{location}', {EXTERNAL[location]}"), line


@pytest.mark.slow
@pytest.mark.parametrize("location", EXTERNAL)
def test_init_refuses_external_data_outside_the_models_directory_reading_none(workdir, location):
    """`trtflow init` on the model: exit 2, one line naming the model, the tensor and the location, and what to do;
    nothing read (a FIFO read would block: the timeout)."""
    models = workdir / "models"
    _plant(models, location)
    proc = trtflow("init", "ext.onnx", "--task", "classify", "-o", str(workdir / "p.yaml"), cwd=models, timeout=120)
    assert proc.returncode == 2, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert line.startswith(f"error: ext.onnx: tensor 'w' keeps its data in '{location}', {EXTERNAL[location]}"), line
    assert line.endswith(")") and "(" in line.split(EXTERNAL[location], 1)[1], "it says what to do"
    assert not (workdir / "p.yaml").exists()


@pytest.mark.parametrize("location", EXTERNAL)
def test_the_prepare_stage_refuses_external_data_outside_the_models_directory(workdir, tmp_path, location):
    """The prepare stage itself, in its own process as `trtflow run` starts it (where the model's digest did not
    look first): the same SpecError (exit 2) crosses to the parent, not "not a valid ONNX model" (exit 1)."""
    from trtflow.artifact import Artifact, Inputs
    from trtflow.errors import SpecError
    from trtflow.flows.isolate import call_stage
    from trtflow.pipelines.params.prepare import PrepareStage
    from trtflow.stages.prepare import stage as prepare

    model = _plant(workdir / "models", location)
    (tmp_path / "out").mkdir()
    args = (PrepareStage.model_validate({"kind": "prepare"}), Inputs({"model": Artifact(model, "onnx", "x")}),
            tmp_path / "out")
    with pytest.raises(SpecError) as info:
        call_stage(prepare.run, args, 120, "p")
    assert info.value.exit_code == 2 and info.value.file == str(model)
    assert str(info.value).startswith(f"{model}: tensor 'w' keeps its data in '{location}', {EXTERNAL[location]}")


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_a_profile_naming_a_missing_input_is_found_before_anything_runs(write_yaml, capsys, command):
    path = write_yaml(HEAD + """stages:
  prepare: {kind: prepare}
  fp16: {kind: precision, to: fp16}
  build:
    kind: build
    profiles:
      bs1: {imgs: {min: [1, 3, 224, 224], opt: [1, 3, 224, 224], max: [1, 3, 224, 224]}}
""")
    assert cli.main([command, str(path)]) == 2
    (line,) = errors_of(capsys)
    assert line.startswith(f"error: {path}:10: stages.build.profiles.bs1.imgs: model 'models/cls.onnx' has no "
                           f"input 'imgs' (")
    assert not (path.parent / ".trtflow").exists(), "nothing ran"


@pytest.mark.parametrize("make, expected", [
    (lambda p: p.write_bytes((HEAD + "stages:\n  p: {kind: prepare}\n").encode().replace(b"prepare}", b"prep\0are}")),
     ":5: control character U+0000 (YAML allows none)"),
    (lambda p: p.write_text(HEAD + "stages: " + "[" * 50_000 + "]" * 50_000 + "\n"),
     ":4: YAML nested more than 64 levels deep"),
    (lambda p: p.write_text(HEAD + "stages:\n" + "".join(f"  s{i}: {{kind: prepare}}\n" for i in range(80_000))),
     ": the pipeline file is 2.0 MiB; a pipeline file is at most 1 MiB"),
    (lambda p: os.mkfifo(p), ": the pipeline file is not a regular file (a directory, FIFO or device)"),
    (lambda p: p.symlink_to("/dev/zero"), ": the pipeline file is not a regular file (a directory, FIFO or device)"),
    (lambda p: p.write_bytes(b"version: 1\nname: \xff\xfe\n"), ":2: the pipeline file is not UTF-8 text (byte 17)"),
], ids=["NUL byte", "50000 levels", "2 MB file", "FIFO", "/dev/zero", "not UTF-8"])
def test_a_pipeline_file_that_is_not_one_is_refused_at_once(workdir, capsys, make, expected):
    """Issue #27: a FIFO hung `validate`, /dev/zero ran out of memory, deep nesting was a RecursionError and a NUL
    byte PyYAML's own text as an unexpected error: each is one line naming the file (and line), exit 2, at once."""
    path = workdir / "pipeline.yaml"
    make(path)
    started = time.monotonic()
    assert cli.main(["validate", str(path)]) == 2
    (line,) = errors_of(capsys)
    assert line.startswith(f"error: {path}{expected}"), line
    assert time.monotonic() - started < 5


BOMB = "[&l0 [lol], " + ", ".join(f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)) + "]"


@pytest.mark.parametrize("value, expected", [
    (BOMB, ":1: [5]: the YAML expands to more than 100000 nodes through aliases (an alias bomb?)"),
    ("[" * 5000 + "]" * 5000, ":1: YAML nested more than 64 levels deep"),
    ("a\x01b", ":1: control character U+0001 (YAML allows none) (remove it)"),
], ids=["alias bomb", "5000 levels", "control character"])
def test_a_set_value_is_held_to_the_limits_of_a_pipeline_file(write_yaml, capsys, value, expected):
    """Issue #27: an alias bomb given with --set to a user stage's params panicked in a dependency and hung."""
    path = write_yaml(HEAD + 'stages:\n  s: {kind: "tests.stage_fns:copy_model", outputs: {model: onnx}}\n')
    started = time.monotonic()
    assert cli.main(["validate", str(path), "--set", f"stages.s.params.tag={value}"]) == 2
    (line,) = errors_of(capsys)
    assert line.startswith(f"error: --set stages.s.params.tag{expected}"), line
    assert time.monotonic() - started < 5
