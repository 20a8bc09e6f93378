"""The AWS client factory (aegis_storage.clients): sessions of their own over one model loader."""

from __future__ import annotations

import pytest

from aegis_storage.clients import (
    AwsConfig,
    client_arguments,
    emulator_credentials,
    new_session,
    open_client,
)
from aegis_storage.objectclient import s3_store


def test_new_sessions_are_distinct_and_read_the_api_models_through_one_loader() -> None:
    first, second = new_session(), new_session()
    assert first is not second
    loader = first.get_component("data_loader")
    assert second.get_component("data_loader") is loader
    # a model parsed once is not parsed again
    assert loader.load_service_model("dynamodb", "service-2") is loader.load_service_model(
        "dynamodb", "service-2"
    )


async def test_each_session_keeps_its_own_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFIRST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "first")
    first = await new_session().get_credentials()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASECOND")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "second")
    second = await new_session().get_credentials()
    assert first is not None and second is not None
    assert (first.access_key, second.access_key) == ("AKIAFIRST", "AKIASECOND")
    # and a client is made from the shared models with this process's settings
    async with open_client("sts", AwsConfig(endpoint_url="http://127.0.0.1:9")) as sts:
        assert sts.meta.region_name == "ap-south-1"


@pytest.mark.parametrize(
    ("endpoint", "verified"),
    [(None, True), ("https://s3.example.internal", True), ("http://127.0.0.1:4566", False)],
)
async def test_only_a_plain_http_endpoint_is_opened_without_certificate_checks(
    endpoint: str | None, verified: bool
) -> None:
    """AWS and an https endpoint keep botocore's verification; a plain-http one (the local
    emulator) has no TLS, and its clients build no CA store."""
    arguments = client_arguments(AwsConfig(endpoint_url=endpoint))
    assert arguments.get("verify", True) is verified
    async with open_client("sts", AwsConfig(endpoint_url=endpoint)) as sts:
        # True, or the CA bundle configured (AWS_CA_BUNDLE), when verifying
        assert (sts._endpoint.http_session._verify is not False) is verified


@pytest.mark.parametrize(
    ("endpoint", "keys"),
    [
        (None, {"aws_access_key_id": "test", "aws_secret_access_key": "test"}),
        ("http://127.0.0.1:4566", {}),
    ],
    ids=["static-keys-against-aws", "an-emulator-without-keys"],
)
def test_an_object_store_signs_only_with_the_chain_or_an_emulators_keys(
    endpoint: str | None, keys: dict[str, str]
) -> None:
    """Static keys are the emulator's alone: AWS itself is signed for by the credential chain."""
    with pytest.raises(ValueError, match="needs an emulator's keys"):
        s3_store(AwsConfig(endpoint_url=endpoint), "aegis-raw", keys)
    emulator = AwsConfig(endpoint_url="http://127.0.0.1:4566")
    s3_store(emulator, "aegis-raw", emulator_credentials(emulator))  # its keys make a store
