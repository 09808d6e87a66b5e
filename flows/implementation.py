"""The code that does a stage's work, found through its kind's row (`pipelines/kinds.py`): a `run` function, the
version that enters the cache key, the environment facts the row declares and, for a built-in kind, the digests of
the code that decides its output and the versions of its declared libraries (`flows/code_lock.py`)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from trtflow import depends
from trtflow.flows import code_lock
from trtflow.pipelines.kinds import USER, is_built_in, kind_of
from trtflow.stage_code import StageCode
from trtflow.usercode import import_callable, package_sources, source_digest


@dataclass(frozen=True)
class StageImpl:
    version: str
    env_facets: tuple[str, ...]
    code: dict[str, Any] | None = None  # the key's part `trtflow` (built-in kinds; a user's has its `code`)
    module: str | None = None  # a built-in kind's stage module: imported when first needed, never to key a stage
    func: Callable[..., Any] | None = None  # a user's kind's run(params, inputs, out_dir), imported to key it

    @property
    def run(self) -> Callable[..., Any]:
        return self.func if self.func is not None else _StageRun(self.module or "")

    # the rest of what its stage module's CODE gives the flow (trtflow/stage_code.py): the events after a stage of
    # it ran (StageRan -> [Event]), why a published result no longer holds ((metrics, shared/) -> why | None)
    @property
    def events(self) -> Callable[..., Any] | None:
        return stage_code(self.module).events if self.module else None

    @property
    def outdated(self) -> Callable[..., Any] | None:
        return stage_code(self.module).outdated if self.module else None


def stage_code(module: str) -> StageCode:
    """A built-in kind's `CODE`: a module without one, or with something else under that name, is an error."""
    loaded = importlib.import_module(module)
    code = loaded.CODE if hasattr(loaded, "CODE") else None
    if not isinstance(code, StageCode):
        raise TypeError(f"{module} has no CODE = StageCode(run, ...) (trtflow/stage_code.py): its kind cannot run")
    return code


@dataclass(frozen=True)
class _StageRun:
    """A built-in kind's `run`, by its module's name: pickled to the stage process as that name, imported there
    (the command that keys the stages never imports their modules), its report checked there."""
    module: str

    def __call__(self, *args: Any) -> Any:
        return stage_code(self.module)(*args)


def resolve(spec: Any) -> StageImpl:
    kind = kind_of(spec)
    if kind is USER:
        func = import_callable(spec.kind, f"stage kind '{spec.kind}'", 3)  # run(params, inputs, out_dir)
        return StageImpl(f"{spec.version}+{source_digest(spec.kind)}", kind.env(spec), func=func)
    if not is_built_in(kind):  # an installed package's kind: its whole package and its libraries in its key
        depends.READ.import_path()
        libraries = sorted({*kind.libraries, "trtflow"})  # (trtflow's own code it may import: by its version)
        facts = {"files": package_sources(kind.module or ""),
                 "libraries": {name: code_lock.library_version(name) for name in libraries}}
        return StageImpl(str(importlib.import_module(kind.module or "").VERSION), kind.env(spec), facts,
                         module=kind.module)
    version = code_lock.locked_version(kind)
    if version is None:  # a kind the lock does not know yet (a refresh adds it): its module says
        version = str(importlib.import_module(kind.module).VERSION)
    return StageImpl(version, kind.env(spec), code_lock.key_facts(kind), module=kind.module)
