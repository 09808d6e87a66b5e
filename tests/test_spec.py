"""The pipeline spec: loading, errors with file/line/key path, ${ENV}, --set, the stage graph, the schema."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from trtflow.errors import SpecError
from trtflow.pipelines.graph import SOURCE, build_graph
from trtflow.pipelines.loader import load_pipeline
from trtflow.pipelines.pipeline import json_schema

ROOT = Path(__file__).resolve().parents[1]

GOOD = """
version: 1
name: demo
model: models/cls.onnx
stages:
  prepare: {kind: prepare, target_opset: 17}
  fp16: {kind: precision, to: fp16}
  int8:
    kind: calibrate
    data: {images: "data/*.jpg", samples: 16}
  build:
    kind: build
    workspace: 2GiB
    profiles:
      bs1: {x: {min: [1, 3, 48, 192], opt: [1, 3, 48, 192], max: [1, 3, 48, 192]}}
  check: {kind: validate}
  check_again: {kind: validate, inputs: {reference: source}}
  bench: {kind: benchmark, gate: {p99_regression: 10%}}
"""


def error_of(path: Path, overrides=None, environ=None) -> str:
    with pytest.raises(SpecError) as info:
        load_pipeline(path, overrides, environ=environ or {})
    text = str(info.value)
    assert "\n" not in text, "errors are one line"
    return text


def test_good_pipeline_and_defaults(write_yaml):
    p = load_pipeline(write_yaml(GOOD), environ={})
    assert p.spec.stages["build"].workspace == 2 * 2**30
    assert p.spec.stages["bench"].gate.p99_regression == pytest.approx(0.10)
    g = build_graph(p)
    assert g.order == ["prepare", "fp16", "int8", "build", "check", "check_again", "bench"]
    edges = lambda stage, slot: [(e.stage, e.output) for e in g.nodes[stage].inputs[slot]]  # noqa: E731
    assert edges("prepare", "model") == [(SOURCE, "model")]
    # precision and calibration start from the prepared FP32 model, not from each other
    assert edges("fp16", "model") == [("prepare", "model")]
    assert edges("int8", "model") == [("prepare", "model")]
    # the build compiles every model variant, in file order
    assert edges("build", "models") == [("prepare", "model"), ("fp16", "model"), ("int8", "model")]
    assert edges("check", "engines") == [("build", "engines")]
    assert edges("check_again", "reference") == [(SOURCE, "model")]
    assert g.closure(["int8"]) == ["prepare", "int8"]
    assert g.downstream("fp16") == ["fp16", "build", "check", "check_again", "bench"]


def test_yaml_syntax_error_names_line(write_yaml):
    path = write_yaml("version: 1\nname: demo\nstages:\n  prepare: {kind: prepare\n  other: 1\n")
    msg = error_of(path)
    assert msg.startswith(f"{path}:") and "YAML syntax error" in msg
    assert ":5:" in msg or ":4:" in msg


def test_unknown_key_did_you_mean(write_yaml):
    path = write_yaml(GOOD.replace("target_opset: 17", "target_opset: 17, simplfy: false"))
    msg = error_of(path)
    assert msg == f"{path}:5: stages.prepare: unknown key 'simplfy' (did you mean 'simplify'?)"


def test_unknown_nested_key_did_you_mean(write_yaml):
    path = write_yaml(GOOD.replace("{images: \"data/*.jpg\", samples: 16}", "{images: \"data/*.jpg\", sample: 16}"))
    msg = error_of(path)
    assert "stages.int8.data: unknown key 'sample' (did you mean 'samples'?)" in msg and ":9:" in msg


def test_wrong_type(write_yaml):
    path = write_yaml(GOOD.replace("target_opset: 17", "target_opset: seventeen"))
    msg = error_of(path)
    assert msg.startswith(f"{path}:5: stages.prepare.target_opset: ") and "integer" in msg and "seventeen" in msg


def test_bad_size_unit(write_yaml):
    msg = error_of(write_yaml(GOOD.replace("2GiB", "2 gigs")))
    assert "stages.build.workspace: invalid size '2 gigs'" in msg and ":12:" in msg


def test_profile_min_opt_max_order(write_yaml):
    bad = GOOD.replace("opt: [1, 3, 48, 192], max", "opt: [8, 3, 48, 192], max")
    msg = error_of(write_yaml(bad))
    assert "stages.build.profiles.bs1.x: dimension 0: need min <= opt <= max, got 1, 8, 1" in msg


def test_missing_model_file(write_yaml):
    path = write_yaml(GOOD.replace("models/cls.onnx", "models/nope.onnx"))
    msg = error_of(path)
    assert msg.startswith(f"{path}:3: model: model file 'models/nope.onnx' not found")


def test_missing_pipeline_file(tmp_path):
    assert "pipeline file not found" in error_of(tmp_path / "absent.yaml")


def test_unknown_stage_kind(write_yaml):
    msg = error_of(write_yaml(GOOD.replace("kind: precision", "kind: precison")))
    assert "stages.fp16.kind: unknown stage kind 'precison' (did you mean 'precision'?)" in msg and ":6:" in msg


def test_missing_kind(write_yaml):
    msg = error_of(write_yaml(GOOD.replace("{kind: precision, to: fp16}", "{to: fp16}")))
    assert "stages.fp16: missing required key 'kind'" in msg


def test_missing_required_key(write_yaml):
    msg = error_of(write_yaml(GOOD.replace("name: demo\n", "")))
    assert "missing required key 'name'" in msg


def test_reference_to_missing_stage(write_yaml):
    path = write_yaml(GOOD.replace("{kind: validate}", "{kind: validate, inputs: {engines: biuld}}"))
    p = load_pipeline(path, environ={})
    with pytest.raises(SpecError) as info:
        build_graph(p)
    assert str(info.value) == (f"{path.resolve()}:15: stages.check.inputs.engines: reference to a stage that "
                               f"does not exist: 'biuld' (did you mean 'build'?)")


def test_reference_of_wrong_type(write_yaml):
    path = write_yaml(GOOD.replace("{kind: validate}", "{kind: validate, inputs: {engines: fp16}}"))
    with pytest.raises(SpecError, match=r"stage 'fp16' \(precision\) produces no 'engines'"):
        build_graph(load_pipeline(path, environ={}))


def test_cycle(write_yaml):
    path = write_yaml("""
        version: 1
        name: loop
        model: models/cls.onnx
        stages:
          a: {kind: "tests.stage_fns:copy_model", outputs: {model: onnx}, inputs: {model: b}}
          b: {kind: "tests.stage_fns:copy_model", outputs: {model: onnx}, inputs: {model: a}}
        """)
    with pytest.raises(SpecError) as info:
        build_graph(load_pipeline(path))
    msg = str(info.value)
    assert msg.startswith(f"{path}:")
    assert "the stages form a cycle:" in msg
    assert "a -> b -> a" in msg or "b -> a -> b" in msg


def test_env_interpolation(write_yaml):
    path = write_yaml(GOOD.replace("2GiB", "${WS}").replace("target_opset: 17", "target_opset: \"${OPSET:-13}\""))
    p = load_pipeline(path, environ={"WS": "512MiB"})
    assert p.spec.stages["build"].workspace == 512 * 2**20
    assert p.spec.stages["prepare"].target_opset == 13
    msg = error_of(path)
    assert "stages.build.workspace: environment variable WS is not set" in msg and ":12:" in msg


def test_set_overrides(write_yaml):
    path = write_yaml(GOOD)
    p = load_pipeline(path, ["stages.build.workspace=1GiB", "stages.prepare.simplify=false",
                             "stages.build.targets=[sm86, sm89]"], environ={})
    assert p.spec.stages["build"].workspace == 2**30
    assert p.spec.stages["prepare"].simplify is False
    assert p.spec.stages["build"].targets == ["sm86", "sm89"]
    msg = error_of(path, ["stages.build.workspace=lots"])
    assert msg.startswith("--set stages.build.workspace: invalid size 'lots'")
    assert "expected KEY.PATH=VALUE" in error_of(path, ["stages.build.workspace"])
    # a value that is not valid YAML is an error naming the YAML problem, never a silent string
    msg = error_of(path, ["stages.build.targets=[sm86, sm89"])
    assert msg.startswith("--set stages.build.targets: the value '[sm86, sm89' is not valid YAML: expected ',' or "
                          "']'"), msg
    assert "quote it to pass a string" in msg


def test_failure_lines_show_enough_digits_to_differ():
    from trtflow.stages.compare.gate import Violation
    from trtflow.text import distinct

    assert Violation("y", "cosine", 0.999994, 1.0, True).line() == "output 'y': cosine 0.99999 < 1"
    assert Violation("y", "cosine", 0.9999894, 0.99999, True).line() == "output 'y': cosine 0.999989 < 0.99999"
    assert distinct(0.5, 0.5) == ("0.5", "0.5") and distinct(1e-7, 1.0000001e-7) == ("1e-07", "1.0000001e-07")


def test_reserved_source_name(write_yaml):
    msg = error_of(write_yaml(GOOD.replace("  check_again:", "  source:")))
    assert "'source' is reserved" in msg
    msg = error_of(write_yaml(GOOD.replace("  check_again:", "  shared:")))
    assert "'shared' is reserved" in msg


def test_custom_stage_kind_accepted(write_yaml):
    path = write_yaml(GOOD + "  mine: {kind: \"mypkg.tools:check\", params: {x: 1}, outputs: {report: json}}\n")
    p = load_pipeline(path, environ={})
    assert p.spec.stages["mine"].params == {"x": 1}


def test_json_schema_validates_examples_and_rejects_typos():
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for example in sorted((ROOT / "examples").glob("*/pipeline.yaml")):
        data = yaml.safe_load(example.read_text())
        assert not list(validator.iter_errors(data)), example
    assert list(validator.iter_errors(yaml.safe_load(GOOD)))  == []
    typo = yaml.safe_load(GOOD.replace("target_opset", "target_opest"))
    assert list(validator.iter_errors(typo))


def test_committed_schema_is_current():
    committed = json.loads((ROOT / "examples" / "trtflow.schema.json").read_text())
    assert committed == json_schema(), "run: trtflow schema --force -o examples/trtflow.schema.json"


def test_a_report_slot_takes_only_its_kinds_report(write_yaml, capsys):
    """Every kind's report is JSON: a benchmark's report given to a release as its validation was accepted and
    failed at run time (issue #52). `trtflow validate` refuses it with the key path, exit 2."""
    from trtflow.flows import cli

    path = write_yaml(GOOD + "  ship: {kind: release, inputs: {validation: bench.report}}\n")
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "stages.ship.inputs.validation: 'bench' is a benchmark stage: input 'validation' takes a validate " \
           "stage's report" in err, err
    assert cli.main(["validate", str(write_yaml(GOOD + "  ship: {kind: release, inputs: {validation: check}}\n"))]) \
        == 0
