"""The code and the library versions that decide what a built-in kind produces, in its cache key (issue #50), pinned
by a checked-in lock (`code.lock.json`, beside this module), as `dvc.lock` pins a DVC stage's dependencies.

What a kind's key holds (`keys.key_parts`, the part `trtflow`): a digest per source file of the kind's *closure* and
the version of each library its row declares (`Kind.libraries`, in `pipelines/params/<kind>.py`).

The closure of a kind, found statically (AST, no import): every `.py` file of its own folder (`stages/<kind>/`), then,
transitively, every module under `trtflow.stages` or `trtflow.metrics` (the task metrics, `metrics/` in the lock)
those files name: `import` and `from ... import` statements anywhere in a file (inside functions too; relative ones
resolved; `from package import module` names the module), a string constant that is a module's dotted name
(`child.call("trtflow.stages.trt.build_worker", ...)` runs a module in a child process without importing it), the
`__init__.py` of every package on the way (unless it is nothing but its docstring), every module of a folder whose
`__init__.py` lists and imports them (`pkgutil.iter_modules`: the built-in metrics), and the modules a module copies
into its output as text (`SHIPPED`: the release ships the image preprocessing's source to Triton). Another kind's
folder is in the closure as far as it is imported (the release reads `stages/benchmark/report.py`).

What is left out, and why: trtflow's core helpers (`trtflow/*.py`: files, child processes, progress, paths, errors,
markdown) move bytes and report, they decide no result; the parameter models (`pipelines/params/<kind>.py`) enter
the key through the parameters themselves, defaults included (`pipelines/schema.py` `StageBase.key_params`), and the
kind's `VERSION` stays the semantic override it always was. Libraries whose
arithmetic every kind shares and which decide no method (numpy, scipy) are left out too, see `DECIDING`; the
TensorRT flavour and version are the environment facet `tensorrt` of the kinds whose row asks for it.

The lock (`code.lock.json`): `files`, each closure file's digest as the tree has it now (sha256 of its bytes, line
ends as LF, 16 hex digits); per kind, `files` (its closure), `libraries` (its row's), `version` (its stage module's
`VERSION`, read from its source) and `keyed`: the digest of each file as its key holds it. The key reads `keyed` and
`version` from the lock; nothing is hashed, and no stage module imported, to key a stage at run time. A test
(tests/test_code_key.py) fails when the tree moved from the lock, so each change of the code is followed by a
deliberate refresh whose commit says which it is:

    python -m trtflow.flows.code_lock                     # check: what moved; exit 1 if the lock is stale
    python -m trtflow.flows.code_lock --same-outputs      # the change makes the same outputs: no key moves
    python -m trtflow.flows.code_lock --rerun [FILE ...]  # it changes outputs: the kinds whose closure holds
                                                          # FILE (default: every file that moved) are re-keyed

`--same-outputs` (a comment, a rename, a refactor, a better error message) records the new digests and closures and
keeps every `keyed` entry, so every stored result stays found. `--rerun` sets `keyed` to the new digest of the named
files (or of every file that moved since the lock, and then also adds to `keyed` the files a closure gained and
drops those it lost), so the kinds that import them run again; it prints which kinds it re-keys. A kind new to the
lock is keyed on its whole closure either way.
"""
from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import importlib.metadata as md
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict

import trtflow.metrics
import trtflow.stages
from trtflow import depends
from trtflow.pipelines.kinds import BUILT_IN_KINDS
from trtflow.pipelines.row import Kind

# The packages whose source decides what a kind produces: import name -> its folder's name in the lock's paths
KEYED = {"trtflow.stages": "stages", "trtflow.metrics": "metrics"}
STAGES = Path(trtflow.stages.__file__).resolve().parent  # the folder `stages/` of the lock's paths
METRICS = Path(trtflow.metrics.__file__).resolve().parent  # `metrics/`: the task metrics validate computes
LOCK = Path(__file__).resolve().with_name("code.lock.json")  # where the lock is read and written (tests move it)
LOCK_FORMAT = 1
REFRESH = "python -m trtflow.flows.code_lock --same-outputs (the same outputs) or --rerun [FILE ...] (re-run)"
ABSENT = "absent"  # the version of a declared library that is not installed

# The third-party libraries that decide what a stage produces, by the name a module imports -> the distribution a
# kind's row declares (its version enters the key). A kind whose closure imports one declares it (a test checks).
# Left out on purpose: numpy and scipy, the arithmetic every kind shares (element-wise IEEE operations and sparse
# products give the same numbers from one release to the next; the methods are the libraries' below); TensorRT,
# which is the environment facet `tensorrt`; what only reports or serves (pydantic, matplotlib's pictures, pynvml's
# telemetry, protobuf's file format, torch's CUDA allocator in stages/trt/runtime.py).
DECIDING = {
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "onnxsim": "onnxsim",
    "onnxconverter_common": "onnxconverter-common",
    "modelopt": "nvidia-modelopt",
    "cv2": "opencv-python-headless",
    "torchvision": "torchvision",  # parity's training references
    "PIL": "pillow",
    "skimage": "scikit-image",  # an image output's SSIM
    "pycocotools": "pycocotools",  # mAP against labelled boxes
}
# A declared distribution -> the distributions that install the same module (the first installed gives the version)
SAME_MODULE = {
    "opencv-python-headless": ("opencv-python-headless", "opencv-python", "opencv-contrib-python-headless",
                               "opencv-contrib-python"),
}
# Module file -> the modules whose source it copies into its output (no import names them)
SHIPPED = {
    "stages/release/triton/preprocess.py": ("stages/image/preprocess.py", "stages/image/resample.py",
                                            "stages/image/steps.py"),
}


# --- the closure, from the source tree -----------------------------------------------------------------------------

def _folders() -> dict[str, Path]:
    """The keyed packages' folders by their name in the lock (read when called: tests point them at copies)."""
    return {"stages": STAGES, "metrics": METRICS}


def rel(path: Path) -> str:
    """A source file's name in the lock: `stages/ort/calibration.py`, `metrics/builtin/topk.py`."""
    name, folder = next((n, f) for n, f in _folders().items() if path.is_relative_to(f))
    return f"{name}/{path.relative_to(folder).as_posix()}"


def source(name: str) -> Path:
    """The file a lock's name names."""
    folder, _, rest = name.partition("/")
    return _folders()[folder] / rest


def _keyed(module: str) -> str | None:
    """The keyed package a module is in, or None."""
    return next((p for p in KEYED if module == p or module.startswith(p + ".")), None)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes().replace(b"\r\n", b"\n")).hexdigest()[:16]


def _module_file(module: str) -> Path | None:
    """The file of a module under a keyed package (a package's `__init__.py`); None for anything else."""
    package = _keyed(module)
    if package is None:
        return None
    root = _folders()[KEYED[package]]
    base = root.joinpath(*module.split(".")[2:])
    for path in (base.with_suffix(".py") if base != root else None, base / "__init__.py"):
        if path is not None and path.is_file():
            return path
    return None


def _with_packages(module: str) -> list[Path]:
    """The module's file and the `__init__.py` of every package it is in (importing it runs them)."""
    parts = module.split(".")
    found = [_module_file(".".join(parts[:i])) for i in range(2, len(parts) + 1)]
    return [p for p in found if p is not None]


class _Source(NamedTuple):
    """What the closure reads of a source file."""
    ours: tuple[str, ...]  # the modules under the keyed packages it names
    theirs: tuple[str, ...]  # the top-level names of the other modules it imports
    # nothing but its docstring (a package's `__init__.py`, mostly): it decides no output, editing it re-keys
    # nothing; once it holds a statement, it is in the closure again
    docstring_only: bool
    # it lists its own folder's modules and imports them (`pkgutil.iter_modules`: trtflow/metrics/builtin/): every
    # module of its folder is imported by it
    lists_its_folder: bool


def _references(path: Path) -> _Source:
    st = path.stat()
    return _parsed(path, (st.st_mtime_ns, st.st_size))


@functools.cache
def _parsed(path: Path, stamp: tuple[int, int]) -> _Source:
    folder, _, inside = rel(path).partition("/")
    package = ".".join([next(p for p, f in KEYED.items() if f == folder), *Path(inside).parent.parts])
    ours: set[str] = set()
    lists = False
    theirs: set[str] = set()
    tree = ast.parse(path.read_bytes(), str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _keyed(node.value) is not None:
            dotted = node.value.partition(":")[0]  # a module run in a child, or a "module:function"
            names = [dotted] if all(p.isidentifier() for p in dotted.split(".")) else []
        elif isinstance(node, ast.Attribute) and node.attr == "iter_modules":
            lists = True
        for name in names:
            if _keyed(name) is not None:
                ours.add(name)
            elif name and not name.startswith("trtflow") and not (isinstance(node, ast.ImportFrom) and node.level):
                theirs.add(name.split(".")[0])
    said = tree.body[:1] if tree.body and isinstance(tree.body[0], ast.Expr) \
        and isinstance(tree.body[0].value, ast.Constant) else []
    return _Source(tuple(sorted(ours)), tuple(sorted(theirs)), len(tree.body) == len(said), lists)


def kind_folder(row: Kind) -> Path:
    """A built-in kind's own folder: the package of its row's module (`trtflow.stages.<kind>.stage`)."""
    package = (row.module or "").rpartition(".")[0]
    folder = _module_file(package)
    if folder is None or folder.name != "__init__.py":
        raise ValueError(f"kind '{row.name}': its module {row.module} is not in a package under trtflow.stages")
    return folder.parent


@dataclass
class Closure:
    files: list[str]  # the lock's names, sorted
    imports: set[str] = field(default_factory=set)  # top-level names of the third-party modules they import
    version: str | None = None  # the `VERSION` its stage module assigns


def stage_version(row: Kind) -> str | None:
    """The `VERSION = "..."` a built-in kind's stage module assigns at its top level, read without importing it
    (the key reads it from the lock: `trtflow run` and `plan` key every stage without importing its module)."""
    path = _module_file(row.module or "")
    tree = ast.parse(path.read_bytes(), str(path)) if path is not None else None
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["VERSION"] \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    return None


def closure(row: Kind) -> Closure:
    """The source files that decide what a built-in kind produces (see the module's docstring)."""
    todo = [p for p in sorted(kind_folder(row).rglob("*.py")) if "__pycache__" not in p.parts]
    todo += _with_packages((row.module or "").rpartition(".")[0])
    seen: set[Path] = set()
    imports: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        read = _references(path)
        imports |= set(read.theirs)
        for module in read.ours:
            todo += _with_packages(module)
        todo += [source(f) for f in SHIPPED.get(rel(path), ())]
        if read.lists_its_folder:
            todo += [p for p in sorted(path.parent.glob("*.py")) if p != path]
    return Closure(sorted(rel(p) for p in seen if not _references(p).docstring_only), imports, stage_version(row))


@dataclass
class Tree:
    """What the lock would say of the tree as it is: every closure file's digest, each kind's closure."""
    files: dict[str, str]
    kinds: dict[str, Closure]
    libraries: dict[str, list[str]]


def scan(kinds: dict[str, Kind] | None = None) -> Tree:
    kinds = BUILT_IN_KINDS if kinds is None else kinds
    closures = {name: closure(row) for name, row in sorted(kinds.items())}
    files = {f: file_digest(source(f)) for c in closures.values() for f in c.files}
    return Tree(dict(sorted(files.items())), closures,
                {name: sorted(row.libraries) for name, row in sorted(kinds.items())})


# --- the lock, read at run time --------------------------------------------------------------------------------

class Locked(BaseModel):
    """A kind in the lock: its closure, the digests its key holds, its row's libraries."""
    model_config = ConfigDict(extra="forbid")

    files: list[str] = []
    keyed: dict[str, str] = {}
    libraries: list[str] = []
    version: str | None = None  # its stage module's VERSION (the key's `version`)


class Lock(BaseModel):
    """`code.lock.json`."""
    model_config = ConfigDict(extra="forbid")

    format: int | None = None
    refresh: str = REFRESH
    files: dict[str, str] = {}  # closure file -> its digest in the tree
    kinds: dict[str, Locked] = {}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")


@functools.cache
def _read(path: str, stamp: tuple[int, int]) -> Lock:
    return Lock.model_validate_json(Path(path).read_text())


def load(path: Path | None = None) -> Lock:
    """The lock (read once per version of the file)."""
    path = LOCK if path is None else path
    try:
        st = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"trtflow's code lock {path} is missing: {REFRESH}") from None
    return _read(str(path), (st.st_mtime_ns, st.st_size))


def library_version(name: str) -> str:
    """The installed version of a declared distribution (or of one installing the same module); "absent". What
    it was read from (the whole import path, the metadata file found) goes to the ledger of what keys read."""
    version, metadata = _installed(name)
    depends.READ.import_path()
    if metadata is not None:
        depends.READ.file(metadata)
    return version


@functools.cache
def _installed(name: str) -> tuple[str, Path | None]:
    for dist in SAME_MODULE.get(name, (name,)):
        try:
            found = md.distribution(dist)
        except md.PackageNotFoundError:
            continue
        return found.version, depends.installed_metadata(found)
    return ABSENT, None


def locked_version(row: Kind) -> str | None:
    """A built-in kind's VERSION as the lock holds it; None for a kind the lock does not know yet."""
    return load().kinds.get(row.name, Locked()).version


def key_facts(row: Kind) -> dict[str, Any]:
    """The key's part `trtflow` for a built-in kind: its files as the lock keys them, its libraries' versions. A kind
    the lock does not know yet (a refresh will add it, a test says so) has no files."""
    entry = load().kinds.get(row.name, Locked())
    return {"files": dict(entry.keyed), "libraries": {name: library_version(name) for name in sorted(row.libraries)}}


# --- check and refresh -----------------------------------------------------------------------------------------

def moved_files(lock: Lock, tree: Tree) -> dict[str, str]:
    """file -> "edited" | "new" | "gone": closure files whose digest differs from the lock's."""
    old = lock.files
    out = {f: "edited" for f in tree.files if f in old and old[f] != tree.files[f]}
    out |= {f: "new" for f in tree.files if f not in old}
    out |= {f: "gone" for f in old if f not in tree.files}
    return dict(sorted(out.items()))


def stale(lock: Lock, tree: Tree) -> list[str]:
    """What moved from the lock, one line each; [] when it is fresh."""
    lines = [f"{f}: {what}" for f, what in moved_files(lock, tree).items()]
    for name in sorted(set(lock.kinds) | set(tree.kinds)):
        if name not in tree.kinds:
            lines.append(f"kind {name}: no longer built in")
            continue
        if name not in lock.kinds:
            lines.append(f"kind {name}: not in the lock")
            continue
        locked = lock.kinds[name]
        was, now = set(locked.files), set(tree.kinds[name].files)
        lines += [f"kind {name}: now imports {f}" for f in sorted(now - was)]
        lines += [f"kind {name}: no longer imports {f}" for f in sorted(was - now)]
        if locked.libraries != tree.libraries[name]:
            lines.append(f"kind {name}: libraries {locked.libraries} -> {tree.libraries[name]}")
        if locked.version != tree.kinds[name].version:
            lines.append(f"kind {name}: VERSION {locked.version} -> {tree.kinds[name].version}")
    if lock.format != LOCK_FORMAT:
        lines.append(f"lock format {lock.format} -> {LOCK_FORMAT}")
    return lines


def refresh(lock: Lock, tree: Tree, rerun: list[str] | None = None) -> Lock:
    """The lock for `tree`. `rerun` None: the same outputs (every `keyed` entry kept); [] every file that moved
    re-keys (and the closures of the kinds it re-keys enter and leave `keyed` whole); [files] those files re-key."""
    again = list(moved_files(lock, tree)) if rerun == [] else (rerun or [])
    kinds: dict[str, Locked] = {}
    for name, c in tree.kinds.items():
        current = {f: tree.files[f] for f in c.files}
        if name not in lock.kinds:
            keyed = current  # a kind new to the lock: nothing of it is stored anywhere yet
        else:
            keyed = dict(lock.kinds[name].keyed)
            for f in again:
                if f in current:
                    keyed[f] = current[f]
                else:
                    keyed.pop(f, None)
            if rerun == [] and any(f in current for f in again):  # a kind re-keyed takes its closure as it is
                keyed = {f: keyed.get(f, d) for f, d in current.items()}  # (another keeps what --same-outputs kept)
        kinds[name] = Locked(files=c.files, keyed=dict(sorted(keyed.items())), libraries=tree.libraries[name],
                             version=c.version)
    return Lock(format=LOCK_FORMAT, files=tree.files, kinds=kinds)


def rekeyed(old: Lock, new: Lock) -> list[str]:
    """The kinds whose key files differ between two locks."""
    return sorted(k for k, entry in new.kinds.items() if k not in old.kinds or old.kinds[k].keyed != entry.keyed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtflow.flows.code_lock",
                                     description="check or refresh trtflow's code lock (flows/code.lock.json)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--same-outputs", action="store_true",
                      help="record the tree as it is and keep every key: the change makes the same outputs")
    mode.add_argument("--rerun", nargs="*", metavar="FILE",
                      help="re-key the kinds whose closure holds FILE (stages/...; default: every file that moved)")
    parser.add_argument("--lock", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    path = args.lock or LOCK
    lock = Lock.model_validate_json(path.read_text()) if path.exists() else Lock()
    tree = scan()
    lines = stale(lock, tree)
    if not args.same_outputs and args.rerun is None:
        for line in lines:
            print(line)
        print(f"{path}: {'stale: ' + REFRESH if lines else 'fresh'}")
        return 1 if lines else 0
    if args.rerun:
        unknown = [f for f in args.rerun if f not in tree.files and f not in lock.files]
        if unknown:
            print(f"not in any kind's closure: {', '.join(unknown)}", file=sys.stderr)
            return 2
    new = refresh(lock, tree, None if args.same_outputs else args.rerun)
    new.write(path)
    for line in lines:
        print(line)
    again = rekeyed(lock, new)
    print(f"{path}: refreshed; " + (f"re-keys {', '.join(again)}" if again else "no key moves"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
