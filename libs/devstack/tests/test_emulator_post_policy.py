"""The emulator decides a presigned POST as S3 does (moto alone stores whatever a POST sends): a
gateway's presigned upload (aegis_storage's ``presign_upload``, as ingest makes it) writes its
one key, type and size before it expires, and nothing else. A module-private emulator, since the
test stops its clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from aegis_devstack.testing.emulator import (
    arequest_counts,
    emulator_clock_at,
    post_form,
)
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.s3 import ObjectStore, PresignedPost

pytestmark = pytest.mark.integration

IMAGE = b"\xff\xd8\xff\xe0" + b"jpeg" * 100
KEY = "image_snapshot/factory_id=factory-a/yyyy=2026/mm=11/dd=30/hh=03/cam-01-a.jpg"
OTHER_FACTORY = KEY.replace("factory-a", "factory-b")


@pytest.fixture
async def store(private_emulator: str, unique_id: str) -> AsyncIterator[ObjectStore]:
    async with open_clients(AwsConfig(endpoint_url=private_emulator)) as clients:
        bucket = f"aegis-{unique_id}"
        await bootstrap(clients, bucket=bucket, table=f"AEGIS-{unique_id}")
        yield ObjectStore(clients, bucket)


async def presign(store: ObjectStore) -> PresignedPost:
    return await store.presign_upload(
        KEY, content_type="image/jpeg", size_bytes=len(IMAGE), expires_in_s=300
    )


async def test_the_presigned_upload_writes_its_key_with_its_type(store, private_emulator):
    post = await presign(store)
    before = await arequest_counts(private_emulator)
    assert (await post_form(post.url, post.fields, IMAGE))[0] == 204
    assert ((await arequest_counts(private_emulator)) - before).count("s3", "PostObject") == 1
    stored = await store.get_object(KEY)
    assert (stored.body, stored.content_type) == (IMAGE, "image/jpeg")


@pytest.mark.parametrize(
    ("change", "status", "code"),
    [
        ({"key": OTHER_FACTORY}, 403, "AccessDenied"),  # another factory's prefix
        ({"key": KEY.replace("cam-01-a", "cam-01-b")}, 403, "AccessDenied"),  # another key
        ({"Content-Type": "image/png"}, 403, "AccessDenied"),
        ({"Content-Type": "text/html"}, 403, "AccessDenied"),
        ({"x-amz-meta-owner": "factory-b"}, 403, "AccessDenied"),  # a field not in the policy
    ],
)
async def test_the_presigned_upload_writes_nothing_else(store, change, status, code):
    post = await presign(store)
    answer = await post_form(post.url, {**post.fields, **change}, IMAGE)
    assert answer[0] == status and f"<Code>{code}</Code>" in answer[1]
    for key in (KEY, change.get("key", KEY)):
        assert not await store.exists(key)


@pytest.mark.parametrize(
    ("body", "code"), [(IMAGE + b"x", "EntityTooLarge"), (IMAGE[:-1], "EntityTooSmall")]
)
async def test_the_presigned_upload_takes_exactly_its_size(store, body, code):
    post = await presign(store)
    status, text = await post_form(post.url, post.fields, body)
    assert status == 400 and f"<Code>{code}</Code>" in text
    assert not await store.exists(KEY)


async def test_the_presigned_upload_works_until_it_expires_and_not_after(store, private_emulator):
    post = await presign(store)
    async with emulator_clock_at(private_emulator, post.expires_at + timedelta(seconds=1)):
        status, text = await post_form(post.url, post.fields, IMAGE)
    assert status == 403 and "Policy expired" in text
    assert not await store.exists(KEY)
    async with emulator_clock_at(private_emulator, post.expires_at - timedelta(seconds=1)):
        assert (await post_form(post.url, post.fields, IMAGE))[0] == 204
    assert await store.exists(KEY)
