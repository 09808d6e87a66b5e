"""The user's own code named in a pipeline file (`package.module:function`): imported, and fingerprinted so that
editing it re-runs the stages that use it, like DVC's dependency on code."""
from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
from typing import Any, Callable

from trtflow.errors import StageError


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
        return hashlib.sha256(inspect.getsource(func).encode()).hexdigest()[:16]
    except (OSError, TypeError):
        return "unknown"


def _resolve(ref: str, what: str) -> Callable[..., Any]:
    module_name, _, func_name = ref.partition(":")
    if module_name.split(".")[0] in sys.stdlib_module_names:
        raise StageError(f"{what}: '{ref}' is in Python's standard library, not a function of your project's: "
                         f"name your own package.module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the user's module failing at import
        raise StageError(f"cannot import '{module_name}' for {what}: {type(exc).__name__}: {exc}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise StageError(f"'{module_name}' has no function '{func_name}' ({what})")
    return func
