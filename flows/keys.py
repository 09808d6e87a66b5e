"""The cache key of a stage run, the DVC way: the sha256 of everything the stage's output depends on.

`parts` holds the stage kind, its implementation's version, the parameters that define the work, the digests
of its input artifacts, the environment fingerprint where the kind's row says it matters and the source digests
of user code named in the parameters. Parameters left at their default stay out of the key (see
`StageBase.key_params`): adding an option re-keys nothing. `tests/test_keys.py` pins the hash of a fixed stage and
the key of every kind, so a change of this recipe is deliberate: then bump `KEY_FORMAT`, so no old result is
mistaken for a new one.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

KEY_FORMAT = 2  # 2: parameters at their default are left out
SHOWN_CHANGES = 8  # 'params changed' names at most this many key paths, then says how many more
VALUE_WIDTH = 60  # characters of an old or new value shown, past which it is cut


def key_parts(kind: str, version: str, params: dict[str, Any], inputs: dict[str, str | list[str]],
              env: dict[str, Any] | None, code: dict[str, str] | None = None) -> dict[str, Any]:
    parts: dict[str, Any] = {"format": KEY_FORMAT, "kind": kind, "version": version, "params": params,
                             "inputs": dict(sorted(inputs.items())), "env": env}
    if code:  # a user's callable named in the parameters: editing it re-runs the stage
        parts["code"] = code
    return parts


def stage_key(parts: dict[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def why_stale(last: dict[str, Any] | None, key: str, parts: dict[str, Any], describe_env,
              params: dict[str, Any]) -> str:
    """Why a stage whose key is not published must run, from the record of its last run (`last.json`). `params`
    (every parameter, defaults included) is compared with the ones the last run recorded (a record written before
    they were: its key's parameters)."""
    if not last:
        return "never run"
    old = last.get("parts", {})
    if last.get("key") == key:
        if last.get("status") == "failed":
            error = last.get("error")
            return f"its last run failed: {error}" if isinstance(error, str) and error else "its last run failed"
        return "its published result is missing or incomplete"
    reasons = []
    if old.get("format") != parts["format"]:
        reasons.append("trtflow's key format changed")
    if old.get("version") != parts["version"] or old.get("kind") != parts["kind"]:
        reasons.append(f"stage implementation changed ({old.get('kind')} v{old.get('version')} -> "
                       f"{parts['kind']} v{parts['version']})")
    before = last.get("params") if isinstance(last.get("params"), dict) else old.get("params", {})
    changed = diff(before, params)
    if changed:
        more = f", and {len(changed) - SHOWN_CHANGES} more" if len(changed) > SHOWN_CHANGES else ""
        reasons.append("params changed: " + ", ".join(changed[:SHOWN_CHANGES]) + more)
    for slot in sorted(set(old.get("inputs", {})) | set(parts["inputs"])):
        if old.get("inputs", {}).get(slot) != parts["inputs"].get(slot):
            reasons.append(f"input '{slot}' changed")
    if old.get("env") != parts["env"]:
        reasons.append(f"environment changed: {describe_env(old.get('env'))} -> {describe_env(parts['env'])}")
    if old.get("code") != parts.get("code"):
        reasons.append("user code named in the parameters changed")
    return "; ".join(reasons) or "not in the store"


_ABSENT = object()


def diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """'a.b[2].c old -> new' for every leaf that differs, by key path into dicts and lists (a changed list item
    is named by its index, not shown whole; null on one side and absent on the other is no change; a block shown
    leaves out its unset (null) options); each value cut at VALUE_WIDTH characters."""
    if (old is _ABSENT and new is None) or (new is _ABSENT and old is None):
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += diff(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(old, list) and isinstance(new, list):
        out = []
        for i in range(max(len(old), len(new))):
            out += diff(old[i] if i < len(old) else _ABSENT, new[i] if i < len(new) else _ABSENT, f"{prefix}[{i}]")
        return out
    if old != new:
        return [f"{prefix} {_shown(old)} -> {_shown(new)}"]
    return []


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
