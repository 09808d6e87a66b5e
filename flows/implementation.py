"""The code that does a stage's work, found through its kind's row (`pipelines/kinds.py`): a `run` function, the
version that enters the cache key, the environment facts the row declares and, for a built-in kind, the digests of
the code that decides its output and the versions of its declared libraries (`flows/code_lock.py`)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel

from trtflow.flows import code_lock
from trtflow.pipelines.kinds import USER, kind_of
from trtflow.usercode import import_callable, source_digest


@dataclass(frozen=True)
class StageImpl:
    run: Callable[..., Any]
    version: str
    env_facets: tuple[str, ...]
    code: dict[str, Any] | None = None  # the key's part `trtflow` (built-in kinds; a user's has its `code`)
    # what its stage module exports beside `run` for the flow (pipelines/row.py): its report's class, the events
    # after it ran (StageRan -> [Event]), why a published result no longer holds ((metrics, shared/) -> why | None)
    report: type[BaseModel] | None = None
    events: Callable[..., Any] | None = None
    outdated: Callable[..., Any] | None = None


def resolve(spec: Any) -> StageImpl:
    kind = kind_of(spec)
    if kind is USER:
        func = import_callable(spec.kind, f"stage kind '{spec.kind}'", 3)  # run(params, inputs, out_dir)
        return StageImpl(func, f"{spec.version}+{source_digest(spec.kind)}", kind.env(spec))
    module = importlib.import_module(kind.module)
    hooks = (getattr(module, name, None) for name in ("REPORT", "EVENTS", "OUTDATED"))
    return StageImpl(module.run, str(module.VERSION), kind.env(spec), code_lock.key_facts(kind), *hooks)
