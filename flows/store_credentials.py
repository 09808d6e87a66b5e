"""Credentials for a remote artifact store from a Prefect block, named by `TRTFLOW_STORE_CREDENTIALS`:

- `secret/<name>`: a Secret block whose value is a JSON object (`aws_access_key_id`, `aws_secret_access_key`,
  optional `aws_session_token`, `endpoint_url`, `region_name`);
- `aws-credentials/<name>`: prefect-aws's `AwsCredentials` block (pip install prefect-aws).

Without it, the usual places (AWS_* variables, ~/.aws). The values go to fsspec's storage options only: never into
a message, a manifest or a log line."""
from __future__ import annotations

import json
import os
from typing import Any

from trtflow.errors import StoreError

VARIABLE = "TRTFLOW_STORE_CREDENTIALS"
KINDS = ("secret", "aws-credentials")


def storage_options(url: str) -> dict[str, Any]:
    """fsspec options for `url` from the block `TRTFLOW_STORE_CREDENTIALS` names ({} when it names none)."""
    ref = os.environ.get(VARIABLE, "").strip()
    if not ref or not url.startswith("s3://"):
        return {}
    kind, _, name = ref.partition("/")
    if kind not in KINDS or not name:
        raise StoreError(f"{VARIABLE}={ref!r} names no block", hint="give secret/<block name> or "
                                                                    "aws-credentials/<block name>")
    try:
        fields = _secret(name) if kind == "secret" else _aws_credentials(name)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - Prefect's own errors (no such block, server unreachable)
        raise StoreError(f"cannot load the Prefect block {ref} ({VARIABLE}): {type(exc).__name__}",
                         hint="create it (prefect block create / Secret(value=...).save(name)) on the server in "
                              "PREFECT_API_URL") from None
    options: dict[str, Any] = {"key": fields.get("aws_access_key_id"), "secret": fields.get("aws_secret_access_key")}
    if fields.get("aws_session_token"):
        options["token"] = fields["aws_session_token"]
    if fields.get("endpoint_url"):
        options["endpoint_url"] = fields["endpoint_url"]
    if fields.get("region_name"):
        options["client_kwargs"] = {"region_name": fields["region_name"]}
    if not options["key"] or not options["secret"]:
        raise StoreError(f"the Prefect block {ref} ({VARIABLE}) has no aws_access_key_id and aws_secret_access_key")
    return options


def _secret(name: str) -> dict[str, Any]:
    from prefect.blocks.system import Secret

    value = Secret.load(name).get()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, dict):
        raise StoreError(f"the Secret block '{name}' ({VARIABLE}) does not hold a JSON object",
                         hint='its value: {"aws_access_key_id": ..., "aws_secret_access_key": ..., '
                              '"endpoint_url": ...}')
    return value


def _aws_credentials(name: str) -> dict[str, Any]:
    try:
        from prefect_aws import AwsCredentials
    except ImportError:
        raise StoreError(f"{VARIABLE} names an AwsCredentials block but prefect-aws is not installed",
                         hint="pip install prefect-aws, or use a Secret block: secret/<name>") from None
    block = AwsCredentials.load(name)
    secret = block.aws_secret_access_key
    params = getattr(block, "aws_client_parameters", None)
    return {"aws_access_key_id": block.aws_access_key_id,
            "aws_secret_access_key": secret.get_secret_value() if secret is not None else None,
            "aws_session_token": block.aws_session_token, "region_name": block.region_name,
            "endpoint_url": getattr(params, "endpoint_url", None)}
