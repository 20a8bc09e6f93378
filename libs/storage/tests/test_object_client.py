"""The per-message S3 calls on obstore (aegis_storage.objectclient) against the emulator over
HTTP: put-once, checksums, metadata, retries, error translation, credentials and shutdown."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from botocore.exceptions import ClientError

from aegis_contracts import keys
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.holds import Holds
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.errors import Conflict, NotFound, StorageError, Transient
from aegis_storage.objectclient import CREDENTIALS_TTL, ChainCredentials, StaticKeys
from aegis_storage.s3 import ObjectStore, PutOutcome

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def raw(mid: str) -> str:
    return keys.raw_key("factory-a", "factory_state", T0, mid)


def sha256_b64(body: bytes) -> str:
    return base64.b64encode(hashlib.sha256(body).digest()).decode()


@contextmanager
def aiobotocore_calls(store: ObjectStore) -> Iterator[Counter[str]]:
    """The S3 operations the store's aiobotocore client sends meanwhile."""
    sent: Counter[str] = Counter()
    events = store._s3.meta.events

    def count(event_name: str, **_: object) -> None:
        sent[event_name.rsplit(".", 1)[-1]] += 1

    events.register("before-call.s3", count)
    try:
        yield sent
    finally:
        events.unregister("before-call.s3", count)


async def test_put_once_goes_through_obstore_and_never_overwrites(foundation):
    store = foundation.store
    key = raw("msg-obstore-1")
    with aiobotocore_calls(store) as sent:
        first = await store.put_immutable(key, b"first body")
        again = await store.put_immutable(key, b"first body")
        with pytest.raises(Conflict, match="different body") as refused:
            await store.put_immutable(key, b"other body")
        assert await store.get_bytes(key) == b"first body"
    assert sent == Counter()  # puts and gets, the 412 and the GET that settles it: all obstore
    assert (first.outcome, again.outcome) == (PutOutcome.CREATED, PutOutcome.DUPLICATE)
    assert first.etag and again.etag is None
    assert type(refused.value) is Conflict  # the library's error, obstore's as its cause only
    versions = await foundation.clients.s3.list_object_versions(
        Bucket=foundation.bucket, Prefix=key
    )
    assert len(versions.get("Versions", [])) == 1  # no second version either


async def test_the_put_once_sha256_is_kept_and_read_back_with_type_and_metadata(foundation):
    store = foundation.store
    key, body = raw("msg-obstore-2"), b'{"sensors": {"co_ppm": 3}}'
    await store.put_immutable(
        key, body, content_type="application/json", metadata={"topic": "aegis/factory-a/x"}
    )
    assert await store.kept_sha256(key) == sha256_b64(body)
    stored = await store.get_object(key)
    assert (stored.body, stored.content_type, stored.metadata) == (
        body,
        "application/json",
        {"topic": "aegis/factory-a/x"},
    )
    head = await store.head(key)
    assert head is not None
    assert (head["ContentType"], head["Metadata"]) == (
        "application/json",
        {"topic": "aegis/factory-a/x"},
    )
    # plain puts carry it too: S3 checks every body it is sent
    await store.put_bytes("processed/factory-a/x.json", b"{}", content_type="text/plain")
    assert await store.kept_sha256("processed/factory-a/x.json") == sha256_b64(b"{}")
    assert (await store.get_object("processed/factory-a/x.json")).content_type == "text/plain"


async def test_the_emulator_refuses_a_body_whose_sha256_is_not_the_one_sent(foundation):
    key = raw("msg-obstore-3")
    with pytest.raises(ClientError, match="BadDigest"):
        await foundation.clients.s3.put_object(
            Bucket=foundation.bucket,
            Key=key,
            Body=b"the bytes sent",
            ChecksumSHA256=sha256_b64(b"other bytes"),
        )
    assert not await foundation.store.exists(key)


async def test_a_put_once_answered_503_is_retried_and_created_once(foundation, aws_endpoint):
    holds, key = Holds(aws_endpoint), raw("msg-obstore-4")
    holds.arm("put-503", "s3", "PutObject", contains=["msg-obstore-4"], when="before")
    put = asyncio.create_task(foundation.store.put_immutable(key, b"body"))
    await holds.held("put-503", within=10)
    holds.abort("put-503")  # 503, nothing written
    assert (await put).outcome == PutOutcome.CREATED  # the retry wrote it
    assert await foundation.store.get_bytes(key) == b"body"


async def test_a_put_once_whose_answer_is_lost_is_retried_and_settled_as_a_duplicate(
    foundation, aws_endpoint
):
    holds, key = Holds(aws_endpoint), raw("msg-obstore-5")
    holds.arm("put-lost", "s3", "PutObject", contains=["msg-obstore-5"], when="after")
    put = asyncio.create_task(foundation.store.put_immutable(key, b"body"))
    await holds.held("put-lost", within=10)
    holds.abort("put-lost")  # written, the connection cut before the answer
    try:
        outcome = (await put).outcome
    except Transient:  # not retried: the caller retries, and then meets the object
        outcome = (await foundation.store.put_immutable(key, b"body")).outcome
    assert outcome == PutOutcome.DUPLICATE
    assert await foundation.store.get_bytes(key) == b"body"


async def test_obstore_failures_are_the_libraries_errors(foundation):
    with pytest.raises(NotFound) as missing:
        await foundation.store.get_bytes(raw("msg-nowhere"))
    assert type(missing.value) is NotFound
    assert missing.value.__cause__ is not None  # obstore's, kept as the cause
    assert not isinstance(missing.value, FileNotFoundError)
    cfg = AwsConfig(endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=2)
    async with open_clients(cfg) as nowhere:
        store = ObjectStore(nowhere, foundation.bucket)
        with pytest.raises(Transient):
            await store.get_bytes(raw("msg-anywhere"))
        with pytest.raises(Transient):
            await store.put_immutable(raw("msg-anywhere"), b"x")


async def test_keys_obstore_cannot_name_are_read_written_and_listed_all_the_same(foundation):
    store = foundation.store
    odd = ["legacy/a//b.json", "legacy/./c.json", "legacy/d/"]
    for i, key in enumerate(odd):
        await store.put_bytes(key, f"odd-{i}".encode())
    await store.put_bytes("legacy/e.json", b"plain")
    assert [await store.get_bytes(k) for k in odd] == [b"odd-0", b"odd-1", b"odd-2"]
    listed = [info.key async for info in store.list_objects("legacy/")]
    assert listed == sorted([*odd, "legacy/e.json"])
    assert await store.list_keys_between("legacy/", "legacy/", "legacy/~") == listed
    # a prefix that ends inside a segment lists as S3 does, not by whole segments
    assert [info.key async for info in store.list_objects("legacy/e")] == ["legacy/e.json"]


async def test_obstore_signs_with_the_credential_chain(foundation, aws_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "chain-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "chain-secret")
    async with open_clients(AwsConfig(endpoint_url=aws_endpoint)) as clients:
        store = ObjectStore(clients, foundation.bucket)
        await store.put_immutable(raw("msg-chain"), b"signed by the chain")
        provider = clients.objects._credentials
        assert isinstance(provider, ChainCredentials)
        given = await provider()
    assert (given["access_key_id"], given["secret_access_key"]) == ("chain-key", "chain-secret")
    assert given["expires_at"] is not None


@dataclass
class Rotating:
    """A refreshable credential source: new keys on every read."""

    reads: int = 0

    async def get_frozen_credentials(self) -> StaticKeys:
        self.reads += 1
        return StaticKeys(f"key-{self.reads}", "secret", token=f"token-{self.reads}")


async def test_chain_credentials_are_asked_again_before_they_can_expire():
    source = Rotating()
    provider = ChainCredentials(source)
    first, second = await provider(), await provider()
    assert (first["access_key_id"], second["access_key_id"]) == ("key-1", "key-2")
    assert second["token"] == "token-2"
    expires_at = second["expires_at"]
    assert expires_at is not None
    assert expires_at - datetime.now(UTC) <= CREDENTIALS_TTL
    with pytest.raises(StorageError, match="no AWS credentials"):
        await ChainCredentials(None)()


def test_a_process_that_used_obstore_ends_its_loop_and_leaves_no_thread_to_wait_for(
    aws_endpoint, unique_id, tmp_path
):
    """obstore's threads keep nothing alive: a service's loop ends, and no thread is left that
    the interpreter would wait for. The process then ends as every AEGIS process does, through
    exit_process (ending by finalizing the interpreter is the crash test_process.py shows)."""
    script = tmp_path / "exits.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio
            import threading
            from aegis_runtime.process import exit_process
            from aegis_storage.clients import AwsConfig, open_clients
            from aegis_storage.s3 import ObjectStore

            async def main():
                async with open_clients(AwsConfig(endpoint_url={aws_endpoint!r})) as c:
                    await c.s3.create_bucket(
                        Bucket="aegis-{unique_id}-exit",
                        CreateBucketConfiguration={{"LocationConstraint": c.config.region}},
                    )
                    store = ObjectStore(c, "aegis-{unique_id}-exit")
                    await asyncio.gather(*(store.put_bytes(f"k/{{i}}", b"x") for i in range(32)))
                    assert await store.get_bytes("k/1") == b"x"
                print("closed")

            asyncio.run(main())
            waited_for = [t.name for t in threading.enumerate() if not t.daemon]
            print("threads left to wait for:", waited_for)
            exit_process(0)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["closed", "threads left to wait for: ['MainThread']"]
