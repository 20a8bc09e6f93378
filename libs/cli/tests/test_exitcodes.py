"""How a failure becomes an exit code: 5 when a server did not answer (the NATS connect timeout,
an S3/DynamoDB endpoint that refused or timed out), 1 for anything else."""

from __future__ import annotations

import pytest
from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

from aegis_cli import exitcodes
from aegis_runtime.bus import BrokerUnavailable
from aegis_storage.errors import StorageError, Transient

URL = "http://127.0.0.1:4566/bucket?list-type=2&prefix=raw%2F"


def code_of(err: BaseException) -> int:
    """The exit code a command's handler returns for ``err`` (what it prints aside)."""
    return exitcodes.report("failed", err)


def raised_from(error: BaseException, cause: BaseException) -> BaseException:
    """``error`` as ``raise error from cause`` leaves it."""
    error.__cause__, error.__suppress_context__ = cause, True
    return error


def test_an_endpoint_that_never_answered_is_unavailable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for cause in (
        EndpointConnectionError(endpoint_url=URL),
        ConnectTimeoutError(endpoint_url=URL),
    ):
        err = raised_from(Transient("list s3://bucket/raw/"), cause)
        assert code_of(err) == exitcodes.UNAVAILABLE
        capsys.readouterr()
        assert exitcodes.report_failure("aegis audit", err) == exitcodes.UNAVAILABLE
        assert capsys.readouterr().err == (
            f"aegis audit: S3/DynamoDB not reachable at http://127.0.0.1:4566 "
            f"({type(cause).__name__}; each request was tried AEGIS_AWS_MAX_ATTEMPTS times)\n"
        )


def test_nats_not_answering_is_unavailable_with_its_own_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = BrokerUnavailable("NATS not reachable at nats://127.0.0.1:4222 within 1 s")
    assert exitcodes.report_failure("aegis streams", err) == exitcodes.UNAVAILABLE
    assert capsys.readouterr().err == f"aegis streams: {err}\n"
    assert code_of(RuntimeError("wrapped")) == exitcodes.FAILED
    assert code_of(raised_from(RuntimeError("wrapped"), err)) == exitcodes.UNAVAILABLE


def test_other_failures_are_failed() -> None:
    assert code_of(StorageError("query: AccessDenied")) == exitcodes.FAILED
    # a context the code chose to hide (raise ... from None) is not looked into
    hidden = StorageError("something else")
    hidden.__context__ = EndpointConnectionError(endpoint_url=URL)
    hidden.__suppress_context__ = True
    assert code_of(hidden) == exitcodes.FAILED
    hidden.__suppress_context__ = False  # raised while handling it: a traceback shows it
    assert code_of(hidden) == exitcodes.UNAVAILABLE


def test_a_report_says_what_failed_and_for_storage_how_often_it_was_tried(
    capsys: pytest.CaptureFixture[str],
) -> None:
    storage = raised_from(
        Transient("list s3://bucket/raw/"), EndpointConnectionError(endpoint_url=URL)
    )
    assert exitcodes.report("audit raw failed: list", storage) == exitcodes.UNAVAILABLE
    assert capsys.readouterr().err == (
        "audit raw failed: list (each request was tried AEGIS_AWS_MAX_ATTEMPTS times)\n"
    )
    nats = BrokerUnavailable("NATS not reachable at nats://127.0.0.1:4222 within 1 s")
    assert exitcodes.report(f"streams failed: {nats}", nats) == exitcodes.UNAVAILABLE
    assert capsys.readouterr().err == f"streams failed: {nats}\n"  # it names its setting
    denied = StorageError("query: AccessDenied")
    assert exitcodes.report("jobs: storage failed: query: AccessDenied", denied) == exitcodes.FAILED
    assert capsys.readouterr().err == "jobs: storage failed: query: AccessDenied\n"


def test_no_credentials_says_where_they_come_from_and_how_to_use_the_emulator(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from aiodynamo.errors import NoCredentialsFound  # noqa: PLC0415
    from botocore.exceptions import NoCredentialsError  # noqa: PLC0415

    for cause in (NoCredentialsFound(), NoCredentialsError()):
        err = raised_from(StorageError(f"query TOKEN: {cause}"), cause)
        assert exitcodes.report("tokens: storage failed: query TOKEN: ", err) == exitcodes.FAILED
        assert capsys.readouterr().err == (
            f"tokens: storage failed: query TOKEN ({exitcodes.NO_CREDENTIALS})\n"
        )
    assert "AEGIS_AWS_ENDPOINT_URL=http://127.0.0.1:4566" in exitcodes.NO_CREDENTIALS
    exitcodes.report("jobs: storage failed: query: AccessDenied", StorageError("AccessDenied"))
    assert "credentials" not in capsys.readouterr().err


def test_a_command_failure_is_a_line_and_a_code_for_servers_and_storage_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    down = raised_from(Transient("query"), EndpointConnectionError(endpoint_url=URL))
    assert exitcodes.report_failure("aegis silences", down) == exitcodes.UNAVAILABLE
    assert capsys.readouterr().err.startswith("aegis silences: S3/DynamoDB not reachable at ")
    denied = StorageError("query SILENCE: AccessDenied")
    assert exitcodes.report_failure("aegis silences", denied) == exitcodes.FAILED
    assert capsys.readouterr().err == (
        "aegis silences: storage failed: query SILENCE: AccessDenied\n"
    )
    assert exitcodes.report_failure("aegis silences", KeyError("a fault")) is None
    assert capsys.readouterr().err == ""


def test_a_nats_refusal_is_a_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    from nats.js.errors import NotFoundError  # noqa: PLC0415

    refused = NotFoundError(code=404, err_code=10059, description="stream not found")
    assert exitcodes.report_failure("aegis streams", refused) == exitcodes.FAILED
    said = capsys.readouterr().err
    assert said.startswith("aegis streams: NATS failed: ") and "stream not found" in said
