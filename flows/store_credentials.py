"""Credentials for a remote artifact store from a Prefect block, named by `TRTFLOW_STORE_CREDENTIALS`:

- `secret/<name>`: a Secret block whose value is a JSON object (`aws_access_key_id`, `aws_secret_access_key`,
  optional `aws_session_token`, `endpoint_url`, `region_name`);
- `aws-credentials/<name>`: prefect-aws's `AwsCredentials` block (pip install prefect-aws).

Without it, the usual places (AWS_* variables, ~/.aws). The values go to fsspec's storage options only: never into
a message, a manifest or a log line."""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from trtflow import settings
from trtflow.errors import StoreError

VARIABLE = settings.STORE_CREDENTIALS.name


class Credentials(BaseModel):
    """What a block gives: an access key pair, and optionally a session token, an endpoint and a region (the rest
    of a Secret's object is ignored). The secrets print as '**********'."""
    model_config = ConfigDict(extra="ignore")

    aws_access_key_id: str | None = None
    aws_secret_access_key: SecretStr | None = None
    aws_session_token: SecretStr | None = None
    endpoint_url: str | None = None
    region_name: str | None = None

    def storage_options(self) -> dict[str, Any]:
        """s3fs's options: the key pair, and the token, endpoint and region where given."""
        given = {"key": self.aws_access_key_id, "secret": _revealed(self.aws_secret_access_key),
                 "token": _revealed(self.aws_session_token), "endpoint_url": self.endpoint_url,
                 "client_kwargs": {"region_name": self.region_name} if self.region_name else None}
        return {option: value for option, value in given.items() if value}


def _revealed(secret: SecretStr | None) -> str | None:
    return secret.get_secret_value() if secret is not None else None


def storage_options(url: str) -> dict[str, Any]:
    """fsspec options for `url` from the block `TRTFLOW_STORE_CREDENTIALS` names ({} when it names none)."""
    block = settings.STORE_CREDENTIALS.get()
    if block is None or not url.startswith("s3://"):
        return {}
    kind, name = block
    ref = f"{kind}/{name}"
    try:
        credentials = _secret(name) if kind == "secret" else _aws_credentials(name)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - Prefect's own errors (no such block, server unreachable)
        raise StoreError(f"cannot load the Prefect block {ref} ({VARIABLE}): {type(exc).__name__}",
                         hint="create it (prefect block create / Secret(value=...).save(name)) on the server in "
                              "PREFECT_API_URL") from None
    if not credentials.aws_access_key_id or not _revealed(credentials.aws_secret_access_key):
        raise StoreError(f"the Prefect block {ref} ({VARIABLE}) has no aws_access_key_id and aws_secret_access_key")
    return credentials.storage_options()


def _secret(name: str) -> Credentials:
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
    try:
        return Credentials.model_validate(value)
    except ValidationError as exc:  # named by field only: pydantic's own message would show the values
        wrong = sorted({str(error["loc"][0]) for error in exc.errors(include_input=False)})
        raise StoreError(f"the Secret block '{name}' ({VARIABLE}): {', '.join(wrong)} must be text",
                         hint='its value: {"aws_access_key_id": "...", "aws_secret_access_key": "...", ...}') from None


def _aws_credentials(name: str) -> Credentials:
    try:
        from prefect_aws import AwsCredentials
    except ImportError:
        raise StoreError(f"{VARIABLE} names an AwsCredentials block but prefect-aws is not installed",
                         hint="pip install prefect-aws, or use a Secret block: secret/<name>") from None
    block = AwsCredentials.load(name)
    params = getattr(block, "aws_client_parameters", None)
    return Credentials(aws_access_key_id=block.aws_access_key_id, aws_secret_access_key=block.aws_secret_access_key,
                       aws_session_token=block.aws_session_token, region_name=block.region_name,
                       endpoint_url=getattr(params, "endpoint_url", None))
