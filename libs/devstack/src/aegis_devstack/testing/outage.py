"""A TCP proxy in front of a server that a test or bench can take down and bring back.

``OutageProxy(upstream_port)`` forwards every connection on its own port to the upstream server.
``down()`` closes every open connection and refuses new ones, as a stopped server does, while
the upstream keeps its state (the S3/DynamoDB emulator keeps everything in memory: stopping its
process would lose every object and item); ``up()`` accepts connections again. The proxy runs in
a thread of its own, so the services' traffic never waits for the caller's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from aegis_devstack.localservers import free_port

_CHUNK = 65536
_T = TypeVar("_T")


class OutageProxy:
    def __init__(self, upstream_port: int, *, host: str = "127.0.0.1") -> None:
        self.host, self.upstream_port = host, upstream_port
        self.port = free_port()
        # its own accepting, not asyncio's Server or sock_accept: a Server closed while an
        # accepted connection is being set up, or a sock_accept cancelled as it accepts, drops
        # that connection's socket unclosed; accepting in a reader callback cannot race
        self._listener: socket.socket | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._links: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"outage-proxy-{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def is_up(self) -> bool:
        return self._listener is not None

    def up(self) -> None:
        """Accept connections (again)."""
        self._call(self._up())

    def down(self) -> None:
        """Refuse new connections and cut the open ones, as a stopped server would."""
        self._call(self._down())

    def close(self) -> None:
        if not self._loop.is_closed():
            self._call(self._down())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def _call(self, work: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(30)

    async def _up(self) -> None:
        if self._listener is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.port))
            listener.listen(128)
            listener.setblocking(False)
            self._listener = listener
            self._loop.add_reader(listener, self._accept, listener)

    def _accept(self, listener: socket.socket) -> None:
        """Every connection waiting on ``listener``, each to a link of its own."""
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # none left (BlockingIOError) or the listener failed
                return
            conn.setblocking(False)
            link = self._loop.create_task(self._link(conn))
            self._links.add(link)
            link.add_done_callback(self._links.discard)

    async def _down(self) -> None:
        """Stop listening and close every open connection (both sides): the pumps end on their
        own, each closing what it opened; no link is cancelled before it could clean up.
        Returns when every link has ended and its sockets are released (a loop stopped before
        that would leave transports open)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            self._loop.remove_reader(listener)
            listener.close()  # connections still in its backlog are reset
        while self._links:
            for writer in list(self._writers):
                writer.close()
            await asyncio.wait(set(self._links), timeout=1)
        await asyncio.sleep(0)  # the closed transports' last callbacks

    async def _link(self, conn: socket.socket) -> None:
        writer: asyncio.StreamWriter | None = None
        upstream_writer: asyncio.StreamWriter | None = None
        with contextlib.suppress(OSError, ExceptionGroup):
            try:
                reader, writer = await asyncio.open_connection(sock=conn)
                self._writers.add(writer)
                if self._listener is None:  # accepted just before the proxy went down
                    return
                upstream_reader, upstream_writer = await asyncio.open_connection(
                    self.host, self.upstream_port
                )
                self._writers.add(upstream_writer)
                async with asyncio.TaskGroup() as pumps:
                    pumps.create_task(_pump(reader, upstream_writer))
                    pumps.create_task(_pump(upstream_reader, writer))
            finally:
                if writer is None:
                    conn.close()
                for w in (writer, upstream_writer):
                    if w is not None:
                        self._writers.discard(w)
                        w.close()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while data := await source.read(_CHUNK):
        sink.write(data)
        await sink.drain()
    if sink.can_write_eof():
        sink.write_eof()
