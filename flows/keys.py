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
        reasons.append("params changed: " + ", ".join(changed[:4]) + (" ..." if len(changed) > 4 else ""))
    for slot in sorted(set(old.get("inputs", {})) | set(parts["inputs"])):
        if old.get("inputs", {}).get(slot) != parts["inputs"].get(slot):
            reasons.append(f"input '{slot}' changed")
    if old.get("env") != parts["env"]:
        reasons.append(f"environment changed: {describe_env(old.get('env'))} -> {describe_env(parts['env'])}")
    if old.get("code") != parts.get("code"):
        reasons.append("user code named in the parameters changed")
    return "; ".join(reasons) or "not in the store"


def diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """'a.b old -> new' for every leaf that differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    if old != new:
        return [f"{prefix.rstrip('.')} {json.dumps(old)} -> {json.dumps(new)}"]
    return []
