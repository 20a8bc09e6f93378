"""The S3 client of the per-message calls: obstore (the Rust ``object_store`` crate's async
binding), behind :class:`aegis_storage.s3.ObjectStore` like every other S3 call.

Measured on AEGIS's own calls (``tests/bench/s3clients.py``), a PutObject, GetObject or
HeadObject costs aiobotocore several times the client CPU it costs obstore, whose signing, HTTP
and checksums run in Rust on threads of its own. Every message pays those calls, so the puts,
gets and listings of the hot path go through obstore; everything else (copies, multipart,
versions, presigned POSTs, checksum-mode HEADs, DynamoDB, the control plane) stays on
aiobotocore. Both clients share one configuration (:class:`AwsConfig`: region, endpoint,
attempts, timeouts) and one credential chain.

* Every put carries ``x-amz-checksum-sha256`` (obstore's ``checksum_algorithm``): S3 checks the
  body against it and keeps it, which :meth:`ObjectStore.kept_sha256` reads back. The SHA-256 is
  the one SigV4 computes of the payload anyway, so it costs nothing extra.
* Credentials: with an emulator endpoint and no ``AWS_ACCESS_KEY_ID``, the emulator's test keys
  (as :func:`aegis_storage.clients.open_clients`); otherwise the botocore chain of the session
  the aiobotocore clients use (environment, profile, IRSA web identity, ECS/EKS container role,
  instance profile), read through :class:`ChainCredentials` so both clients always sign with the
  same, refreshed, credentials.
* Retries: ``max_attempts`` as obstore's ``max_retries + 1``, with exponential back-off and
  jitter, on 5xx, 429, dropped connections and time-outs; ``connect_timeout`` and
  ``read_timeout`` as obstore's own.
* Errors: :func:`translated_obstore` turns obstore's exceptions into :mod:`aegis_storage.errors`;
  services never see an obstore type.

obstore runs its requests on a Tokio runtime of its own (a thread per core, started with the
first request, idle between them); an awaiting coroutine is woken on the service's own asyncio
loop. Nothing needs closing at shutdown: its connections are pooled per store and dropped with
it, and its threads never keep the process alive. They must not outlive the interpreter either:
one that hands a result back while the interpreter finalizes crashes the process, so every AEGIS
process ends through :func:`aegis_runtime.process.exit_process`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from aegis_storage.errors import Conflict, NotFound, StorageError, Transient

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Credential, S3Store

    from aegis_storage.clients import AwsConfig

# how long obstore may sign with one answer of the credential chain before it asks again;
# botocore refreshes expiring credentials 15 minutes (at the latest 10) before they expire,
# so what it hands out is always valid for longer than this
CREDENTIALS_TTL = timedelta(minutes=5)
# botocore has no limit on a request as a whole (only on the connect and on each read); obstore
# has one, 30 s by default: it is set far above what any object of the platform needs
REQUEST_TIMEOUT = timedelta(minutes=10)
_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([A-Za-z0-9.]+)</Code>")
_TRANSIENT_WORDS = ("timed out", "timeout", "error sending request", "connection", "dns error")


class FrozenCredentials(Protocol):
    @property
    def access_key(self) -> str | None: ...
    @property
    def secret_key(self) -> str | None: ...
    @property
    def token(self) -> str | None: ...


class CredentialSource(Protocol):
    """aiobotocore's credentials (``AioCredentials`` / ``AioRefreshableCredentials``)."""

    async def get_frozen_credentials(self) -> FrozenCredentials: ...


@dataclass(frozen=True, slots=True)
class StaticKeys:
    """Keys given outright (an identity a test or a tool signs as), as a credential source."""

    access_key: str
    secret_key: str
    token: str | None = None

    async def get_frozen_credentials(self) -> StaticKeys:
        return self


class ChainCredentials:
    """obstore's ``credential_provider``: the botocore chain's current credentials, asked again
    every :data:`CREDENTIALS_TTL` (botocore refreshes them itself before they expire)."""

    def __init__(self, source: CredentialSource | None) -> None:
        self._source = source

    async def __call__(self) -> S3Credential:
        if self._source is None:
            raise StorageError(
                "no AWS credentials: none in the environment, a profile, a web identity token "
                "(IRSA), a container role or an instance profile"
            )
        frozen = await self._source.get_frozen_credentials()
        if not frozen.access_key or not frozen.secret_key:
            raise StorageError("the AWS credential chain gave no access key")
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(UTC) + CREDENTIALS_TTL,
        }


def client_options(cfg: AwsConfig) -> ClientConfig:
    options: ClientConfig = {
        "connect_timeout": timedelta(seconds=cfg.connect_timeout),
        "read_timeout": timedelta(seconds=cfg.read_timeout),
        "timeout": REQUEST_TIMEOUT,
        "pool_max_idle_per_host": str(cfg.max_pool_connections),
    }
    if cfg.endpoint_url and cfg.endpoint_url.startswith("http://"):
        options["allow_http"] = True
    return options


def retry_config(cfg: AwsConfig) -> RetryConfig:
    return {"max_retries": max(cfg.max_attempts - 1, 0)}


def s3_store(
    cfg: AwsConfig, bucket: str, credentials: ChainCredentials | Mapping[str, str]
) -> S3Store:
    """An obstore S3 store of ``bucket`` with AEGIS's settings, signing with ``credentials``:
    the credential chain, or an emulator's static keys
    (:func:`aegis_storage.clients.emulator_credentials`, only with an endpoint override)."""
    from obstore.store import S3Store  # noqa: PLC0415 - see aegis_storage.clients.aio_config

    config: dict[str, Any] = {
        "region": cfg.region,
        "checksum_algorithm": "sha256",
        # an endpoint override (an emulator, a private endpoint) is addressed path-style, as
        # botocore does for it; AWS itself virtual-hosted style
        "virtual_hosted_style_request": cfg.endpoint_url is None,
    }
    if cfg.endpoint_url:
        config["endpoint"] = cfg.endpoint_url
    chain = None
    if isinstance(credentials, ChainCredentials):
        chain = credentials
    elif credentials and cfg.endpoint_url:
        config["access_key_id"] = credentials["aws_access_key_id"]
        config["secret_access_key"] = credentials["aws_secret_access_key"]
    else:
        raise ValueError("an obstore store without a credential chain needs an emulator's keys")
    return S3Store(
        bucket,
        config=config,  # type: ignore[arg-type]
        client_options=client_options(cfg),
        retry_config=retry_config(cfg),
        credential_provider=chain,
    )


class ObjectClient:
    """obstore stores, one per bucket, made on first use and kept for the client's life."""

    def __init__(self, cfg: AwsConfig, credentials: ChainCredentials | Mapping[str, str]) -> None:
        self.config = cfg
        self._credentials = credentials
        self._stores: dict[str, S3Store] = {}

    def store(self, bucket: str) -> S3Store:
        store = self._stores.get(bucket)
        if store is None:
            store = self._stores[bucket] = s3_store(self.config, bucket, self._credentials)
        return store

    def close(self) -> None:
        """Drop the stores (and with them their pooled connections)."""
        self._stores.clear()


def _status(err: Exception) -> int:
    found = _STATUS.search(str(err))
    return int(found.group(1)) if found else 0


@contextmanager
def translated_obstore(what: str) -> Iterator[None]:
    """Run an obstore call and turn its failures into :mod:`aegis_storage.errors`."""
    from obstore import exceptions as obs  # noqa: PLC0415

    try:
        yield
    except FileNotFoundError as err:
        raise NotFound(f"{what}: NoSuchKey") from err
    except (obs.AlreadyExistsError, obs.PreconditionError) as err:
        raise Conflict(f"{what}: PreconditionFailed") from err
    except obs.BaseError as err:
        status, code = _status(err), _code(err, "AccessDenied" if _denied(err) else "")
        if status == 404:
            raise NotFound(f"{what}: {code or status}") from err
        if status in (409, 412):
            raise Conflict(f"{what}: {code or status}") from err
        text = str(err).lower()
        if status >= 500 or status == 429 or (not status and _mentions_transient(text)):
            raise Transient(f"{what}: {code or status or _first_line(err)}") from err
        raise StorageError(
            f"{what}: {code}: {_first_line(err)}" if code else f"{what}: {_first_line(err)}"
        ) from err


def range_unsatisfiable(err: Exception) -> bool:
    """Whether obstore's ``err`` is S3's 416: the range names no byte of the object (an empty
    object has none)."""
    from obstore import exceptions as obs  # noqa: PLC0415

    return isinstance(err, obs.BaseError) and _status(err) == 416


def _denied(err: Exception) -> bool:
    from obstore import exceptions as obs  # noqa: PLC0415

    return isinstance(err, obs.PermissionDeniedError | obs.UnauthenticatedError)


def _code(err: Exception, default: str) -> str:
    """S3's error code (``AccessDenied``, ``SlowDown``, ...) from the answer obstore quotes."""
    found = _CODE.search(str(err))
    return found.group(1) if found else default


def _mentions_transient(text: str) -> bool:
    return any(word in text for word in _TRANSIENT_WORDS)


def _first_line(err: Exception) -> str:
    return str(err).split("\n", 1)[0][:500]
