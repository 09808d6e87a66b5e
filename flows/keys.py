"""The cache key of a stage run, the DVC way: the sha256 of everything the stage's output depends on.

`parts` holds the stage kind, its implementation's version, the parameters that define the work, the digests
of its input artifacts, the environment fingerprint where the kind's row says it matters, the source digests
of user code named in the parameters and, for a built-in kind, the digests of trtflow's code that decides its
output and the versions of the libraries its row declares (`flows/code_lock.py`, pinned by `code.lock.json`).
Parameters enter with their defaults (`StageBase.key_params`): a changed default re-keys exactly the stages that
leave it unset. `tests/test_keys.py` pins the hash of a fixed stage and
the key of every kind, so a change of this recipe is deliberate: then bump `KEY_FORMAT`, so no old result is
mistaken for a new one.

The environment (`fingerprint`): the environment facts that enter the keys of environment-dependent stages.

Facet "tensorrt": the flavour and the version the module itself reports, the CUDA runtime version, the OS and the CPU
architecture. Facet "gpu": each GPU (name, compute capability, memory), the driver and the CUDA version it supports.
Nested, so `keys.diff` names each field that changed (`tensorrt.version "1.7.1" -> "1.8.0"`, `gpu.0.driver ...`).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from trtflow import depends
from trtflow.pipelines.row import FACETS, Facet
from trtflow.records import Recorded
from trtflow.stages.trt.env import (
    Gpu,
    Platform,
    ProbeAnswer,
    TensorRT,
    find_tensorrt,
    nvidia_system,
    platform_facts,
    probe,
)
from trtflow.text import listed

# 2: parameters at their default are left out; 3: a built-in kind's code and library versions (the part `trtflow`);
# 4: parameters with their defaults (issue #70)
KEY_FORMAT = 4
SHOWN_CHANGES = 8  # 'params changed' names at most this many key paths, then says how many more
SHOWN_FILES = 3  # 'code changed' names at most this many files, then says how many more
VALUE_WIDTH = 60  # characters of an old or new value shown, past which it is cut


ALL = FACETS


class Cuda(Recorded):
    """The CUDA runtime TensorRT loads (facet "tensorrt") and the CUDA version the driver supports (facet "gpu")."""
    runtime: str | None = None
    driver: str | None = None


class Environment(Recorded):
    """This machine's facts for the facets asked for, in the cache keys of the stages that depend on them, in their
    manifests and in check-env's record. A facet not asked for leaves its fields out of the JSON; one asked for and
    not found here is null (`tensorrt`: no TensorRT, `gpu`: no GPU). The JSON is part of every such key: a field
    added here re-keys every stage that depends on the environment."""
    tensorrt: TensorRT | None = None
    cuda: Cuda | None = None
    platform: Platform | None = None
    # by device index; a list in records of trtflow before the CUDA versions were in the fingerprint
    gpu: dict[str, Gpu] | list[Gpu] | None = None
    driver: str | None = None

    @property
    def gpus(self) -> dict[str, Gpu]:
        """The GPUs by device index; empty where there is none (or the facet was not asked for)."""
        if isinstance(self.gpu, list):
            return {str(i): g for i, g in enumerate(self.gpu)}
        return self.gpu or {}

    def to_json(self) -> dict:
        return self.model_dump(mode="json")


def fingerprint(facets: tuple[Facet, ...]) -> Environment | None:
    if not facets:
        return None
    env = Environment()
    if "tensorrt" in facets:
        depends.READ.import_path()  # where TensorRT's module is looked for (its version is the module's own)
        trt = find_tensorrt()
        found = probe(trt.module) if trt else ProbeAnswer()
        env.tensorrt = TensorRT(flavour=trt.flavour, version=found.version or trt.version) if trt else None
        env.cuda = Cuda(runtime=found.cuda_runtime)
        env.platform = platform_facts()
    if "gpu" in facets:
        system = nvidia_system()
        env.gpu = {str(i): Gpu(name=g.name, compute_capability=g.compute_capability, memory_mb=g.memory_mb)
                   for i, g in enumerate(system.gpus)} or None
        env.cuda = env.cuda or Cuda()
        env.cuda.driver = system.cuda_driver
        env.driver = system.driver
    return env


def describe(env: Environment | None) -> str:
    if env is None or not env.to_json():
        return "-"
    parts = []
    asked = env.model_fields_set  # a facet asked for, even where it found nothing
    if "tensorrt" in asked:
        trt = env.tensorrt
        parts.append(f"{trt.flavour} {trt.version}" if trt else "no TensorRT")
    cuda = env.cuda
    if cuda and (cuda.runtime or cuda.driver):
        parts.append("CUDA " + ", ".join(f"{what} {v}" for what, v in (("runtime", cuda.runtime),
                                                                        ("driver", cuda.driver)) if v))
    if "gpu" in asked:
        names = ", ".join(f"{g.name} (sm{g.compute_capability})" for g in env.gpus.values())
        parts.append(f"{names}, driver {env.driver}" if env.gpu else "no GPU")
    if env.platform:
        parts.append(f"{env.platform.os} {env.platform.arch}")
    return "; ".join(parts)


def key_parts(kind: str, version: str, params: dict[str, Any], inputs: dict[str, str | list[str]],
              env: Environment | None, code: dict[str, str] | None = None,
              trtflow: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON the key is the digest of. `trtflow` (built-in kinds): {"files": {source file: its digest as the
    code lock keys it}, "libraries": {distribution: installed version}}."""
    parts: dict[str, Any] = {"format": KEY_FORMAT, "kind": kind, "version": version, "params": params,
                             "inputs": dict(sorted(inputs.items())), "env": None if env is None else env.to_json()}
    if code:  # a user's callable named in the parameters: editing it re-runs the stage
        parts["code"] = code
    if trtflow is not None:  # trtflow's own code and the libraries that decide the kind's output
        parts["trtflow"] = {"files": dict(sorted(trtflow.get("files", {}).items())),
                            "libraries": dict(sorted(trtflow.get("libraries", {}).items()))}
    return parts


class CodeFacts(Recorded):
    """The key's part `trtflow`: the code lock's digest of each source file that decides a built-in kind's output,
    and the installed version of each library its row declares ("absent" where none is)."""

    files: dict[str, str] = {}
    libraries: dict[str, str] = {}


class KeyParts(Recorded):
    """`key_parts` as recorded (a manifest's `key_parts`, `last.json`'s `parts`): `code` only for a stage with
    user code, `trtflow` only for a built-in kind (and from KEY_FORMAT 3)."""

    format: int | None = None
    kind: str | None = None
    version: str | None = None
    params: dict[str, Any] = {}
    inputs: dict[str, str | list[str]] = {}
    env: Environment | None = None
    code: dict[str, str] | None = None
    trtflow: CodeFacts | None = None


class LastRun(BaseModel):
    """`last.json`: the key of the stage's last run, its parts (`params` beside them only in records of key format 3,
    whose key left defaults out) and, for a failed run, `status` ("failed") and `error` (its first line)."""
    model_config = ConfigDict(extra="allow")

    key: str
    parts: KeyParts = KeyParts()
    params: dict[str, Any] | None = None
    status: str | None = None
    error: str | None = None

    @classmethod
    def parse(cls, data: Any) -> LastRun | None:
        """The record in `data` (read from JSON); None when it is not one."""
        if not isinstance(data, dict) or not isinstance(data.get("key"), str):
            return None
        try:
            return cls.model_validate(data)
        except ValueError:
            return None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


def stage_key(parts: dict[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def why_stale(last: LastRun | None, key: str, parts: KeyParts, describe_env) -> str:
    """Why a stage whose key is not published must run, from the record of its last run (`last.json`): its key's
    parameters (defaults included) against the ones the last run's key held (a record of key format 3 kept every
    parameter beside its key's, which left defaults out: those are compared)."""
    if not last:
        return "never run"
    if last.key == key:
        return _why_same_key(last)
    old = last.parts
    reasons = []
    if old.format != parts.format:
        reasons.append("trtflow's key format changed")  # (an older record lacks the parts a newer key has)
    if old.version != parts.version or old.kind != parts.kind:
        reasons.append(f"stage implementation changed ({old.kind} v{old.version} -> {parts.kind} v{parts.version})")
    changed = diff(last.params if last.params is not None else old.params, parts.params)
    if changed:
        reasons.append("params changed: " + listed(changed, SHOWN_CHANGES))
    reasons += [f"input '{slot}' changed" for slot in _differing(old.inputs, parts.inputs)]
    if old.env != parts.env:
        reasons.append(f"environment changed: {describe_env(old.env)} -> {describe_env(parts.env)}")
    if old.code != parts.code:
        reasons.append("user code named in the parameters changed")
    if old.format == parts.format and old.kind == parts.kind:
        reasons += code_changes(old.trtflow, parts.trtflow)
    return "; ".join(reasons) or "not in the store"


def _why_same_key(last: LastRun) -> str:
    """Why a stage whose last run had this very key must run again: that run failed, or its result is gone."""
    if last.status != "failed":
        return "its published result is missing or incomplete"
    return f"its last run failed: {last.error}" if last.error else "its last run failed"


def _differing(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The keys, sorted, whose values differ between two mappings (a key on one side only differs)."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def code_changes(old: CodeFacts | None, new: CodeFacts | None) -> list[str]:
    """'code changed (stages/ort/calibration.py, ...)' for the files whose keyed digest differs (or that entered or
    left the key) and 'onnxruntime 1.32.0 -> 1.33.0' for each declared library whose version differs."""
    old, new = old or CodeFacts(), new or CodeFacts()
    out = []
    files = _differing(old.files, new.files)
    if files:
        out.append(f"code changed ({listed(files, SHOWN_FILES)})")
    return out + [_library_change(lib, old.libraries.get(lib), new.libraries.get(lib))
                  for lib in _differing(old.libraries, new.libraries)]


def _library_change(lib: str, was: str | None, now: str | None) -> str:
    """How a declared library's version in the key changed."""
    if was is None:
        return f"{lib} now in the key ({now})"
    if now is None:
        return f"{lib} left the key"
    return f"{lib} {was} -> {now}"


_ABSENT = object()


def diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """'a.b[2].c old -> new' for every leaf that differs, by key path into dicts and lists (lists by content: an
    item inserted or removed is one change, an item changed in place is named by its index, not shown whole; null
    on one side and absent on the other is no change; a block shown
    leaves out its unset (null) options); each value cut at VALUE_WIDTH characters. A record is compared as its
    JSON."""
    old, new = (x.model_dump(mode="json") if isinstance(x, BaseModel) else x for x in (old, new))
    if (old is _ABSENT and new is None) or (new is _ABSENT and old is None):
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += diff(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(old, list) and isinstance(new, list):
        return _list_diff(old, new, prefix)
    if old != new:
        return [f"{prefix} {_shown(old)} -> {_shown(new)}"]
    return []


def _list_diff(old: list, new: list, prefix: str) -> list[str]:
    """Lists by content (difflib's matching of their items): an item inserted or removed is one change, named by
    its index in the new list (removed: in the old one); items changed in place are diffed key by key."""
    import difflib
    out: list[str] = []
    a, b = ([json.dumps(x, sort_keys=True, default=str) for x in side] for side in (old, new))
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        paired = min(i2 - i1, j2 - j1) if op == "replace" else 0
        for k in range(paired):
            out += diff(old[i1 + k], new[j1 + k], f"{prefix}[{j1 + k}]")
        out += [f"{prefix}[{i}] removed ({_shown(old[i])})" for i in range(i1 + paired, i2)]
        out += [f"{prefix}[{j}] inserted ({_shown(new[j])})" for j in range(j1 + paired, j2)]
    return out


def _shown(value: Any) -> str:
    text = "(absent)" if value is _ABSENT else json.dumps(_set_only(value), default=str)
    return text if len(text) <= VALUE_WIDTH else text[:VALUE_WIDTH - 1] + "…"


def _set_only(value: Any) -> Any:
    """`value` without the options left unset (null) in its blocks: what the YAML said."""
    if isinstance(value, dict):
        return {k: _set_only(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_set_only(v) for v in value]
    return value
