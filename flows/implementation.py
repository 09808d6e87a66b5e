"""The code that does a stage's work, found through its kind's row (`pipelines/kinds.py`): a `run` function, the
version that enters the cache key and the environment facts the row declares."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from trtflow.errors import StageError
from trtflow.pipelines.kinds import USER, kind_of
from trtflow.usercode import import_callable, source_digest


@dataclass(frozen=True)
class StageImpl:
    run: Callable[..., Any]
    version: str
    env_facets: tuple[str, ...]


def resolve(spec: Any) -> StageImpl:
    kind = kind_of(spec)
    if kind is USER:
        func = import_callable(spec.kind, f"stage kind '{spec.kind}'")
        return StageImpl(func, f"{spec.version}+{source_digest(spec.kind)}", kind.env(spec))
    if kind.module is None:
        raise StageError(f"stage kind '{spec.kind}' is declared but not implemented in this version of trtflow; "
                         f"remove the stage or run the stages before it with --stage")
    module = importlib.import_module(kind.module)
    return StageImpl(module.run, str(module.VERSION), kind.env(spec))
