"""The object calls a message's processing makes, as a protocol: :class:`Objects`.

:class:`~aegis_storage.s3.ObjectStore` makes them on S3; :class:`MemoryObjects` keeps the objects
in a dict, for tests that need no server. Both answer the same way (one contract test suite
runs against both, libs/storage/tests/test_objects.py):

- ``get_bytes`` (and ``get_json``) of a key nobody wrote raises
  :class:`~aegis_storage.errors.NotFound`;
- ``list_keys`` returns the keys under a prefix in key order (S3's listing order);
  ``list_keys_between`` those strictly between two keys; ``list_objects`` each with its size
  and ETag;
- ``put_bytes`` and ``put_json`` overwrite; ``put_immutable`` writes a key once: the same bytes
  again are a ``duplicate``, other bytes raise :class:`~aegis_storage.errors.Conflict` and
  leave the object as it was;
- a put's ETag is S3's for a single-part object (the body's MD5 in double quotes);
- ``put_json`` writes what :func:`~aegis_storage.s3.to_json_bytes` makes of the value.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import BaseModel

from aegis_contracts.events import ObjectCreated
from aegis_storage.errors import Conflict, NotFound
from aegis_storage.s3 import (
    JSON,
    ObjectInfo,
    PutOutcome,
    PutResult,
    object_created,
    to_json_bytes,
)

JsonValue = BaseModel | Mapping[str, Any] | Sequence[Any]


class Objects(Protocol):
    """Objects of one bucket."""

    bucket: str

    def created(
        self, put: PutResult, *, producer: str, at: datetime, replayed: bool = False
    ) -> ObjectCreated: ...

    async def get_bytes(self, key: str) -> bytes: ...

    async def get_json(self, key: str) -> Any: ...

    async def exists(self, key: str) -> bool: ...

    async def list_keys(self, prefix: str) -> list[str]: ...

    async def list_keys_between(self, prefix: str, start_after: str, before: str) -> list[str]:
        """The keys under ``prefix`` with ``start_after < key < before``, in key order."""
        ...

    def list_objects(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Every object under ``prefix`` (key, size, etag, when it was stored), in key order."""
        ...

    async def put_bytes(
        self,
        key: str,
        body: bytes,
        *,
        content_type: str = JSON,
        metadata: Mapping[str, str] | None = None,
    ) -> PutResult: ...

    async def put_json(
        self, key: str, value: JsonValue, *, metadata: Mapping[str, str] | None = None
    ) -> PutResult: ...

    async def put_immutable(
        self,
        key: str,
        body: bytes,
        *,
        content_type: str = JSON,
        metadata: Mapping[str, str] | None = None,
    ) -> PutResult: ...


class MemoryObjects:
    """:class:`Objects` in a dict (key: body, content type, metadata)."""

    def __init__(self, bucket: str = "memory") -> None:
        self.bucket = bucket
        self.objects: dict[str, tuple[bytes, str, dict[str, str]]] = {}
        # when each object was stored, by the store's own clock (as S3's LastModified)
        self.stored_at: dict[str, datetime] = {}

    def created(
        self, put: PutResult, *, producer: str, at: datetime, replayed: bool = False
    ) -> ObjectCreated:
        return object_created(self.bucket, put, producer=producer, at=at, replayed=replayed)

    async def get_bytes(self, key: str) -> bytes:
        found = self.objects.get(key)
        if found is None:
            raise NotFound(f"get s3://{self.bucket}/{key}: no such key")
        return found[0]

    async def get_json(self, key: str) -> Any:
        return json.loads(await self.get_bytes(key))

    async def exists(self, key: str) -> bool:
        return key in self.objects

    async def list_keys(self, prefix: str) -> list[str]:
        return sorted(key for key in self.objects if key.startswith(prefix))

    async def list_keys_between(self, prefix: str, start_after: str, before: str) -> list[str]:
        return [key for key in await self.list_keys(prefix) if start_after < key < before]

    async def list_objects(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        for key in await self.list_keys(prefix):
            body = self.objects[key][0]
            yield ObjectInfo(key, len(body), _etag(body), self.stored_at[key])

    async def put_bytes(
        self,
        key: str,
        body: bytes,
        *,
        content_type: str = JSON,
        metadata: Mapping[str, str] | None = None,
    ) -> PutResult:
        self.objects[key] = (bytes(body), content_type, dict(metadata or {}))
        self.stored_at[key] = datetime.now(UTC)
        return PutResult(key, PutOutcome.CREATED, _etag(body), len(body))

    async def put_json(
        self, key: str, value: JsonValue, *, metadata: Mapping[str, str] | None = None
    ) -> PutResult:
        return await self.put_bytes(key, to_json_bytes(value), metadata=metadata)

    async def put_immutable(
        self,
        key: str,
        body: bytes,
        *,
        content_type: str = JSON,
        metadata: Mapping[str, str] | None = None,
    ) -> PutResult:
        found = self.objects.get(key)
        if found is None:
            return await self.put_bytes(key, body, content_type=content_type, metadata=metadata)
        if found[0] != body:
            raise Conflict(
                f"s3://{self.bucket}/{key} exists with a different body; it is immutable and "
                "was not overwritten"
            )
        return PutResult(key, PutOutcome.DUPLICATE, None, len(body))


def _etag(body: bytes) -> str:
    return '"' + hashlib.md5(body, usedforsecurity=False).hexdigest() + '"'
