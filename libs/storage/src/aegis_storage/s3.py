"""S3 object store: JSON put/get, listing, the immutable put that raw/ relies on, and server-side
copies (CopyObject, or UploadPartCopy parts above a threshold) that keep metadata and content type.

``put_immutable`` writes with ``If-None-Match: *``: a second put of the same bytes is a success
(``duplicate``), a put of different bytes under an existing key raises :class:`Conflict` and never
overwrites. Bodies are serialized once by the caller or here, never twice.

The per-message calls (puts, gets, listings) go through obstore, the others through aiobotocore
(:mod:`aegis_storage.objectclient` says why); callers see one interface and one error tree. A key
obstore cannot name (an empty or a ``.`` / ``..`` segment, which S3 allows and the platform never
writes) is read and written through aiobotocore, and a listing that meets one goes on there.

``presign_upload`` signs, with this client's credentials, a browser-style POST that lets whoever
holds it write one key, one content type and one exact size until it expires (the POST policy's
conditions: S3 refuses any other key, type or size, and a changed policy fails the signature).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import obstore
from obstore.exceptions import InvalidPathError
from pydantic import BaseModel

from aegis_contracts.events import ObjectCreated
from aegis_contracts.times import parse_iso
from aegis_storage.errors import Conflict, NotFound, translated
from aegis_storage.objectclient import range_unsatisfiable, translated_obstore

if TYPE_CHECKING:
    from obstore import Attributes, PutMode
    from obstore.store import S3Store

    from aegis_storage.clients import AwsClients

JSON = "application/json"
DELETE_BATCH = 1000  # S3's limit per DeleteObjects; emulators do not enforce it, we do
# CopyObject copies at most 5 GiB; above that S3 wants a multipart upload of UploadPartCopy parts
COPY_OBJECT_MAX_BYTES = 5 * 1024**3
COPY_PART_BYTES = 512 * 1024**2  # 5 MiB..5 GiB per part, at most 10,000 parts
COPY_PART_MIN_BYTES = 5 * 1024**2
COPY_MAX_PARTS = 10_000
# the headers a multipart copy must carry over by hand (CopyObject copies them itself)
_COPIED_HEADERS = (
    "ContentType",
    "ContentEncoding",
    "ContentDisposition",
    "ContentLanguage",
    "CacheControl",
    "Expires",
)
# the end of the range a one-call read asks for: past the end of any object S3 can hold (5 TiB)
WHOLE_OBJECT_END = 1 << 50
# the names obstore takes as an object's attributes rather than as user metadata
_ATTRIBUTE_NAMES = frozenset(
    {
        "content-disposition",
        "content-encoding",
        "content-language",
        "content-type",
        "cache-control",
        "storage-class",
    }
)


class PutOutcome(StrEnum):
    CREATED = "created"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class PutResult:
    key: str
    outcome: PutOutcome
    etag: str | None
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size_bytes: int
    etag: str
    last_modified: datetime


@dataclass(frozen=True, slots=True)
class StoredObject:
    key: str
    body: bytes
    metadata: dict[str, str]
    content_type: str
    etag: str


@dataclass(frozen=True, slots=True)
class CopyResult:
    key: str
    etag: str
    parts: int  # 0 for a CopyObject, else the number of UploadPartCopy parts


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """One version of a key in a versioned bucket: an object version or a delete marker."""

    key: str
    version_id: str
    size_bytes: int  # 0 for a delete marker
    is_latest: bool
    delete_marker: bool
    etag: str = ""  # "" for a delete marker


def is_multipart_etag(etag: str) -> bool:
    """An ETag of the form ``"<md5>-<parts>"`` is no MD5 of the body."""
    return "-" in etag


def copy_ranges(size: int, part_bytes: int) -> list[tuple[int, int]]:
    """Inclusive byte ranges for UploadPartCopy: parts of ``part_bytes`` (grown so that there are
    at most 10,000), the last one shorter."""
    part = max(part_bytes, COPY_PART_MIN_BYTES, -(-size // COPY_MAX_PARTS))
    return [(start, min(start + part, size) - 1) for start in range(0, size, part)]


def obstore_can_name(key: str) -> bool:
    """Whether obstore takes ``key`` as it is: no empty segment (``a//b``, ``a/``, ``/a``) and no
    ``.`` or ``..`` segment, which S3 allows and obstore refuses."""
    return all(part not in ("", ".", "..") for part in key.split("/"))


def _attributes(content_type: str, metadata: Mapping[str, str] | None) -> Attributes:
    attributes: Attributes = {"Content-Type": content_type}
    for name, value in (metadata or {}).items():
        if name.lower() in _ATTRIBUTE_NAMES:
            raise ValueError(f"{name!r} is a header of its own, not user metadata")
        attributes[name] = value
    return attributes


def _info(meta: Mapping[str, Any]) -> ObjectInfo:
    return ObjectInfo(
        key=str(meta["path"]),
        size_bytes=int(meta["size"]),
        etag=str(meta.get("e_tag") or ""),
        last_modified=meta["last_modified"],
    )


def to_json_bytes(value: BaseModel | Mapping[str, Any] | Sequence[Any]) -> bytes:
    if isinstance(value, BaseModel):
        return value.model_dump_json().encode()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode()


@dataclass(frozen=True, slots=True)
class PresignedPost:
    """A presigned S3 POST: the form ``fields`` to send to ``url``, then the file, before
    ``expires_at`` (the signed policy's own expiration)."""

    url: str
    fields: dict[str, str]
    expires_at: datetime


def post_policy(fields: Mapping[str, str]) -> dict[str, Any]:
    """The POST policy a presigned POST's ``policy`` field carries (base64 JSON)."""
    try:
        policy = json.loads(base64.b64decode(fields["policy"], validate=True))
    except (KeyError, ValueError, binascii.Error) as err:
        raise ValueError(f"the form carries no readable POST policy: {err}") from None
    if not isinstance(policy, dict):
        raise ValueError("the POST policy is not a JSON object")  # noqa: TRY004 (bad input)
    return policy


def object_created(
    bucket: str, put: PutResult, *, producer: str, at: datetime, replayed: bool = False
) -> ObjectCreated:
    """The ObjectCreated event that announces the object ``put`` wrote in ``bucket``."""
    return ObjectCreated(
        bucket=bucket,
        key=put.key,
        size_bytes=put.size_bytes,
        etag=put.etag,
        producer=producer,
        created_at=at,
        replayed=replayed,
    )


class ObjectStore:
    def __init__(self, clients: AwsClients, bucket: str) -> None:
        self._clients = clients
        self._s3 = clients.s3
        self._objects: S3Store = clients.objects.store(bucket)
        self.bucket = bucket

    def created(
        self, put: PutResult, *, producer: str, at: datetime, replayed: bool = False
    ) -> ObjectCreated:
        """The ObjectCreated event that announces an object this store wrote."""
        return object_created(self.bucket, put, producer=producer, at=at, replayed=replayed)

    async def put_bytes(
        self,
        key: str,
        body: bytes,
        *,
        content_type: str = JSON,
        metadata: Mapping[str, str] | None = None,
    ) -> PutResult:
        """An ordinary (overwriting) put: derived data that a re-run rewrites with the same content."""
        return await self._put(f"put s3://{self.bucket}/{key}", key, body, content_type, metadata)

    async def put_json(
        self,
        key: str,
        value: BaseModel | Mapping[str, Any] | Sequence[Any],
        *,
        metadata: Mapping[str, str] | None = None,
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
        """Create ``key`` once. Same bytes again: ``duplicate``. Different bytes: :class:`Conflict`.

        S3 keeps the object's SHA-256, checked by S3 against the bytes it received
        (:meth:`kept_sha256` reads it back): whoever holds an event naming the object can tell
        whether the bytes it carries are the archived ones without downloading them."""
        try:
            return await self._put(
                f"put-once s3://{self.bucket}/{key}", key, body, content_type, metadata, once=True
            )
        except Conflict:  # 412: the key exists; same bytes is a duplicate, other bytes a conflict
            return await self._settle_existing(key, body)

    async def _put(
        self,
        what: str,
        key: str,
        body: bytes,
        content_type: str,
        metadata: Mapping[str, str] | None,
        *,
        once: bool = False,
    ) -> PutResult:
        """One PutObject carrying the body's SHA-256 (S3 checks and keeps it); ``once``: with
        If-None-Match: * (:class:`Conflict` when the key exists)."""
        attributes = _attributes(content_type, metadata)
        if not obstore_can_name(key):
            conditions = {"IfNoneMatch": "*"} if once else {}
            with translated(what):
                resp = await self._s3.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=body,
                    ContentType=content_type,
                    Metadata=dict(metadata or {}),
                    ChecksumAlgorithm="SHA256",
                    **conditions,  # type: ignore[arg-type]
                )
            return PutResult(key, PutOutcome.CREATED, resp.get("ETag"), len(body))
        mode: PutMode = "create" if once else "overwrite"
        with translated_obstore(what):
            done = await obstore.put_async(
                self._objects, key, body, mode=mode, attributes=attributes, use_multipart=False
            )
        return PutResult(key, PutOutcome.CREATED, done.get("e_tag"), len(body))

    async def _settle_existing(self, key: str, body: bytes) -> PutResult:
        existing = await self.get_bytes(key)
        if existing != body:
            raise Conflict(
                f"s3://{self.bucket}/{key} exists with a different body "
                f"({len(existing)} bytes, sha256 {hashlib.sha256(existing).hexdigest()[:12]}); "
                "it is immutable and was not overwritten"
            )
        return PutResult(key, PutOutcome.DUPLICATE, None, len(body))

    async def presign_upload(
        self, key: str, *, content_type: str, size_bytes: int, expires_in_s: int
    ) -> PresignedPost:
        """A POST that writes exactly ``key``, as ``content_type``, of exactly ``size_bytes``
        bytes, until ``expires_in_s`` from now; signed here, no request is sent. Whoever holds
        it can do nothing else: the conditions are in the signed policy, and S3 checks the
        signer's own permissions (s3:PutObject on the key) when the form arrives."""
        with translated(f"presign POST s3://{self.bucket}/{key}"):
            post = await self._s3.generate_presigned_post(
                Bucket=self.bucket,
                Key=key,
                Fields={"Content-Type": content_type},
                Conditions=[
                    {"Content-Type": content_type},
                    ["content-length-range", size_bytes, size_bytes],
                ],
                ExpiresIn=expires_in_s,
            )
        fields = {str(k): str(v) for k, v in post["fields"].items()}
        expiration = post_policy(fields)["expiration"]
        return PresignedPost(str(post["url"]), fields, parse_iso(expiration, "expiration"))

    async def get_bytes(self, key: str) -> bytes:
        """The object's body. Through obstore in one call: a GET of the range from its first
        byte to far past any object's end, which S3 answers with the whole body (a plain get
        and its body are two results handed back from obstore's I/O thread, each a wake-up of
        the event loop: ~0.12 ms of CPU more per read). An empty object, which no range names
        (416), is read plainly."""
        if obstore_can_name(key):
            with translated_obstore(f"get s3://{self.bucket}/{key}"):
                try:
                    whole = await obstore.get_range_async(
                        self._objects, key, start=0, end=WHOLE_OBJECT_END
                    )
                    return bytes(whole)
                except Exception as err:
                    if not range_unsatisfiable(err):
                        raise
        return (await self.get_object(key)).body

    async def get_object(self, key: str) -> StoredObject:
        """Body, user metadata, content type and ETag in one GET."""
        what = f"get s3://{self.bucket}/{key}"
        if not obstore_can_name(key):
            with translated(what):
                resp = await self._s3.get_object(Bucket=self.bucket, Key=key)
                async with resp["Body"] as stream:
                    body = await stream.read()
            return StoredObject(
                key=key,
                body=body,
                metadata=dict(resp.get("Metadata", {})),
                content_type=str(resp.get("ContentType", "")),
                etag=str(resp.get("ETag", "")),
            )
        with translated_obstore(what):
            got = await obstore.get_async(self._objects, key)
            body = bytes(await got.bytes_async())
        attributes = dict(got.attributes)
        return StoredObject(
            key=key,
            body=body,
            metadata={
                k: str(v) for k, v in attributes.items() if k.lower() not in _ATTRIBUTE_NAMES
            },
            content_type=str(attributes.get("Content-Type", "")),
            etag=str(got.meta.get("e_tag") or ""),
        )

    async def sha256(self, key: str) -> str:
        """The SHA-256 of an object's body, streamed (for bodies whose ETag is no MD5)."""
        digest = hashlib.sha256()
        with translated(f"get s3://{self.bucket}/{key}"):
            resp = await self._s3.get_object(Bucket=self.bucket, Key=key)
            async with resp["Body"] as stream:
                while chunk := await stream.read(1024 * 1024):
                    digest.update(chunk)
        return digest.hexdigest()

    async def copy(
        self,
        source: ObjectInfo,
        dest_key: str,
        *,
        if_absent: bool = False,
        multipart_threshold: int = COPY_OBJECT_MAX_BYTES,
        part_bytes: int = COPY_PART_BYTES,
    ) -> CopyResult:
        """Server-side copy of ``source`` to ``dest_key`` in this bucket, metadata and content type
        kept. Pinned to the listed ETag (CopySourceIfMatch), so a source that changed since it was
        listed is not copied. ``if_absent`` sends If-None-Match: * (CopyObject, or
        CompleteMultipartUpload above the threshold): :class:`Conflict` when ``dest_key`` exists.
        Upstream moto 5 ignores it on CopyObject; AEGIS's emulator (aegis_devstack.motoserver)
        honours it as S3 does."""
        if source.size_bytes > multipart_threshold:
            return await self._copy_multipart(source, dest_key, if_absent, part_bytes)
        conditions = {"IfNoneMatch": "*"} if if_absent else {}
        with translated(f"copy s3://{self.bucket}/{source.key} to {dest_key}"):
            resp = await self._s3.copy_object(
                Bucket=self.bucket,
                Key=dest_key,
                CopySource={"Bucket": self.bucket, "Key": source.key},
                CopySourceIfMatch=source.etag,
                MetadataDirective="COPY",
                **conditions,  # type: ignore[arg-type]
            )
        return CopyResult(dest_key, str(resp.get("CopyObjectResult", {}).get("ETag", "")), 0)

    async def _copy_multipart(
        self, source: ObjectInfo, dest_key: str, if_absent: bool, part_bytes: int
    ) -> CopyResult:
        what = f"multipart copy s3://{self.bucket}/{source.key} to {dest_key}"
        head = await self.head(source.key)
        if head is None:
            raise NotFound(f"{what}: the source is gone")
        headers = {h: head[h] for h in _COPIED_HEADERS if head.get(h)}
        with translated(what):
            upload = await self._s3.create_multipart_upload(
                Bucket=self.bucket, Key=dest_key, Metadata=head.get("Metadata", {}), **headers
            )
        upload_id = upload["UploadId"]
        try:
            parts = []
            for number, (first, last) in enumerate(copy_ranges(source.size_bytes, part_bytes), 1):
                with translated(f"{what}: part {number}"):
                    resp = await self._s3.upload_part_copy(
                        Bucket=self.bucket,
                        Key=dest_key,
                        UploadId=upload_id,
                        PartNumber=number,
                        CopySource={"Bucket": self.bucket, "Key": source.key},
                        CopySourceRange=f"bytes={first}-{last}",
                        CopySourceIfMatch=source.etag,
                    )
                parts.append({"PartNumber": number, "ETag": resp["CopyPartResult"]["ETag"]})
            conditions = {"IfNoneMatch": "*"} if if_absent else {}
            with translated(f"{what}: complete"):
                done = await self._s3.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=dest_key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
                    **conditions,  # type: ignore[arg-type]
                )
        except BaseException:
            with contextlib.suppress(Exception), translated(f"{what}: abort"):
                await self._s3.abort_multipart_upload(
                    Bucket=self.bucket, Key=dest_key, UploadId=upload_id
                )
            raise
        return CopyResult(dest_key, str(done.get("ETag", "")), len(parts))

    async def get_json(self, key: str) -> Any:
        return json.loads(await self.get_bytes(key))

    async def head(self, key: str) -> dict[str, Any] | None:
        """Object metadata, or None when absent."""
        try:
            with translated(f"head s3://{self.bucket}/{key}"):
                resp = await self._s3.head_object(Bucket=self.bucket, Key=key)
        except NotFound:
            return None
        return dict(resp)

    async def exists(self, key: str) -> bool:
        return await self.head(key) is not None

    async def kept_sha256(self, key: str) -> str | None:
        """The SHA-256 S3 keeps for ``key`` (base64, as S3 gives it), or None when the object was
        stored without one. :class:`NotFound` when there is no object."""
        with translated(f"head s3://{self.bucket}/{key}"):
            resp = await self._s3.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        value = resp.get("ChecksumSHA256")
        # a multipart object's checksum is of its parts ("...-3"), not of the bytes
        return value if value and "-" not in value else None

    async def list_objects(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Every object under ``prefix``, in key order, page by page.

        obstore lists whole path segments (``raw/f/`` but not ``raw/f`` alone, which would also
        match ``raw/fa/``): a prefix that ends inside a segment is listed by aiobotocore, and so
        is the rest of a listing from a key obstore cannot name on."""
        after, refused = "", False
        if prefix == "" or (prefix.endswith("/") and obstore_can_name(prefix[:-1])):
            with translated_obstore(f"list s3://{self.bucket}/{prefix}"):
                try:
                    async for batch in obstore.list(self._objects, prefix or None, chunk_size=1000):
                        for meta in batch:
                            info = _info(meta)
                            after = info.key
                            yield info
                except InvalidPathError:
                    refused = True  # a key obstore refuses: the rest of the listing from here
            if not refused:
                return
        paginator = self._s3.get_paginator("list_objects_v2")
        start = {"StartAfter": after} if after else {}
        with translated(f"list s3://{self.bucket}/{prefix}"):
            async for page in paginator.paginate(
                Bucket=self.bucket,
                Prefix=prefix,
                **start,  # type: ignore[arg-type]
            ):
                for obj in page.get("Contents", []):
                    yield ObjectInfo(
                        key=obj["Key"],
                        size_bytes=int(obj.get("Size", 0)),
                        etag=str(obj.get("ETag", "")),
                        last_modified=obj["LastModified"],
                    )

    async def list_keys_between(self, prefix: str, start_after: str, before: str) -> list[str]:
        """The keys under ``prefix`` with ``start_after < key < before``, in key order. S3 starts
        the listing after ``start_after`` (StartAfter) and no page past ``before`` is asked for, so
        a narrow range of a large prefix costs one LIST."""
        found: list[str] = []
        if prefix.endswith("/") and obstore_can_name(prefix[:-1]) and obstore_can_name(start_after):
            with translated_obstore(f"list s3://{self.bucket}/{prefix} after {start_after}"):
                try:
                    async for batch in obstore.list(
                        self._objects, prefix, offset=start_after, chunk_size=1000
                    ):
                        for meta in batch:
                            if meta["path"] >= before:
                                return found
                            found.append(str(meta["path"]))
                except InvalidPathError:  # a key obstore refuses: the rest from here
                    start_after = found[-1] if found else start_after
                else:
                    return found
        paginator = self._s3.get_paginator("list_objects_v2")
        with translated(f"list s3://{self.bucket}/{prefix} after {start_after}"):
            async for page in paginator.paginate(
                Bucket=self.bucket, Prefix=prefix, StartAfter=start_after
            ):
                for obj in page.get("Contents", []):
                    if obj["Key"] >= before:
                        return found
                    found.append(obj["Key"])
        return found

    async def child_prefixes(self, prefix: str) -> list[str]:
        """The "folders" directly under ``prefix`` (``raw/`` -> ``raw/factory-a/``, …)."""
        found: list[str] = []
        paginator = self._s3.get_paginator("list_objects_v2")
        with translated(f"list s3://{self.bucket}/{prefix}*/"):
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
                found.extend(p["Prefix"] for p in page.get("CommonPrefixes", []) if "Prefix" in p)
        return found

    async def list_keys(self, prefix: str) -> list[str]:
        return [info.key async for info in self.list_objects(prefix)]

    async def delete_many(self, keys: Sequence[str]) -> list[str]:
        """Delete in batches of 1000; returns the keys S3 reported as failed."""
        failed: list[str] = []
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start : start + DELETE_BATCH]
            with translated(f"delete {len(batch)} objects from s3://{self.bucket}"):
                resp = await self._s3.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
            failed.extend(e["Key"] for e in resp.get("Errors", []) if "Key" in e)
        return failed

    async def list_versions(self, prefix: str) -> AsyncIterator[VersionInfo]:
        """Every version and delete marker under ``prefix`` (ListObjectVersions), page by page;
        within a page, object versions first (a key's newest first, as S3 lists them), then
        delete markers."""
        paginator = self._s3.get_paginator("list_object_versions")
        with translated(f"list versions s3://{self.bucket}/{prefix}"):
            async for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for v in page.get("Versions", []):
                    yield VersionInfo(
                        key=v["Key"],
                        version_id=str(v.get("VersionId", "null")),
                        size_bytes=int(v.get("Size", 0)),
                        is_latest=bool(v.get("IsLatest")),
                        delete_marker=False,
                        etag=str(v.get("ETag", "")),
                    )
                for m in page.get("DeleteMarkers", []):
                    yield VersionInfo(
                        key=m["Key"],
                        version_id=str(m.get("VersionId", "null")),
                        size_bytes=0,
                        is_latest=bool(m.get("IsLatest")),
                        delete_marker=True,
                    )

    async def delete_versions(self, versions: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """Delete these (key, version id) pairs for good, in DeleteObjects batches of 1000;
        returns the pairs S3 reported as failed."""
        failed: list[tuple[str, str]] = []
        for start in range(0, len(versions), DELETE_BATCH):
            batch = versions[start : start + DELETE_BATCH]
            with translated(f"delete {len(batch)} versions from s3://{self.bucket}"):
                resp = await self._s3.delete_objects(
                    Bucket=self.bucket,
                    Delete={
                        "Objects": [{"Key": k, "VersionId": v} for k, v in batch],
                        "Quiet": True,
                    },
                )
            failed.extend(
                (e["Key"], str(e.get("VersionId", "")))
                for e in resp.get("Errors", [])
                if "Key" in e
            )
        return failed
