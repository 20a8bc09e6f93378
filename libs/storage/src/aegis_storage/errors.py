"""Storage errors: the only exceptions services see from this library.

``StorageError`` → ``NotFound`` (no such object or item), ``Conflict`` (a condition refused the write:
an immutable object exists with another body, a claim is taken), ``Transient`` (throttling, time-outs,
5xx: retry or nack). Adapters translate botocore errors with ``raise … from err``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)


class StorageError(Exception):
    """Anything the storage layer could not do."""


class NotFound(StorageError):
    pass


class Conflict(StorageError):
    pass


class Transient(StorageError):
    """Worth retrying later: throttled, timed out, the service had a 5xx."""


_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "404", "NotFound", "ResourceNotFoundException"}
_CONFLICT = {
    "PreconditionFailed",
    "412",
    "ConditionalCheckFailedException",
    "ConditionalRequestConflict",
    "TransactionCanceledException",
}
_TRANSIENT = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "InternalError",
    "InternalServerError",
    "ServiceUnavailable",
    "RequestTimeout",
}


def error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Run a storage call and turn botocore failures into this module's errors."""
    try:
        yield
    except ClientError as err:
        code = error_code(err)
        status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _NOT_FOUND:
            raise NotFound(f"{what}: {code}") from err
        if code in _CONFLICT:
            raise Conflict(f"{what}: {code}") from err
        if code in _TRANSIENT or status >= 500 or status == 429:
            raise Transient(f"{what}: {code or status}") from err
        raise StorageError(f"{what}: {code}: {err}") from err
    except (BotoConnectionError, ReadTimeoutError) as err:
        raise Transient(f"{what}: {err}") from err
    except BotoCoreError as err:
        raise StorageError(f"{what}: {err}") from err
