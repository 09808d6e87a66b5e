"""The user's own code named in a pipeline file (`package.module:function`): imported, and fingerprinted so that
editing it re-runs the stages that use it, like DVC's dependency on code."""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from trtflow import depends
from trtflow.errors import StageError

# The folders of the pipelines loaded in this process: the user's own code (kind: userstages.slow:run, callables)
# lives beside the pipeline file in the model repo, importable without PYTHONPATH. They are put on sys.path only
# while that code is imported here (appended: never shadowing an installed package), and for good only in a
# stage's own process (`search_path`).
_CODE_DIRS: list[str] = []


def code_beside(pipeline_file: Path) -> None:
    """The pipeline file's folder holds code its stages name."""
    folder = str(pipeline_file.resolve().parent)
    if folder not in _CODE_DIRS:
        _CODE_DIRS.append(folder)


def search_path() -> list[str]:
    """sys.path with the pipelines' folders after it: what a stage's process imports from."""
    return list(sys.path) + [d for d in _CODE_DIRS if d not in sys.path]


@contextlib.contextmanager
def _importable() -> Iterator[None]:
    saved = list(sys.path)
    sys.path[:] = search_path()
    try:
        yield
    finally:
        sys.path[:] = saved


def import_callable(ref: str, what: str, arguments: int) -> Callable[..., Any]:
    """The function `package.module:function` names, checked to be what the pipeline declares before anything is
    handed to it: the user's own code (not the standard library's: `runpy:run_path` or `os:remove` would run or
    delete the files it is given) taking `arguments` positional arguments."""
    func = _resolve(ref, what)
    try:
        inspect.signature(func).bind(*range(arguments))
    except (TypeError, ValueError) as exc:
        raise StageError(f"{what} '{ref}' cannot be called with {arguments} argument(s) ({exc})") from None
    return func


def source_digest(ref: str) -> str:
    """sha256 (16 hex digits) of the function's source, or "unknown" where Python cannot show it."""
    func = _resolve(ref, ref)
    try:
        depends.READ.file(inspect.getsourcefile(func) or "")
        return hashlib.sha256(inspect.getsource(func).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return "unknown"


def _resolve(ref: str, what: str) -> Callable[..., Any]:
    module_name, _, func_name = ref.partition(":")
    if module_name.split(".")[0] in sys.stdlib_module_names:
        raise StageError(f"{what}: '{ref}' is in Python's standard library, not a function of your project's: "
                         f"name your own package.module:function")
    depends.READ.import_path(search_path())  # where the module is looked for: a new one anywhere shadows it
    try:
        with _importable():
            module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the user's module failing at import
        raise StageError(f"cannot import '{module_name}' for {what}: {type(exc).__name__}: {exc}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise StageError(f"'{module_name}' has no function '{func_name}' ({what})")
    return func


def package_sources(module: str) -> dict[str, str]:
    """An installed kind's code in its key: every `.py` file of the top-level package holding `module` (its
    contract, stage module, report and helpers), path within the package -> sha256 (16 hex digits); each read
    into the keys' ledger, the package's folders by their listing (a file added is a change)."""
    loaded = importlib.import_module(module.partition(".")[0])
    out: dict[str, str] = {}
    for folder in map(Path, getattr(loaded, "__path__", [])):
        depends.READ.tree(folder)
        for path in sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts):
            depends.READ.file(path)
            out[path.relative_to(folder.parent).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return out
