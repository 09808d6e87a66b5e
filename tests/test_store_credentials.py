"""The remote store's credentials from a Prefect block (TRTFLOW_STORE_CREDENTIALS), read as a typed record, on the
test run's Prefect server: s3fs's options hold what the block gives and nothing else, and a block that cannot serve
is one line that names the block and the field, never a value. (tests/test_shared_store.py uses such a block against
an S3 server.)"""
from __future__ import annotations

import uuid

import pytest

from trtflow.errors import StoreError
from trtflow.flows import store_credentials as creds

URL = "s3://team-bucket/models"


@pytest.fixture
def block(monkeypatch, prefect_api):
    """save(value): a Secret block holding `value`, named by TRTFLOW_STORE_CREDENTIALS."""
    from prefect.blocks.system import Secret

    name = f"trtflow-test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv(creds.VARIABLE, f"secret/{name}")

    def save(value) -> str:
        Secret(value=value).save(name, overwrite=True)
        return name
    return save


def test_the_options_hold_what_the_block_gives(block):
    block({"aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": "s3cr3t", "aws_session_token": "t0ken",
           "endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1", "comment": "the team's bucket"})
    assert creds.storage_options(URL) == {"key": "AKIDEXAMPLE", "secret": "s3cr3t", "token": "t0ken",
                                          "endpoint_url": "http://127.0.0.1:9000",
                                          "client_kwargs": {"region_name": "eu-west-1"}}
    block('{"aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": "s3cr3t", "endpoint_url": ""}')  # as text
    assert creds.storage_options(URL) == {"key": "AKIDEXAMPLE", "secret": "s3cr3t"}
    assert creds.storage_options("/local/store") == {}, "credentials are for S3 stores only"


def test_no_variable_no_options(monkeypatch):
    monkeypatch.delenv(creds.VARIABLE, raising=False)
    assert creds.storage_options(URL) == {}


def test_a_block_without_the_key_pair_is_refused(block):
    name = block({"aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": ""})
    with pytest.raises(StoreError, match=f"the Prefect block secret/{name} .* has no aws_access_key_id and "
                                         "aws_secret_access_key"):
        creds.storage_options(URL)


def test_a_field_that_is_not_text_is_named_and_its_value_never_shown(block):
    name = block({"aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": 271828182845,
                  "aws_session_token": ["s3cr3t-t0ken"]})
    with pytest.raises(StoreError) as info:
        creds.storage_options(URL)
    message = str(info.value)  # the hint included
    assert message.startswith(f"the Secret block '{name}' ({creds.VARIABLE}): aws_secret_access_key, "
                              f"aws_session_token must be text (") and "\n" not in message
    assert "271828182845" not in message and "s3cr3t" not in message


def test_a_secret_that_is_not_a_json_object_is_refused(block):
    name = block("AKIDEXAMPLE:s3cr3t")
    with pytest.raises(StoreError, match=f"the Secret block '{name}' .* does not hold a JSON object"):
        creds.storage_options(URL)


def test_the_secrets_never_print():
    record = creds.Credentials(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="s3cr3t",
                               aws_session_token="t0ken")
    assert "s3cr3t" not in repr(record) + str(record) and "t0ken" not in repr(record) + str(record)
