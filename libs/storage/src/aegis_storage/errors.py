"""Storage errors: the only exceptions services see from this library.

``StorageError`` → ``NotFound`` (no such object or item), ``Conflict`` (a condition refused the write:
an immutable object exists with another body, a claim is taken), ``Transient`` (throttling, time-outs,
5xx: retry or nack). Adapters translate botocore and aiodynamo errors with ``raise … from err``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager

import aiodynamo.errors as dynamo
import aiohttp
from aiodynamo.http.types import RequestFailed
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
    "TransactionConflictException",
    "TransactionInProgressException",
}


# aiodynamo's errors (the read model's item calls, raised after its last attempt) by the code
# DynamoDB answered: its error classes, or the answer itself when aiodynamo knew no class for it
_DYNAMO_CODES = {cls: code for code, cls in dynamo.ERRORS.items()} | {
    dynamo.InternalDynamoError: "InternalServerError",
    dynamo.ServiceUnavailable: "ServiceUnavailable",
}


def _dynamo_code(err: dynamo.AIODynamoError) -> str:
    if isinstance(err, dynamo.UnknownError):
        try:
            return str(json.loads(err.body)["__type"]).rsplit("#", 1)[-1]
        except (ValueError, KeyError, TypeError):
            # not DynamoDB's JSON: an XML error document (a proxy's, an emulator's) or nothing
            found = re.search(rb"<Code>(\w+)</Code>", err.body or b"")
            return found.group(1).decode() if found else str(err.status)
    return _DYNAMO_CODES.get(type(err), type(err).__name__)


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
    except dynamo.AIODynamoError as err:
        code = _dynamo_code(err)
        if code in _NOT_FOUND:
            raise NotFound(f"{what}: {code}") from err
        if code in _CONFLICT:
            raise Conflict(f"{what}: {code}") from err
        if code in _TRANSIENT or (code.isdigit() and int(code) >= 500):
            raise Transient(f"{what}: {code}") from err
        raise StorageError(f"{what}: {code}: {err}") from err
    except (RequestFailed, aiohttp.ClientError, TimeoutError) as err:
        # aiodynamo's transport failed on the last attempt (asyncio.TimeoutError is TimeoutError)
        raise Transient(f"{what}: {type(err).__name__}: {err}") from err
    except (BotoConnectionError, ReadTimeoutError) as err:
        raise Transient(f"{what}: {err}") from err
    except BotoCoreError as err:
        raise StorageError(f"{what}: {err}") from err
