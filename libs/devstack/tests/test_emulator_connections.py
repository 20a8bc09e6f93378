"""The emulator keeps a client's connection for its next request, as S3 and DynamoDB do, and never
takes a request's unread body, or the request after it, for anything else
(aegis_devstack.motoserver.keep_connections_alive); against a real emulator over TCP."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import pytest

from aegis_devstack.localservers import ManagedServer
from aegis_devstack.motoserver import UNDELIVERED
from aegis_devstack.testing.holds import Holds
from aegis_devstack.testing.waiting import eventually

pytestmark = pytest.mark.integration


def connect(endpoint: str) -> socket.socket:
    url = urlsplit(endpoint)
    return socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=30)


def answer(reader: BinaryIO) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer read off ``reader``: status, headers (lower-cased names), body."""
    status = reader.readline()
    assert status.startswith(b"HTTP/1.1 "), status
    headers: dict[str, str] = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = reader.read(int(headers.get("content-length", "0")))
    return int(status.split()[1]), headers, body


def clock_request(body: bytes = b"") -> bytes:
    """A GET of the emulator's clock, which reads no body: with ``body``, one it leaves unread."""
    length = f"Content-Length: {len(body)}\r\n" if body else ""
    return f"GET /_aegis/clock HTTP/1.1\r\nHost: emulator\r\n{length}\r\n".encode() + body


def test_two_requests_sent_at_once_are_both_answered_on_the_one_connection(
    aws_endpoint: str,
) -> None:
    """The first carries a body nothing reads; the second follows in the same write, so the
    server's reads after the first answer find it waiting. Both are answered, in order, and
    the connection stays open for a third."""
    with connect(aws_endpoint) as sock, sock.makefile("rb") as reader:
        sock.sendall(clock_request(b"x" * 70_000) + clock_request())
        first, second = answer(reader), answer(reader)
        sock.sendall(clock_request())
        third = answer(reader)
    for status, headers, body in (first, second, third):
        assert status == 200 and "now" in json.loads(body)
        assert headers.get("connection", "").lower() != "close"


def test_a_chunked_request_is_answered_and_its_connection_closed(aws_endpoint: str) -> None:
    """A body whose end only its chunks tell is not one the server can stop at: it answers,
    then closes, as werkzeug does for every request."""
    with connect(aws_endpoint) as sock, sock.makefile("rb") as reader:
        sock.sendall(
            b"GET /_aegis/clock HTTP/1.1\r\nHost: emulator\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n"
        )
        status, headers, _ = answer(reader)
        assert status == 200 and headers["connection"].lower() == "close"
        assert reader.read() == b""  # closed by the server


def test_a_request_that_asks_to_close_is_answered_and_its_connection_closed(
    aws_endpoint: str,
) -> None:
    with connect(aws_endpoint) as sock, sock.makefile("rb") as reader:
        sock.sendall(b"GET /_aegis/clock HTTP/1.1\r\nHost: emulator\r\nConnection: close\r\n\r\n")
        status, headers, _ = answer(reader)
        assert status == 200 and headers["connection"].lower() == "close"
        assert reader.read() == b""


def reset_on_close(sock: socket.socket) -> None:
    """Close ``sock`` with a reset, not a FIN: a write to it then fails at once."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def test_an_answer_whose_connection_is_gone_is_logged_with_its_request(
    own_emulator: ManagedServer,
) -> None:
    """A PutObject is applied and its answer held; the client resets the connection; released,
    the answer cannot be written. The write stands, and the emulator's log names the request
    whose answer was not delivered (a client sends such a request again)."""
    url, log = own_emulator.url, own_emulator.log_file
    assert log is not None
    holds = Holds(url)
    with connect(url) as sock, sock.makefile("rb") as reader:
        sock.sendall(s3_request("PUT", "/dropped-answers"))
        assert answer(reader)[0] == 200
        holds.arm("lost", "s3", "PutObject", contains=["k-lost"], when="after")
        sock.sendall(s3_request("PUT", "/dropped-answers/k-lost", b"hello"))
        await holds.held("lost", within=10)
        reset_on_close(sock)
    holds.release("lost")
    await eventually(lambda: undelivered(log) != [], within=10, what="the undelivered answer")
    (line,) = undelivered(log)
    assert "s3 PutObject PUT /dropped-answers/k-lost (" in line, line
    with connect(url) as sock, sock.makefile("rb") as reader:
        sock.sendall(s3_request("GET", "/dropped-answers/k-lost"))
        status, _, body = answer(reader)
    assert (status, body) == (200, b"hello")  # the write stands


def test_a_connection_reset_between_requests_logs_nothing(own_emulator: ManagedServer) -> None:
    """A client that resets a kept connection after its answer lost nothing: no line."""
    url, log = own_emulator.url, own_emulator.log_file
    assert log is not None
    with connect(url) as sock, sock.makefile("rb") as reader:
        sock.sendall(s3_request("PUT", "/idle-resets"))
        assert answer(reader)[0] == 200
        reset_on_close(sock)
    # the emulator has seen the reset once it answers the next connection's request
    with connect(url) as sock, sock.makefile("rb") as reader:
        sock.sendall(s3_request("GET", "/idle-resets"))
        assert answer(reader)[0] == 200
    assert undelivered(log) == []


def undelivered(log: Path) -> list[str]:
    """The emulator's undelivered answers but its start's own probes (``GET /``, which
    the start gives up after 1 s, a slow first answer)."""
    lines = log.read_text().splitlines()
    return [x for x in lines if UNDELIVERED in x and "ListBuckets GET / (" not in x]


def s3_request(method: str, path: str, body: bytes = b"") -> bytes:
    """A path-style S3 request. The emulator reads the service from the credential's scope and,
    unless IAM is enforced, checks no signature: the scope's date is any date."""
    credential = "Credential=test/20000101/us-east-1/s3/aws4_request"
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
        f"Authorization: AWS4-HMAC-SHA256 {credential}, SignedHeaders=host, Signature=0\r\n\r\n"
    ).encode() + body
