"""The emulator keeps a client's connection for its next request, as S3 and DynamoDB do, and never
takes a request's unread body, or the request after it, for anything else
(aegis_devstack.motoserver.keep_connections_alive); against a real emulator over TCP."""

from __future__ import annotations

import json
import socket
from typing import BinaryIO
from urllib.parse import urlsplit

import pytest

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
