"""The release of an engine built with the pipeline's TensorRT plugins (#68 Build 3): a plugin library copied beside
the Triton repository (`triton/<target>.plugins/`), listed in the report with its digest, and the card and the request
example saying how Triton's TensorRT backend loads it (`--backend-config=tensorrt,plugins=`); a Python plugin as a
one-line warning and the card's word that stock Triton cannot serve the engine with it.

The C library of tests/test_plugins.py registers no creator (its entry only says it was called): the parser cannot
build the custom op with it, so the pipeline here builds with the ClipScale Python plugin, and the library's path is
tested on the release's own function with a PluginLoad as the runner makes it."""
from __future__ import annotations

import hashlib
import html
import json
from pathlib import Path

import pytest

from tests.test_plugins import PLUGIN, SHAPE, clip_model, pipeline, run_all, run_outcomes
from trtflow.errors import StageError
from trtflow.pipelines.params.release import Select
from trtflow.stages.release import card
from trtflow.stages.release.report import Option, ReleaseReport, TargetRelease
from trtflow.stages.release.stage import ship_plugins
from trtflow.stages.trt import plugins

RELEASE = (f"  prepare: {{kind: prepare, input_shapes: {{x: {SHAPE}}}}}\n"
           "  build: {kind: build}\n"
           "  release: {kind: release, select: {require: built, prefer: size}}\n")
RULE = Select(require="built", prefer="size").model_dump(mode="json")
BACKEND_CONFIG = '--backend-config=tensorrt,plugins="$PWD/triton/gpu.plugins/libmine.so"'


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TRTFLOW_CACHE_DIR", str(tmp_path / "cache"))
    clip_model(tmp_path / "clip.onnx")
    (tmp_path / "clip_plugin.py").write_text(PLUGIN)
    return tmp_path


# --- the library: copied, listed, said (the release's function, on a PluginLoad as the runner finds it) ------------

def released(tmp_path: Path) -> TargetRelease:
    chosen = Option(name="build.fp16.gpu", variant="source", precision="fp16", target="gpu", profiles=["p0"],
                    engine_bytes=1, engine_sha256="ab" * 32, rank=1)
    return TargetRelease(target="gpu", chosen=chosen, options=[chosen], repository="triton/gpu", version=1,
                         request_example="import os\n")


def library_load(tmp_path: Path, name: str = "libmine.so", body: bytes = b"\x7fELF not really") \
        -> plugins.PluginLoad:
    path = tmp_path / "lib" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(body)
    return plugins.PluginLoad(key="plugins[0]", label=f"library lib/{name} (entry initMine)", file=str(path),
                              digest=sha256(path), entry="initMine", namespace="mine")


def test_a_plugin_library_is_copied_beside_the_repository_listed_and_said(tmp_path):
    out = tmp_path / "out"
    (out / "triton" / "gpu").mkdir(parents=True)
    release, load = released(tmp_path), library_load(tmp_path)
    assert ship_plugins(release, [load], out) == []  # a library warns of nothing
    copy = out / "triton" / "gpu.plugins" / "libmine.so"
    assert sha256(copy) == load.digest
    (shipped,) = release.plugins
    assert (shipped.file, shipped.sha256, shipped.entry, shipped.namespace, shipped.python) == \
           ("triton/gpu.plugins/libmine.so", load.digest, "initMine", "mine", None)
    assert "--backend-config=tensorrt,plugins=" in shipped.loaded_by
    assert release.server == f"tritonserver --model-repository=$PWD/triton/gpu {BACKEND_CONFIG}"
    assert release.request_example.startswith("# start the server with the engine's TensorRT plugin libraries")
    assert f"#   {release.server}\n" in release.request_example and release.request_example.endswith("import os\n")

    report = ReleaseReport(model_name="clip", rule=RULE, targets=[release], lineage=[])
    again = ReleaseReport.model_validate_json(report.model_dump_json())
    assert again.targets[0].plugins == release.plugins
    text = card.markdown(report, {})
    assert "### TensorRT plugins" in text and BACKEND_CONFIG in text and load.digest in text
    page = html.unescape(card.to_html(report, {}))
    assert 'data-field="plugins"' in page and f"{release.server}</pre>" in page
    assert "initMine('mine') is not called" in page and "triton/gpu.plugins/libmine.so, sha256" in page


def test_no_plugins_ship_nothing_and_the_card_says_nothing(tmp_path):
    release = released(tmp_path)
    assert ship_plugins(release, [], tmp_path) == [] and release.plugins == [] and release.server == ""
    assert "TensorRT plugins" not in card.markdown(ReleaseReport(model_name="clip", rule=RULE, targets=[release],
                                                                 lineage=[]), {})
    assert not (tmp_path / "triton").exists()


def test_a_library_changed_since_the_key_or_two_of_one_name_fail_in_one_line(tmp_path):
    load = library_load(tmp_path)
    Path(load.file).write_bytes(b"edited")
    with pytest.raises(StageError, match=r"plugins\[0\] \(library lib/libmine.so \(entry initMine\)\) changed since"):
        ship_plugins(released(tmp_path), [load], tmp_path / "a")
    twice = [library_load(tmp_path), library_load(tmp_path).model_copy(update={"key": "plugins[1]"})]
    with pytest.raises(StageError, match="another declared plugin library is also named libmine.so"):
        ship_plugins(released(tmp_path), twice, tmp_path / "b")


# --- the pipeline: prepare -> build -> release with the Python plugin ----------------------------------------------

@pytest.mark.slow
@pytest.mark.tensorrt
def test_a_python_plugin_release_warns_in_one_line_and_the_card_says_stock_triton_cannot_serve_it(repo):
    """The runner declares the plugins to the release (its row ships them) as to the stages that build."""
    out = run_all(pipeline(repo, stages=RELEASE))
    report = json.loads((out["release"] / "report.json").read_text())
    (target,) = report["targets"]
    (shipped,) = target["plugins"]
    assert shipped["python"] == "clip_plugin" and shipped["file"] is None
    assert shipped["sha256"] == sha256(repo / "clip_plugin.py")
    (said,) = [w for w in report["warnings"] if "Python plugin" in w]
    assert "\n" not in said and said.endswith("Triton's TensorRT backend loads plugin libraries only, so stock "
                                              "Triton cannot serve it")
    assert not list((out["release"] / "triton").glob("*.plugins"))  # no library to copy
    text = (out["release"] / "card" / "model-card.md").read_text()
    assert "the engine is not servable by stock Triton with it" in text and "--backend-config" not in text
    page = html.unescape((out["release"] / "card" / "model-card.html").read_text())
    assert "the serving process must import clip_plugin (registering its creators)" in page


@pytest.mark.slow
@pytest.mark.tensorrt
def test_an_edited_plugin_releases_again(repo):
    """An edited plugin moves the release's key: its own plugins' digests (its row ships them), and the engines
    rebuilt with the plugin."""
    path = pipeline(repo, stages=RELEASE)
    first = {name: o.key for name, o in run_outcomes(path).items()}
    (repo / "clip_plugin.py").write_text(PLUGIN + "\n# edited\n")
    second = {name: o.key for name, o in run_outcomes(path).items()}
    assert first["build"] != second["build"] and first["release"] != second["release"]
