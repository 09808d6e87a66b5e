"""TensorRT plugins declared in the pipeline (`plugins:`, stages/trt/plugins.py): a Python plugin for a custom-domain
op, parsed and built for real by TensorRT-RTX on the CPU in the pre-flight, the prepare stage and the build stage;
the link TensorRT-RTX needs before it adds any plugin layer; the plugin's files in the keys; bad entries as one-line
errors naming their key path. No engine runs here (no GPU): the plugin's runtime part is never executed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from trtflow.artifact import Artifact, Inputs
from trtflow.errors import SpecError, StageError
from trtflow.flows import implementation
from trtflow.flows.digest import DigestCache
from trtflow.flows.runner import Runner
from trtflow.pipelines.loader import load_pipeline
from trtflow.stages.trt import plugins
from trtflow.stages.trt.preflight import run_preflight

# A plugin as TensorRT's ONNX parser finds it: creator name = the node's op type, version = its `plugin_version`
# attribute (else "1"), namespace = its `plugin_namespace` (else "") and then its domain: "mydomain" is used here.
# The node's attributes arrive as the creator's fields (a float attribute: a FLOAT32 field of one value).
PLUGIN = '''
"""ClipScale (mydomain): y = clip(x * scale, -1, 1), elementwise, one input, one output.

Only the build-time parts do anything: `enqueue` (the runtime) raises, since nothing can run without a GPU here;
the engine it is built into needs this module imported wherever it is deserialized."""
import numpy as np
import tensorrt_rtx as trt

NAME, VERSION, NAMESPACE = "ClipScale", "1", "mydomain"


class ClipScale(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
    def __init__(self, scale=1.0):
        trt.IPluginV3.__init__(self)
        trt.IPluginV3OneCore.__init__(self)
        trt.IPluginV3OneBuild.__init__(self)
        trt.IPluginV3OneRuntime.__init__(self)
        self.plugin_name, self.plugin_version, self.plugin_namespace = NAME, VERSION, NAMESPACE
        self.num_outputs = 1
        self.scale = scale

    def get_capability_interface(self, type):
        return self

    def clone(self):
        return ClipScale(self.scale)

    def get_output_data_types(self, input_types):
        return [input_types[0]]

    def get_output_shapes(self, inputs, shape_inputs, expr_builder):
        return [trt.DimsExprs(inputs[0])]

    def supports_format_combination(self, pos, in_out, num_inputs):
        desc = in_out[pos].desc
        return desc.format == trt.TensorFormat.LINEAR and desc.type == trt.DataType.FLOAT

    def configure_plugin(self, inputs, outputs):
        pass

    def get_fields_to_serialize(self):
        return trt.PluginFieldCollection([trt.PluginField("scale", np.array([self.scale], np.float32),
                                                          trt.PluginFieldType.FLOAT32)])

    def on_shape_change(self, inputs, outputs):
        pass

    def set_tactic(self, tactic):
        pass

    def attach_to_context(self, context):
        return self.clone()

    def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
        raise RuntimeError("ClipScale has no GPU kernel here: this plugin only builds")


class ClipScaleCreator(trt.IPluginCreatorV3One):
    def __init__(self):
        trt.IPluginCreatorV3One.__init__(self)
        self.name, self.plugin_version, self.plugin_namespace = NAME, VERSION, NAMESPACE
        self.field_names = trt.PluginFieldCollection([trt.PluginField("scale", np.array([], np.float32),
                                                                      trt.PluginFieldType.FLOAT32)])

    def create_plugin(self, name, fc, phase):
        scale = next((float(f.data[0]) for f in fc if f.name == "scale"), 1.0)
        return ClipScale(scale)


CREATOR = ClipScaleCreator()  # kept: the registry holds a pointer to it
trt.get_plugin_registry().register_creator(CREATOR, NAMESPACE)
'''

SHAPE = [1, 3, 8, 8]


def clip_model(path: Path) -> Path:
    nodes = [helper.make_node("ClipScale", ["x"], ["y"], domain="mydomain", name="clip", scale=2.0),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, SHAPE)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("mydomain", 1)]), str(path))
    return path


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A model repo: the model with the custom op, the plugin module beside the pipeline file, and trtflow's cache
    folder of its own."""
    monkeypatch.setenv("TRTFLOW_CACHE_DIR", str(tmp_path / "cache"))
    clip_model(tmp_path / "clip.onnx")
    (tmp_path / "clip_plugin.py").write_text(PLUGIN)
    return tmp_path


def pipeline(repo: Path, plugin_lines: str = "plugins:\n  - python: clip_plugin\n", stages: str | None = None) -> Path:
    stages = stages or (f"  prepare: {{kind: prepare, input_shapes: {{x: {SHAPE}}}}}\n"
                        "  build: {kind: build}\n")
    path = repo / "pipeline.yaml"
    path.write_text(f"version: 1\nname: clip\nmodel: clip.onnx\n{plugin_lines}stages:\n{stages}")
    return path


def found(loaded) -> list[plugins.PluginLoad]:
    return plugins.found(loaded, DigestCache(None).sha256)


def declared(repo: Path) -> list[plugins.PluginLoad]:
    return found(load_pipeline(pipeline(repo)))


def run_outcomes(path: Path) -> dict[str, Any]:
    """Every stage of the pipeline run by the runner (no Prefect): its outcome, by stage."""
    runner = Runner(load_pipeline(path))
    runner.store.ensure_writable()
    produced, out = {}, {}
    for name in runner.select(None):
        out[name] = runner.run_stage(name, produced)
        produced[name] = out[name].manifest
    return out


def run_all(path: Path) -> dict[str, Path]:
    return {name: outcome.directory for name, outcome in run_outcomes(path).items()}


# --- the pre-flight -----------------------------------------------------------------------------------------------

@pytest.mark.tensorrt
def test_without_the_plugin_the_preflight_refuses_the_node_and_names_the_plugin(repo):
    report = run_preflight(repo / "clip.onnx", {"x": SHAPE}, plugins=[])
    (failure,) = report.failures
    assert report.ran and not report.parsed and failure.node == "clip" and failure.domain == "mydomain"
    assert "no TensorRT plugin named 'ClipScale' version '1' is registered (looked up in namespace '' then " \
           "'mydomain')" in failure.hint
    assert "under the pipeline's plugins:" in failure.hint


@pytest.mark.tensorrt
def test_with_the_plugin_the_preflight_parses_and_builds_through_trtflows_link(repo, tensorrt_backend):
    report = run_preflight(repo / "clip.onnx", {"x": SHAPE}, plugins=declared(repo))
    assert report.parsed and report.failures == [] and report.layers == 2
    assert report.trial_build.ok and report.trial_build.engine_bytes > 0
    if tensorrt_backend.flavour == "tensorrt-rtx":
        folder = plugins.library_link_dir(tensorrt_backend)
        assert folder is not None and folder.is_relative_to(repo / "cache")
        link = folder / "libtensorrt_rtx.so"
        assert link.is_symlink() and os.readlink(link).endswith("tensorrt_rtx_libs/libtensorrt_rtx.so.1")


@pytest.mark.tensorrt
def test_without_trtflows_link_tensorrt_rtx_aborts_on_a_plugin_layer(repo, tensorrt_backend, monkeypatch):
    """Why the link is there (measured on TensorRT-RTX 1.7): the child that adds a plugin layer dies."""
    if tensorrt_backend.flavour != "tensorrt-rtx":
        pytest.skip("TensorRT-RTX's wheel only")
    monkeypatch.setattr(plugins, "child_env", lambda backend, loads: {})
    report = run_preflight(repo / "clip.onnx", {"x": SHAPE}, plugins=declared(repo))
    assert not report.ran and "SIGABRT" in report.reason


@pytest.mark.tensorrt
def test_a_plugin_module_that_fails_to_import_is_one_line_naming_its_key_path(repo):
    (repo / "clip_plugin.py").write_text("raise RuntimeError('half written')\n")
    with pytest.raises(plugins.PluginError) as caught:
        run_preflight(repo / "clip.onnx", {"x": SHAPE}, plugins=declared(repo))
    assert str(caught.value) == \
        "plugins[0] (python clip_plugin) did not load: RuntimeError: half written"


# --- the pipeline: prepare and build with the plugin, keys -----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.tensorrt
def test_prepare_and_build_load_the_plugin_and_an_edit_of_it_rebuilds(repo):
    path = pipeline(repo)
    out = run_all(path)
    report = json.loads((out["prepare"] / "report.json").read_text())
    assert report["preflight"]["parsed"] and report["preflight"]["trial_build"]["ok"]
    build = json.loads((out["build"] / "report.json").read_text())
    assert [c["status"] for c in build["cells"]] == ["ok"]
    (cell,) = (out["build"] / "engines").iterdir()
    assert sorted(p.name for p in cell.iterdir()) == ["build.json", "build.log", "engine.plan", "spec.json"]
    assert "plugins" not in json.loads((cell / "spec.json").read_text())  # the record stays the Cell
    assert any((repo / "cache" / "tensorrt-links").iterdir())  # the link's folder, made by trtflow

    plan = {i.name: i for i in Runner(load_pipeline(path)).plan()}
    assert {n: i.action for n, i in plan.items()} == {"prepare": "reuse", "build": "reuse"}
    (repo / "clip_plugin.py").write_text(PLUGIN.replace("raise RuntimeError(", "raise NotImplementedError("))
    plan = {i.name: i for i in Runner(load_pipeline(path)).plan()}
    assert plan["prepare"].action == "run" and "code" in plan["prepare"].reason
    assert plan["build"].action == "run"


@pytest.mark.slow
@pytest.mark.tensorrt
def test_a_pipeline_without_the_plugin_fails_prepare_naming_the_plugin(repo):
    with pytest.raises(StageError) as caught:
        run_all(pipeline(repo, "", f"  prepare: {{kind: prepare, input_shapes: {{x: {SHAPE}}}}}\n"))
    said = str(caught.value)
    assert "clip (ClipScale): the parser has no importer for 'ClipScale' (mydomain), and no TensorRT plugin named " \
           "'ClipScale' version '1' is registered (looked up in namespace '' then 'mydomain')" in said
    assert "declare a TensorRT plugin named 'ClipScale' under the pipeline's plugins:" in said and "\n" not in said


def keys_of(path: Path) -> dict[str, tuple[str, dict | None]]:
    """Each stage's key and the `code` part of it, on a fixed model digest."""
    runner = Runner(load_pipeline(path))
    model = Artifact(path.parent / "clip.onnx", "onnx", "ab" * 32)
    found = {}
    for name, node in runner.graph.nodes.items():
        key, parts = runner.key_for(name, Inputs({"model": model}), implementation.resolve(node.spec))
        found[name] = (key, parts.code)
    return found


def test_plugins_enter_the_keys_of_tensorrt_stages_only_and_absent_add_nothing(repo):
    stages = "  prepare: {kind: prepare, preflight: off}\n  build: {kind: build}\n"
    with_plugin = keys_of(pipeline(repo, stages=stages))
    without = keys_of(pipeline(repo, "", stages))
    assert keys_of(pipeline(repo, "plugins: []\n", stages)) == without
    assert without["build"][1] is None and without["prepare"][1] is None
    assert with_plugin["prepare"] == without["prepare"]  # no pre-flight: no TensorRT, no plugin in its key
    assert with_plugin["build"][0] != without["build"][0]
    assert list(with_plugin["build"][1]) == ["plugin python clip_plugin"]
    (repo / "clip_plugin.py").write_text(PLUGIN + "\n# edited\n")
    assert keys_of(pipeline(repo, stages=stages))["build"][0] != with_plugin["build"][0]


# --- bad entries: one line, the key path ------------------------------------------------------------------------

@pytest.mark.parametrize(("lines", "error"), [
    ("plugins:\n  - {python: clip_plugin, library: libx.so}\n",
     "plugins[0]: give one of 'library' (a shared library) or 'python' (a module of yours)"),
    ("plugins:\n  - {}\n", "plugins[0]: give one of 'library'"),
    ("plugins:\n  - {python: clip_plugin, entry: init}\n", "plugins[0]: 'entry' and 'namespace' go with 'library'"),
    ("plugins:\n  - {python: 'clip-plugin'}\n", "plugins[0].python: String should match pattern"),
    ("plugins:\n  - {pyhton: clip_plugin}\n", "plugins[0]: unknown key 'pyhton'"),
    ("plugins: clip_plugin\n", "plugins: Input should be a valid list"),
])
def test_a_malformed_entry_is_refused_at_load_naming_its_key_path(repo, lines, error):
    with pytest.raises(SpecError) as caught:
        load_pipeline(pipeline(repo, lines))
    assert error in str(caught.value) and "\n" not in str(caught.value)
    assert "pipeline.yaml:" in str(caught.value)


@pytest.mark.parametrize(("lines", "error"), [
    ("plugins:\n  - python: clip_plugin\n  - python: no_such_plugin\n",
     "plugins[1].python: no Python module 'no_such_plugin' on the import path"),
    ("plugins:\n  - library: lib/libnone.so\n", "plugins[0].library: plugin library 'lib/libnone.so' is not a file"),
])
def test_a_plugin_not_found_is_refused_by_plan_naming_its_key_path(repo, lines, error):
    with pytest.raises(SpecError) as caught:
        Runner(load_pipeline(pipeline(repo, lines))).plan()
    assert error in str(caught.value) and "\n" not in str(caught.value)


# --- shared libraries ----------------------------------------------------------------------------------------------

ENTRY_C = r"""
#include <stdio.h>
#include <stdlib.h>
int initMine(void* logger, const char* ns) {
    FILE* f = fopen(getenv("TRTFLOW_TEST_PLUGIN_MARK"), "w");
    if (!f) return 0;
    fprintf(f, "logger=%s namespace=%s", logger ? "set" : "none", ns);
    fclose(f);
    return 1;
}
"""


@pytest.fixture
def library(repo) -> Path:
    """A shared library with an entry function (it registers no creator: it only says it was called)."""
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    (repo / "mine.c").write_text(ENTRY_C)
    (repo / "lib").mkdir()
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(repo / "lib" / "libmine.so"), str(repo / "mine.c")],
                   check=True)
    return repo / "lib" / "libmine.so"


@pytest.mark.tensorrt
def test_a_library_entry_is_called_with_its_namespace_in_the_child(repo, library, monkeypatch):
    monkeypatch.setenv("TRTFLOW_TEST_PLUGIN_MARK", str(repo / "mark"))
    loads = found(load_pipeline(pipeline(repo, "plugins:\n  - {library: lib/libmine.so, entry: initMine, "
                                                       "namespace: mydomain}\n")))
    report = run_preflight(repo / "clip.onnx", {"x": SHAPE}, plugins=loads)
    assert (repo / "mark").read_text() == "logger=none namespace=mydomain"
    assert not report.parsed  # it registered nothing: ClipScale is still unknown


@pytest.mark.tensorrt
@pytest.mark.parametrize(("entry", "error"), [
    ("", "plugins[0] (library lib/libmine.so) did not load: TensorRT's plugin registry refused it"),
    (", entry: initOther", "plugins[0] (library lib/libmine.so (entry initOther)) did not load: AttributeError: "),
])
def test_a_library_that_does_not_load_is_one_line_naming_its_key_path(repo, library, entry, error):
    loads = found(load_pipeline(pipeline(repo, f"plugins:\n  - {{library: lib/libmine.so{entry}}}\n")))
    with pytest.raises(StageError) as caught:
        run_preflight(repo / "clip.onnx", {"x": SHAPE}, plugins=loads)
    assert str(caught.value).startswith(error) and "\n" not in str(caught.value)


# --- the link ----------------------------------------------------------------------------------------------------

@pytest.mark.tensorrt
def test_a_link_planted_in_trtflows_folder_is_replaced_never_followed(repo, tensorrt_backend):
    if tensorrt_backend.flavour != "tensorrt-rtx":
        pytest.skip("TensorRT-RTX's wheel only")
    folder = plugins.library_link_dir(tensorrt_backend)
    target = os.readlink(folder / "libtensorrt_rtx.so")
    elsewhere = repo / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim.so").write_bytes(b"untouched")
    (folder / "libtensorrt_rtx.so").unlink()
    (folder / "libtensorrt_rtx.so").symlink_to(elsewhere / "victim.so")
    assert plugins.library_link_dir(tensorrt_backend) == folder
    assert os.readlink(folder / "libtensorrt_rtx.so") == target
    assert (elsewhere / "victim.so").read_bytes() == b"untouched"
    # the folder itself replaced by a link to another folder: the link is removed, the folder made again
    shutil.rmtree(folder)
    folder.symlink_to(elsewhere, target_is_directory=True)
    assert plugins.library_link_dir(tensorrt_backend) == folder
    assert folder.is_dir() and not folder.is_symlink() and sorted(p.name for p in elsewhere.iterdir()) == ["victim.so"]
    folder.chmod(0o777)
    with pytest.raises(plugins.PluginError, match="only they can write to"):
        plugins.library_link_dir(tensorrt_backend)


def test_a_module_is_found_without_running_any_of_its_code(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (tmp_path / "pkg" / "plug.py").write_text("raise SystemExit('imported')\n")
    assert plugins.find_module("pkg.plug", [str(tmp_path)]) == (str(tmp_path), str(tmp_path / "pkg" / "plug.py"))
    assert plugins.find_module("pkg.none", [str(tmp_path)]) is None


def test_the_plugins_in_the_guide_are_valid_entries():
    import yaml

    from trtflow.pipelines.pipeline import Plugin

    text = (Path(__file__).parent.parent / "docs" / "guides" / "unsupported-ops.md").read_text()
    section = text[text.index("## Plugins"):]
    blocks = [b.split("```")[0] for b in section.split("```yaml")[1:]]
    entries = [e for b in blocks for e in (yaml.safe_load(b) or {}).get("plugins", [])]
    assert entries and all(Plugin.model_validate(e) for e in entries)


@pytest.mark.slow
@pytest.mark.tensorrt
def test_an_edited_plugin_builds_its_engines_again_not_from_the_engine_cache(repo):
    path = pipeline(repo)
    run_all(path)
    (repo / "clip_plugin.py").write_text(PLUGIN + "\n# edited\n")
    out = run_all(path)
    build = json.loads((out["build"] / "report.json").read_text())
    assert [c.get("reused") for c in build["cells"]] == [None]


def test_trtexec_loads_the_pipelines_plugin_libraries_before_the_engine(tmp_path):
    """Build 3: benchmark's trtexec gets the libraries the engines were built with (TensorRT 10's flag, and 8.x's)."""
    from trtflow.pipelines.params.benchmark import BenchmarkStage
    from trtflow.stages.trtexec import command, exports

    params = BenchmarkStage(kind="benchmark")
    written = exports.ExportFiles.beside(tmp_path / "cell")
    libraries = ["/opt/p/libfirst.so", "/opt/p/libsecond.so"]
    ten = command.compose(Path("trtexec"), Path("e.plan"), {}, params, written, "10.16.1", libraries)
    eight = command.compose(Path("trtexec"), Path("e.plan"), {}, params, written, "8.6.1", libraries)
    assert [a for a in ten if "Plugins=" in a] == [f"--dynamicPlugins={lib}" for lib in libraries]
    assert [a for a in eight if a.startswith("--plugins=")] == [f"--plugins={lib}" for lib in libraries]
    assert not [a for a in command.compose(Path("trtexec"), Path("e.plan"), {}, params, written, "10.16.1")
                if "lugins" in a]
