"""What trtflow installs lives under one import name, `trtflow`, so a model repo's own `flows/`, `pipelines/` or
`stages/` packages (the usual Prefect layout) neither hide trtflow's nor are hidden by them."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.assets import PPOCR, ROOT
from trtflow.pipelines.kinds import KINDS

# repository folder -> the import package it installs as (pyproject.toml's package-dir)
FOLDERS = {"trtflow": "trtflow", "pipelines": "trtflow/pipelines", "flows": "trtflow/flows", "stages": "trtflow/stages"}


def _sources() -> dict[str, Path]:
    """Every Python module of the product, by the path it must have inside the wheel."""
    return {f"{FOLDERS[folder]}/{p.relative_to(ROOT / folder).as_posix()}": p
            for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts}


@pytest.mark.slow
def test_the_wheel_holds_every_module_under_trtflow(tmp_path):
    src = tmp_path / "src"  # build from a copy: an in-tree build would write build/ and *.egg-info here
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("trtflow-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    modules = {n for n in names if n.endswith(".py")}
    assert modules and all(n.startswith("trtflow/") for n in modules), sorted(modules)
    missing = set(_sources()) - modules
    assert not missing, f"modules left out of the wheel (a subpackage missing from pyproject's packages?): {missing}"
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "trtflow = trtflow.flows.cli:main" in text


@pytest.mark.slow
def test_no_module_imports_the_repository_folders_by_their_own_names():
    """`import stages` works in this checkout only by accident (the repository root is on sys.path)."""
    bad = []
    for name, path in _sources().items():
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            bad += [f"{name}: {m}" for m in mods if m.split(".")[0] in ("flows", "pipelines", "stages")]
    assert not bad, bad


# layer -> the trtflow packages it may not import (arrows run downward: trtflow < pipelines < stages < flows)
FORBIDDEN = {
    "trtflow": ("trtflow.pipelines", "trtflow.stages", "trtflow.flows", "prefect"),
    "trtflow/metrics": ("trtflow.pipelines", "trtflow.stages", "trtflow.flows", "prefect"),
    "trtflow/pipelines": ("trtflow.stages", "trtflow.flows", "prefect"),
    "trtflow/stages": ("trtflow.flows", "prefect"),
}
KIND_PACKAGES = tuple(f"trtflow.stages.{k}" for k in KINDS)


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return found


def _package(module: str) -> str | None:
    """The kind package a module name is in (trtflow.stages.release.triton.config -> trtflow.stages.release)."""
    return next((p for p in KIND_PACKAGES if module == p or module.startswith(p + ".")), None)


@pytest.mark.slow
def test_imports_run_downward_only():
    """Layers import downward; shared technology (`stages/ort/`, `trt/`, ...) imports no kind, not even its
    parameters (issue #70: trtexec's command line took the benchmark's); a kind imports another kind only for the
    report that kind writes (the contract a stage reads its inputs by)."""
    bad = []
    for name, path in _sources().items():
        layer = next((lay for lay in sorted(FORBIDDEN, key=len, reverse=True)
                      if name.startswith(lay + "/") and (lay != "trtflow" or name.count("/") == 1)), None)
        own = _package(name.removesuffix(".py").replace("/", "."))
        technology = name.startswith("trtflow/stages/") and name.count("/") >= 3 and own is None
        for mod in _imports(path):
            if layer and mod.startswith(FORBIDDEN[layer]):
                bad.append(f"{name} imports {mod}")
            if technology and mod.startswith("trtflow.pipelines.params"):
                bad.append(f"{name} (shared technology) imports a kind's parameters {mod}")
            other = _package(mod)
            if other is None:
                continue
            if technology:
                bad.append(f"{name} (shared technology) imports the kind {mod}")
            elif own and other != own and not mod.startswith(f"{other}.report"):
                bad.append(f"{name} (the {own.rsplit('.', 1)[1]} kind) imports another kind's {mod}")
    assert not bad, bad


@pytest.mark.slow
def test_no_import_circles_even_through_imports_inside_functions():
    """Issue #70: a circle hidden by an import inside a function (store <-> remote_store, task_metrics <->
    detections) is still two modules that cannot be read, or changed, one without the other."""
    import graphlib

    modules = {name.removesuffix(".py").removesuffix("/__init__").replace("/", "."): path
               for name, path in _sources().items()}
    graph = {m: {i for i in _imports(path) if i in modules and i != m} for m, path in modules.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as circle:
        pytest.fail(f"an import circle: {' -> '.join(circle.args[1])}", pytrace=False)


def test_stages_top_level_is_the_kinds_folders_and_the_map_names_every_folder():
    top = {p.name for p in (ROOT / "stages").iterdir() if p.name not in ("__init__.py", "__pycache__")}
    assert not [n for n in top if n.endswith(".py")], "stages/ holds folders only: a kind's or a technology's"
    kinds = {n for n in top if (ROOT / "stages" / n / "stage.py").exists()}
    assert kinds == set(KINDS)
    assert {p.stem for p in (ROOT / "pipelines" / "params").glob("*.py") if p.stem != "__init__"} == {*KINDS, "custom"}
    where = (ROOT / "docs" / "layout.md").read_text()
    missing = [f"{n}/" for n in top if f"`{n}/`" not in where]
    missing += [f"{p.name}" for p in (ROOT / "flows").iterdir() if p.suffix == ".py" and p.stem != "__init__"
                and f"`{p.name}`" not in where]
    assert not missing, f"the map (docs/layout.md) does not name {missing}"


@pytest.mark.slow
def test_a_model_repo_with_its_own_flows_pipelines_and_stages(tmp_path):
    repo = tmp_path / "repo"
    for pkg in ("flows", "pipelines", "stages"):
        (repo / pkg).mkdir(parents=True)
        (repo / pkg / "__init__.py").write_text("MARK = 'the user\\'s own'\n")
    (repo / "flows" / "pipeline_flow.py").write_text("raise ImportError('this is the repo\\'s flows package')\n")
    (repo / "stages" / "base.py").write_text("raise ImportError('this is the repo\\'s stages package')\n")
    (repo / "models").mkdir()
    shutil.copy(PPOCR, repo / "models" / "cls.onnx")
    (repo / "pipeline.yaml").write_text("version: 1\nname: repo\nmodel: models/cls.onnx\n"
                                        "stages:\n  prepare: {kind: prepare, preflight: off}\n")
    # the repository first on sys.path, as for a Prefect worker started in it
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}, "PYTHONPATH": str(repo),
           "PREFECT_HOME": str(tmp_path / ".prefect")}

    def python(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True,
                              timeout=300)

    validate = python("-m", "trtflow.flows.cli", "validate", "pipeline.yaml")
    assert validate.returncode == 0, validate.stderr
    assert "pipeline.yaml is valid" in validate.stdout

    entry = python("-c", "from prefect.flows import load_flow_from_entrypoint\n"
                         "flow = load_flow_from_entrypoint('trtflow.flows.pipeline_flow:pipeline_flow')\n"
                         "import flows, stages\n"
                         "print(flow.fn.__module__, flows.MARK, stages.MARK, sep='|')")
    assert entry.returncode == 0, entry.stderr
    assert entry.stdout.strip().splitlines()[-1] == "trtflow.flows.pipeline_flow|the user's own|the user's own"


def _literal_key_reads(path: Path) -> int:
    """`x["key"]`, `.get("key")`, `.pop("key")`, `.setdefault("key")` with a string constant (Literal[...] aside)."""
    count = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            count += not (isinstance(node.value, ast.Name) and node.value.id in ("Literal", "Annotated"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "pop", "setdefault") and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            count += 1
    return count


LITERAL_KEY_READS = 100  # 840 before records became models (#40); what is left reads JSON, YAML, os.environ


@pytest.mark.slow
def test_records_are_read_through_their_models_not_by_literal_key():
    counts = {name: n for name, path in _sources().items() if (n := _literal_key_reads(path))}
    assert sum(counts.values()) <= LITERAL_KEY_READS, sorted(counts.items(), key=lambda kv: -kv[1])[:15]


def test_no_function_is_more_complex_than_twelve():
    """Issue #52: a function deciding more than twelve ways is split into steps a reader can hold (ruff's C901,
    mccabe's count, over the product's folders)."""
    found = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "C901", "--config",
                            "lint.mccabe.max-complexity=12", "--output-format", "concise", "flows", "stages",
                            "pipelines", "trtflow"], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 0, found.stdout + found.stderr


@pytest.mark.slow
def test_nothing_edits_an_errors_message():
    """Issue #52: the layers above a stage add typed fields to its error (`TrtflowError.tell`, rendered by
    `Failure`); none rewrites the message the error was made with (only unpickling rebuilds one, in errors.py)."""
    found = []
    for name, path in _sources().items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == "args":
                    found.append(f"{name}:{node.lineno}")
    assert found == ["trtflow/errors.py:" + str(next(
        i for i, line in enumerate((ROOT / "trtflow" / "errors.py").read_text().splitlines(), 1)
        if line.strip() == "error.args = args"))]


def test_flows_import_no_kind():
    """Issue #52: what a kind decides reaches the flow layer as typed decisions (trtflow/decisions.py), so no module
    of flows/ imports a kind's own package (not even for its records)."""
    bad = [f"{name} imports {mod}" for name, path in _sources().items() if name.startswith("trtflow/flows/")
           for mod in _imports(path) if _package(mod) is not None]
    assert bad == []


def test_flows_reach_a_stage_module_only_through_its_code():
    """Issue #70: the flow layer takes what a kind's stage module gives it from one typed object (its `CODE`, a
    StageCode): no `getattr` on a module there, where a misspelled name silently turned a check off."""
    bad = []
    for name, path in _sources().items():
        if not name.startswith("trtflow/flows/"):
            continue
        tree = ast.parse(path.read_text())
        modules = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _imports_a_module(node.value)
                   for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and node.args:
                target = node.args[0]
                if _imports_a_module(target) or (isinstance(target, ast.Name) and target.id in modules):
                    bad.append(f"{name}:{node.lineno}")
    assert bad == []


def _imports_a_module(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
        "import_module", "__import__")
