"""The exit codes of ``aegis`` commands, in one place, and how a failure becomes one.

Every command exits 0 when it did its work and 1 when it could not; 2 is a usage error (bad
options, from click). Codes 3 to 5 keep one meaning across commands, so a script can act on them
without knowing the command:

* 3: done, and it found what it checks for (drift, conflicts, a partition not sealed yet, a
  factory at the ``--fail-on`` level);
* 4: ``aegis audit raw``: a partition differs from its seal;
* 5: a server did not answer: NATS within ``AEGIS_NATS_CONNECT_TIMEOUT_S``, or S3/DynamoDB
  within the client's connect timeout and ``AEGIS_AWS_MAX_ATTEMPTS``. Nothing was done; run it
  again later.

A few commands give 2 a meaning of their own as well (their ``--help`` says which). This module
is import-light: ``aegis --help`` reads :data:`ROOT_EPILOG` without loading any SDK.
"""

from __future__ import annotations

import sys
from urllib.parse import urlsplit

OK = 0
FAILED = 1
USAGE = 2
FOUND = 3
DIFFERS = 4
UNAVAILABLE = 5

MEANINGS = {
    OK: "done",
    FAILED: "failed (the message on stderr says why)",
    USAGE: "bad options or arguments",
    FOUND: "done, and found what the command checks for (drift, conflicts, not sealed, a "
    "factory at the --fail-on level)",
    DIFFERS: "differs (audit raw)",
    UNAVAILABLE: "NATS or S3/DynamoDB did not answer in time; nothing was done",
}

ROOT_EPILOG = "Exit codes: " + "; ".join(f"{code} {text}" for code, text in MEANINGS.items()) + "."


# what a storage give-up adds: how often each request was tried, and the setting that says so
STORAGE_ATTEMPTS = "each request was tried AEGIS_AWS_MAX_ATTEMPTS times"


def _unreachable(err: BaseException) -> tuple[str, str] | None:
    """``("nats" | "storage", message)`` when ``err`` means a server did not answer."""
    from botocore.exceptions import (  # noqa: PLC0415 - only when something failed
        ConnectTimeoutError,
        EndpointConnectionError,
    )

    # the broker module loads FastStream: if no command loaded it, no error can come from it
    broker = sys.modules.get("aegis_runtime.bus")
    aiohttp = sys.modules.get("aiohttp")  # likewise: no aiohttp error unless it was loaded
    for cause in _chain(err):
        if broker is not None and isinstance(cause, broker.BrokerUnavailable):
            return "nats", str(cause)  # it names the URL and the setting
        where = None
        if isinstance(cause, EndpointConnectionError | ConnectTimeoutError):
            url = urlsplit(str(cause.kwargs.get("endpoint_url", "")))  # the request's URL
            where = f"{url.scheme}://{url.netloc}" if url.netloc else "its endpoint"
        # the read model's item client (aiodynamo on aiohttp) could not connect
        elif aiohttp is not None and isinstance(cause, aiohttp.ClientConnectorError):
            where = f"{cause.host}:{cause.port}"
        if where is not None:
            said = (
                f"S3/DynamoDB not reachable at {where} ({type(cause).__name__}; {STORAGE_ATTEMPTS})"
            )
            return "storage", said
    return None


# what a command adds when it found no AWS credentials: without AEGIS_AWS_ENDPOINT_URL it reads
# AWS itself, which is most often a shell meant for the emulator of `make run`
NO_CREDENTIALS = (
    "no AWS credentials were found: set AWS_PROFILE or AWS_ACCESS_KEY_ID, or, for the emulator "
    "of `make run`, AEGIS_AWS_ENDPOINT_URL=http://127.0.0.1:4566"
)


def report(message: str, err: BaseException) -> int:
    """Print ``message`` (what failed, with ``err``) on stderr, and return the exit code ``err``
    means: :data:`UNAVAILABLE` when a server did not answer, else :data:`FAILED`. When S3 or
    DynamoDB did not answer, the message also says how often each request was tried and which
    setting says so (a NATS timeout's own message names its setting); when no AWS credentials
    were found, where they come from and how to use the local emulator instead."""
    found = _unreachable(err)
    if found is not None and found[0] == "storage":
        message = f"{message} ({STORAGE_ATTEMPTS})"
    elif _no_credentials(err):
        message = f"{message.rstrip(': ')} ({NO_CREDENTIALS})"
    print(message, file=sys.stderr)
    return FAILED if found is None else UNAVAILABLE


def report_failure(command: str, err: BaseException) -> int | None:
    """For ``command`` ending with ``err``: when a server did not answer, or storage or NATS
    refused or failed, print what failed on stderr (as :func:`report`) and return the exit code;
    None for any other error (a fault of the command: let it raise, with its traceback)."""
    found = _unreachable(err)
    if found is not None:
        print(f"{command}: {found[1]}", file=sys.stderr)
        return UNAVAILABLE
    # each module is loaded by whatever raised one of its errors
    storage, nats = sys.modules.get("aegis_storage.errors"), sys.modules.get("aegis_runtime.natsio")
    if storage is not None and isinstance(err, storage.StorageError):
        return report(f"{command}: storage failed: {err}", err)
    if nats is not None and isinstance(err, nats.Error):  # nats-py's, named by the runtime
        return report(f"{command}: NATS failed: {err}", err)
    return None


def _no_credentials(err: BaseException) -> bool:
    """Whether ``err`` came from an AWS client that found no credentials to sign with."""
    kinds = tuple(
        getattr(module, name)
        for module, name in (
            (sys.modules.get("botocore.exceptions"), "NoCredentialsError"),
            (sys.modules.get("aiodynamo.errors"), "NoCredentialsFound"),
        )
        if module is not None
    )
    return bool(kinds) and any(isinstance(cause, kinds) for cause in _chain(err))


def _chain(err: BaseException) -> list[BaseException]:
    """``err`` and what it was raised from, as a traceback shows them."""
    found: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in found:
        found.append(current)
        suppressed = current.__suppress_context__
        current = current.__cause__ or (None if suppressed else current.__context__)
    return found
