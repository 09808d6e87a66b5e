"""The code and library versions that decide a built-in kind's output are in its cache key, pinned by the checked-in
code lock (flows/code.lock.json, flows/code_lock.py; issue #50): editing a technology module re-keys exactly the
kinds that import it once the lock is refreshed as "re-run", never when refreshed as "same outputs"; upgrading a
declared library re-keys the kinds that declare it; `plan` says which."""
from __future__ import annotations

import json
import shutil

import pytest
import tomllib

from tests.assets import PPOCR, ROOT
from trtflow.flows import code_lock, implementation, keys
from trtflow.flows.cli import main as cli
from trtflow.flows.runner import Runner
from trtflow.flows.store import LocalStore
from trtflow.pipelines.kinds import KINDS
from trtflow.pipelines.loader import load_pipeline


def test_the_lock_is_fresh():
    """Every kind's closure and every file's digest as the lock has them: a change of trtflow's code comes with a
    deliberate refresh of the lock (its commit says which: the same outputs, or a re-run)."""
    moved = code_lock.stale(code_lock.load(), code_lock.scan())
    assert not moved, ("trtflow's code moved from flows/code.lock.json:\n  " + "\n  ".join(moved)
                       + f"\nrefresh it: {code_lock.REFRESH}")


def test_the_key_holds_the_locks_digests_and_the_declared_libraries():
    lock = code_lock.load()
    for kind, row in KINDS.items():
        spec = row.params.model_validate({"kind": kind, **MINIMAL.get(kind, {})})
        impl = implementation.resolve(spec)
        assert impl.code == {"files": lock.kinds[kind].keyed,
                             "libraries": {lib: code_lock.library_version(lib) for lib in row.libraries}}, kind
        parts = keys.key_parts(kind, impl.version, {}, {}, None, None, impl.code)
        assert keys.KeyParts.model_validate(parts).trtflow.files == lock.kinds[kind].keyed
    assert lock.kinds["prepare"].keyed["stages/onnx/simplifier.py"] == lock.files["stages/onnx/simplifier.py"]


def test_a_stage_is_keyed_without_importing_its_module_and_the_lock_holds_its_version(tmp_path):
    """`trtflow run` and `plan` key every stage before any runs: the key's `version` is the lock's, read from the
    stage module's `VERSION = "..."` without importing it (the modules import OpenCV, ONNX Runtime: 0.4 s of the
    command's start); the stage process imports the module to run it. The lock's version is the module's own."""
    import subprocess
    import sys

    script = f"""
import importlib, json, sys
from trtflow.flows import code_lock, implementation
from trtflow.pipelines.kinds import KINDS
minimal = {MINIMAL!r}
impls = {{k: implementation.resolve(row.params.model_validate({{"kind": k, **minimal.get(k, {{}})}}))
          for k, row in KINDS.items()}}
imported = sorted(m for m in sys.modules if m.startswith("trtflow.stages.") and m.endswith(".stage"))
versions = {{k: i.version for k, i in impls.items()}}
modules = {{k: str(importlib.import_module(row.module).VERSION) for k, row in KINDS.items()}}
print(json.dumps({{"imported": imported, "versions": versions, "modules": modules,
                  "report": implementation.stage_code(impls["build"].module).report.__name__,
                  "run": impls["build"].run.module}}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                    cwd=tmp_path).stdout)
    assert out["imported"] == [], out["imported"]
    assert out["versions"] == out["modules"] and set(out["versions"]) == set(KINDS), out
    assert out["report"] == "BuildReport" and out["run"] == KINDS["build"].module


MINIMAL = {"parity": {"images": "data/*.png", "deploy": [{"read": "rgb"}], "training": {"callable": "m:f"}},
           "calibrate": {"data": {"images": "data/*.png"}}}


# --- a technology module edited: the kinds re-keyed ------------------------------------------------------------

# by hand, from the imports: the kinds whose code imports each module (directly or not)
IMPORTED_BY = {
    "stages/ort/calibration.py": ["calibrate"],
    "stages/onnx/simplifier.py": ["prepare"],
    "stages/trtexec/log.py": ["benchmark"],
    "stages/compare/plots.py": ["benchmark", "validate"],  # each draws its own plots
    # calibrate: its FP16 remainder; no kind through another's report (reports import only record types)
    "stages/onnx/fp16.py": ["calibrate", "precision", "validate"],
    # run in a child process (`child.call("trtflow.stages.trt.build_worker", ...)`), never imported
    "stages/trt/build_worker.py": ["build", "validate"],
    # every kind that reads sample data through the declared preprocessing; the release also ships its source
    "stages/image/preprocess.py": ["benchmark", "calibrate", "parity", "precision", "prepare", "release", "validate"],
}


def _keys() -> dict[str, str]:
    """Each built-in kind's key on fixed parameters and inputs: what its code part makes of it."""
    out = {}
    for kind, row in KINDS.items():
        facts = code_lock.key_facts(row)
        out[kind] = keys.stage_key(keys.key_parts(kind, "1", {}, {"model": "ab" * 32}, None, None, facts))
    return out


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    return tmp_path_factory.mktemp("code")


@pytest.fixture
def tree(copies, monkeypatch):
    """A copy of trtflow's stages/ and of the lock, which the code lock reads instead of the real ones (made again
    for each test at the same place, file times kept: the code lock's parse of each unedited file is reused)."""
    shutil.rmtree(copies / "stages", ignore_errors=True)
    shutil.copytree(ROOT / "stages", copies / "stages", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(code_lock.LOCK, copies / "code.lock.json")
    monkeypatch.setattr(code_lock, "STAGES", copies / "stages")
    monkeypatch.setattr(code_lock, "LOCK", copies / "code.lock.json")
    return copies


def _lock(*args: str) -> int:
    return code_lock.main([*args, "--lock", str(code_lock.LOCK)])


@pytest.mark.slow
@pytest.mark.parametrize("module", sorted(IMPORTED_BY))
def test_a_module_edited_and_rerun_rekeys_exactly_the_kinds_that_import_it(tree, module, capsys):
    assert sorted(k for k, entry in code_lock.load().kinds.items() if module in entry.files) \
        == IMPORTED_BY[module]
    before = _keys()
    with open(tree / module, "a") as f:
        f.write("\nTUNED = 2  # an edit that changes what the module computes\n")
    assert _lock() == 1 and f"{module}: edited" in capsys.readouterr().out
    assert _keys() == before, "a stale lock keys what it pinned"
    assert _lock("--rerun") == 0
    assert f"re-keys {', '.join(IMPORTED_BY[module])}" in capsys.readouterr().out
    after = _keys()
    assert sorted(k for k in KINDS if after[k] != before[k]) == IMPORTED_BY[module]
    assert _lock() == 0


@pytest.mark.slow
def test_same_outputs_keeps_every_key_and_rerun_of_a_named_file_moves_its_kinds(tree, capsys):
    before = _keys()
    for module in ("stages/ort/calibration.py", "stages/trt/env.py"):
        with open(tree / module, "a") as f:
            f.write("\n# a comment: the same outputs\n")
    assert _lock("--same-outputs") == 0 and "no key moves" in capsys.readouterr().out
    assert _lock() == 0 and _keys() == before
    lock = code_lock.load()
    assert lock.kinds["calibrate"].keyed["stages/ort/calibration.py"] \
        != lock.files["stages/ort/calibration.py"], "the key keeps the digest of the last re-run"
    # a later edit of one of them, refreshed as a re-run of that file alone: the other keeps its keyed digest
    with open(tree / "stages/ort/calibration.py", "a") as f:
        f.write("\nTUNED = 3\n")
    assert _lock("--rerun", "stages/ort/calibration.py") == 0
    after = _keys()
    assert sorted(k for k in KINDS if after[k] != before[k]) == ["calibrate"]
    lock = code_lock.load()
    assert lock.kinds["build"].keyed["stages/trt/env.py"] != lock.files["stages/trt/env.py"]
    assert _lock("--rerun", "stages/nowhere.py") == 2


@pytest.mark.slow
def test_a_module_a_kind_starts_importing_enters_its_key_on_a_rerun_only(tree, capsys):
    before = _keys()
    with open(tree / "stages/parity/stage.py", "a") as f:
        f.write("\nfrom trtflow.stages.trtexec import log as _log  # noqa\n")
    assert _lock() == 1 and "kind parity: now imports stages/trtexec/log.py" in capsys.readouterr().out
    assert _lock("--same-outputs") == 0 and _keys() == before
    assert "stages/trtexec/log.py" in code_lock.load().kinds["parity"].files
    assert "stages/trtexec/log.py" not in code_lock.load().kinds["parity"].keyed
    with open(tree / "stages/parity/stage.py", "a") as f:
        f.write("\nTUNED = 1\n")
    assert _lock("--rerun") == 0
    assert "stages/trtexec/log.py" in code_lock.load().kinds["parity"].keyed
    assert sorted(k for k, v in _keys().items() if v != before[k]) == ["parity"]


# --- libraries ---------------------------------------------------------------------------------------------------

def test_every_deciding_library_a_kind_imports_is_declared_in_its_row():
    tree = code_lock.scan()
    known = set(code_lock.DECIDING.values())
    for kind, row in KINDS.items():
        imported = {code_lock.DECIDING[m] for m in tree.kinds[kind].imports if m in code_lock.DECIDING}
        assert imported <= set(row.libraries), f"{kind} imports {sorted(imported - set(row.libraries))}: " \
                                               f"declare them in its row (pipelines/params/{kind}.py, libraries=)"
        assert set(row.libraries) <= known, f"{kind} declares {sorted(set(row.libraries) - known)}"
    assert code_lock.library_version("no-such-distribution-for-trtflow") == code_lock.ABSENT


@pytest.fixture
def versions(monkeypatch):
    """Fixed library versions, changed by the test."""
    fixed = {lib: "1.0" for row in KINDS.values() for lib in row.libraries} | {"onnxruntime": "1.32.0"}
    monkeypatch.setattr(code_lock, "library_version", lambda name: fixed[name])
    return fixed


DECLARED_BY = {  # by hand, from the rows
    "onnxruntime": sorted(KINDS), "onnxsim": ["prepare"], "torchvision": ["parity"],
    "opencv-python-headless": ["benchmark", "calibrate", "parity", "precision", "prepare", "release", "validate"],
}


@pytest.mark.parametrize("library", sorted(DECLARED_BY))
def test_upgrading_a_declared_library_rekeys_the_kinds_that_declare_it(versions, library):
    before = _keys()
    row = KINDS[DECLARED_BY[library][-1]]
    old_parts = keys.KeyParts.model_validate(keys.key_parts(row.name, "1", {}, {}, None, None,
                                                            code_lock.key_facts(row)))
    old, versions[library] = versions[library], "1.33.0"
    after = _keys()
    assert sorted(k for k in KINDS if after[k] != before[k]) == DECLARED_BY[library] \
        == sorted(k for k, r in KINDS.items() if library in r.libraries)
    new_parts = keys.key_parts(row.name, "1", {}, {}, None, None, code_lock.key_facts(row))
    last = keys.LastRun(key=before[row.name], parts=old_parts, params={})
    assert keys.why_stale(last, keys.stage_key(new_parts), keys.KeyParts.model_validate(new_parts), str) \
        == f"{library} {old} -> 1.33.0"


# --- why_stale and plan ----------------------------------------------------------------------------------------

def _parts(files: dict[str, str], libraries: dict[str, str], fmt: int | None = None) -> keys.KeyParts:
    parts = keys.key_parts("calibrate", "1", {}, {}, None, None, {"files": files, "libraries": libraries})
    if fmt is not None:
        parts["format"] = fmt
        del parts["trtflow"]
    return keys.KeyParts.model_validate(parts)


def test_why_stale_names_the_files_and_libraries_that_moved():
    files = {f"stages/ort/m{i}.py": "0" * 16 for i in range(6)}
    old = _parts(files, {"onnx": "1.23.2", "onnxruntime": "1.32.0"})
    new = _parts({**files, "stages/ort/m1.py": "1" * 16, "stages/ort/m4.py": "1" * 16},
                 {"onnx": "1.23.2", "onnxruntime": "1.33.0"})
    last = keys.LastRun(key="a" * 32, parts=old, params={})
    assert keys.why_stale(last, "b" * 32, new, str) \
        == "code changed (stages/ort/m1.py, stages/ort/m4.py); onnxruntime 1.32.0 -> 1.33.0"
    many = _parts({f: "2" * 16 for f in list(files)[1:]} | {"stages/ort/new.py": "2" * 16}, {"onnx": "1.23.2"})
    assert keys.why_stale(last, "b" * 32, many, str) == (
        "code changed (stages/ort/m0.py, stages/ort/m1.py, stages/ort/m2.py, and 4 more); onnxruntime left the key")
    # a record of KEY_FORMAT 2 has no code part: the format is the reason, not every file
    older = keys.LastRun(key="a" * 32, parts=_parts({}, {}, fmt=2), params={})
    assert keys.why_stale(older, "b" * 32, new, str) == "trtflow's key format changed"


@pytest.fixture
def pipeline(tmp_path):
    shutil.copy(PPOCR, tmp_path / "cls.onnx")
    (tmp_path / "pipeline.yaml").write_text("version: 1\nname: code\nmodel: cls.onnx\n"
                                            "stages:\n  prepare: {kind: prepare, preflight: off}\n")
    return tmp_path / "pipeline.yaml"


def test_plan_names_the_code_and_the_library_that_changed(pipeline, tmp_path, monkeypatch, capsys):
    """A prepare stage as last run with today's lock and libraries, then planned with an edit of
    stages/ort/runner.py refreshed as a re-run and onnxsim upgraded."""
    runner = Runner(load_pipeline(pipeline), store=LocalStore(tmp_path / "store"))
    r = runner.resolve("prepare", {}, fetch=False)
    assert r.parts.trtflow is not None and "stages/ort/runner.py" in r.parts.trtflow.files
    runner.store.mark_last("prepare", keys.LastRun(key=r.key, parts=r.parts))
    lock = code_lock.load().model_copy(deep=True)
    for entry in lock.kinds.values():
        if "stages/ort/runner.py" in entry.keyed:
            entry.keyed["stages/ort/runner.py"] = "f" * 16
    lock.write(tmp_path / "code.lock.json")
    monkeypatch.setattr(code_lock, "LOCK", tmp_path / "code.lock.json")
    real = code_lock.library_version
    monkeypatch.setattr(code_lock, "library_version", lambda name: "9.9.9" if name == "onnxsim" else real(name))
    (item,) = Runner(load_pipeline(pipeline), store=LocalStore(tmp_path / "store")).plan()
    assert item.action == "run"
    assert item.reason == f"code changed (stages/ort/runner.py); onnxsim {real('onnxsim')} -> 9.9.9"
    assert cli(["plan", str(pipeline), "--store", str(tmp_path / "store"), "--json"]) == 0
    (stage,) = json.loads(capsys.readouterr().out)["stages"]
    assert stage["reason"] == item.reason


# --- what the closure holds beyond imports, and the package ------------------------------------------------------

def test_the_sources_the_release_ships_are_in_its_closure():
    from trtflow.stages.release.triton.preprocess import VENDORED

    shipped = set(code_lock.SHIPPED["stages/release/triton/preprocess.py"])
    assert shipped == {f"stages/image/{m}.py" for m in VENDORED}
    assert shipped <= set(code_lock.load().kinds["release"].files)


def test_user_kinds_have_no_code_part_and_the_lock_installs_with_the_package():
    from trtflow.pipelines.kinds import USER

    assert USER.libraries == ()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "code.lock.json" in data["trtflow.flows"]
