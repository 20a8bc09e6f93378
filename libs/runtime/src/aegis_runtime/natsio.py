"""nats-py, the client under FastStream, for the few things FastStream 0.7 does not model.

FastStream runs every consumer (:func:`aegis_runtime.bus.durable_pull`) and makes every single
publish (:func:`aegis_runtime.bus.publish`, ``broker.publish``). What it has no call for is done
here with nats-py, and nowhere else: no other module of the platform imports ``nats`` (tests may).
The client is the connection FastStream opened, taken from its broker in one place
(:func:`_connection_state`, FastStream's own ``JsClient``/``Client`` context); the dashboard's
live feed is the one connection of its own (:func:`connect`).

Why each use needs nats-py:

* **Streams** (:func:`stream_config`, :func:`add_stream`, :func:`update_stream`): the JetStream
  API that brings a stream to the contract. FastStream declares a stream only as a side effect
  of starting a subscriber (create it, or merge subjects into it); it cannot compare a running
  stream with the contract, keep what an operator raised, or only check that a stream exists.
* **The queue's state** (:func:`stream_state`, :func:`consumers`, :func:`last_message`): a
  stream's per-subject counts, its consumers with their lag, the last message of a subject (the
  heartbeats): JetStream API reads, not subscriptions.
* **Many publishes at once** (:func:`publish_async`): JetStream publishes on nats-py's
  connection whose acks one reply subscription collects. FastStream publishes one message at a
  time, each a request that waits for its ack; nats-py's own asynchronous publish spends more
  per message than it needs (see :class:`_Acks`).
* **A delivery's settlement** (:func:`jetstream_delivery`, :data:`Msg`): the broker middleware
  reads the raw message FastStream hands it (delivery count, stream sequence) and acks it, or
  naks it with a delay, before FastStream's own acknowledgement would.
* **A one-off read of a durable consumer** (:func:`pull_durable`): ``aegis alerts resend``
  fetches dead letters in batches and settles each after a webhook call. FastStream's pull
  subscribers settle by a handler's outcome, and their ``get_one`` fetches a message a request.
* **Closing without draining** (:func:`close`): a one-shot command's connection is flushed and
  closed. FastStream's ``stop`` drains, which waits out a pull subscription's fetch (30 s).
* **The live feed's connection** (:func:`connect`): core subscriptions on a connection that
  must come back after any outage. FastStream's error callback re-raises the errors it deems
  unrecoverable (an authorization violation, a stale connection), which ends nats-py's
  reconnection for good; and its ``stop`` drains, which fails while NATS is away and leaves the
  reconnection running.
* **JetStream's account info** (:func:`account_info`): the development stack's check that a
  server has JetStream before anything runs on it.
* **Pacing a consumer on a closed connection** (:func:`pace_fetches`): FastStream's pull
  consumer fetches again at once when a fetch fails because the connection is closed, and such a
  fetch fails without ever giving the event loop a turn: once nats-py has given a connection up
  for good (the server refused it), the consumer would spin at full CPU and starve the process
  (its stop, its health server). Its subscription's fetch pauses before that failure. The same
  wrapper turns the plain ``asyncio.TimeoutError`` that nats-py raises when a fetch's deadline
  has run out before its second request into nats-py's own ``TimeoutError``: FastStream's pull
  loop expects that one for an empty fetch, and otherwise logs the plain one as a crash of its
  consumer task (a traceback) and starts the task again. The wrapper is put on as the
  subscription is made, before the consumer's first fetch: put on after the broker's start, it
  came after the first fetches, which on a busy start could still crash that way.
* **A silent server's connection given up** (:func:`give_up_unacknowledged`): the socket under
  each connection (FastStream's and the live feed's) gets a TCP_USER_TIMEOUT as long as its
  pings may go unanswered; nats-py does not expose its socket, and without it a reconnection
  after a partition waits for the operating system's own limit (minutes).

Errors are nats-py's own: :data:`Error` is their base (a nats-py timeout is also a builtin
``TimeoutError``); :func:`store_refused` tells JetStream's "store failed" refusal apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import NO_RESPONDERS_STATUS, Client, Server
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from aegis_runtime import tracing

if TYPE_CHECKING:
    from faststream.nats import NatsBroker
    from faststream.nats.broker.state import BrokerState

__all__ = [
    "Client",
    "ConsumerInfo",
    "Error",
    "JetStreamContext",
    "JetStreamOff",
    "Msg",
    "NotFound",
    "PullSubscription",
    "Server",
    "StreamState",
    "account_info",
    "add_stream",
    "client",
    "close",
    "connect",
    "consumers",
    "forget_unanswered",
    "give_up_unacknowledged",
    "is_jetstream_refusal",
    "jetstream",
    "jetstream_delivery",
    "last_message",
    "publish_async",
    "pull_durable",
    "store_refused",
    "stream_config",
    "stream_state",
    "take_buffered",
    "unanswered_limit",
    "update_stream",
]

# the names the platform's modules use for nats-py's types and errors, so that none imports it
Error = nats.errors.Error
NotFound = nats.js.errors.NotFoundError  # no such stream, consumer or message
ConsumerInfo = api.ConsumerInfo
StreamState = api.StreamState
PullSubscription = JetStreamContext.PullSubscription

# The JetStream API's error codes: "stream name already in use with a different configuration",
# and "store failed" (a discard-new limit of the stream or of the subject was reached).
_STREAM_NAME_IN_USE = 10058
_STREAM_STORE_FAILED = 10077
# "no suitable peers for placement": fewer nodes are current than the stream's replicas (a
# cluster still forming, or a node down)
_NO_SUITABLE_PEERS = 10005


class JetStreamOff(Exception):
    """Nothing answers the JetStream API: the server runs without JetStream."""


# -- the client FastStream opened -----------------------------------------------------------------


def _connection_state(broker: NatsBroker) -> BrokerState:
    # The one place the nats-py objects are taken from a broker: the state FastStream's
    # ``Client`` and ``JsClient`` context annotations read. Raises FastStream's IncorrectState
    # when the broker is not connected.
    state: BrokerState = broker.config.connection_state
    return state


def client(broker: NatsBroker) -> Client:
    """The nats-py connection of a connected ``broker``."""
    return _connection_state(broker).connection


def jetstream(broker: NatsBroker) -> JetStreamContext:
    """The JetStream context FastStream made at connect (it honours the broker's js_options)."""
    return _connection_state(broker).stream


async def close(broker: NatsBroker) -> None:
    """Flush and close the connection of a one-shot ``broker`` (a command's): not FastStream's
    ``stop``, whose drain waits out a pull subscription's fetch timeout."""
    nc = client(broker)
    try:
        await nc.flush()
    finally:
        await nc.close()


async def connect(options: Mapping[str, Any], **more: Any) -> Client:
    """A connection of its own, for the dashboard's live feed only (see the module's docstring):
    ``options`` as :func:`aegis_runtime.bus.connect_options` gives them, plus ``more`` of
    nats-py's connection arguments (name, reconnection, callbacks). Like every connection of
    a service, it is given up once its server leaves data unacknowledged for as long as its
    pings may go unanswered (:func:`give_up_unacknowledged`), this one and each it reconnects
    with."""
    limit = unanswered_limit(options)
    reconnected = more.pop("reconnected_cb", None)
    client: Client | None = None

    async def on_reconnected() -> None:
        if client is not None:
            give_up_unacknowledged(client, limit)
        if reconnected is not None:
            await reconnected()

    client = await nats.connect(**{**options, **more}, reconnected_cb=on_reconnected)
    give_up_unacknowledged(client, limit)
    return client


def unanswered_limit(options: Mapping[str, Any]) -> float:
    """Seconds the pings of a connection made with ``options`` (nats-py's ``ping_interval`` and
    ``max_outstanding_pings``) may go unanswered before it counts as dead."""
    return float(options["ping_interval"]) * (int(options["max_outstanding_pings"]) + 1)


def give_up_unacknowledged(client: Client, seconds: float) -> bool:
    """Have the operating system drop ``client``'s current connection once data sent on it has
    waited ``seconds`` for the server's acknowledgement (TCP_USER_TIMEOUT); True when set (a
    TCP connection on Linux).

    nats-py's pings notice a server that went silent without a FIN or an RST (a partition, a
    link that died), but before it connects to another server it waits for the silent
    connection to close, and while data sent to it is unacknowledged that lasts until the
    operating system gives the connection up: about 15 minutes with Linux's defaults, all that
    time without a connection. With this limit the connection is dropped as soon as the pings
    have gone unanswered."""
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    # nats-py's TCP transport keeps asyncio's stream writer; another transport (websocket) has
    # none, and is left as it is
    writer = getattr(getattr(client, "_transport", None), "_io_writer", None)
    sock = writer.get_extra_info("socket") if writer is not None else None
    if option is None or sock is None:
        return False
    sock.setsockopt(socket.IPPROTO_TCP, option, max(1, round(seconds * 1000)))
    return True


# -- streams ---------------------------------------------------------------------------------------


async def stream_config(broker: NatsBroker, name: str) -> api.StreamConfig | None:
    """The configuration of stream ``name``; None when there is no such stream."""
    try:
        return (await jetstream(broker).stream_info(name)).config
    except nats.js.errors.NotFoundError:
        return None


async def add_stream(broker: NatsBroker, config: api.StreamConfig) -> bool:
    """Create the stream; False when its name is taken meanwhile (another replica created it)."""
    try:
        await jetstream(broker).add_stream(config)
    except nats.js.errors.BadRequestError as err:
        if err.err_code != _STREAM_NAME_IN_USE:
            raise
        return False
    return True


def no_placement(err: BaseException | None) -> bool:
    """True when JetStream refused a stream because too few nodes could hold its replicas."""
    return isinstance(err, nats.js.errors.BadRequestError) and err.err_code == _NO_SUITABLE_PEERS


async def update_stream(broker: NatsBroker, config: api.StreamConfig) -> None:
    await jetstream(broker).update_stream(config)


# -- the queue's state -----------------------------------------------------------------------------


async def stream_state(
    broker: NatsBroker, name: str, *, subjects_filter: str | None = None
) -> StreamState | None:
    """The state of stream ``name`` (None when there is none): messages, bytes, consumers, and
    with ``subjects_filter`` the number of messages of each subject it matches."""
    try:
        info = await jetstream(broker).stream_info(name, subjects_filter=subjects_filter)
    except nats.js.errors.NotFoundError:
        return None
    return info.state


async def purge_stream(broker: NatsBroker, name: str) -> int | None:
    """Remove every message of stream ``name`` (its configuration and consumers stay): the
    number removed, None when there is no such stream."""
    try:
        state = (await jetstream(broker).stream_info(name)).state
    except nats.js.errors.NotFoundError:
        return None
    await jetstream(broker).purge_stream(name)
    return state.messages


async def consumers(broker: NatsBroker, stream: str) -> list[ConsumerInfo]:
    """Every consumer of ``stream``, with its lag (pending, ack pending, redelivered)."""
    found: list[ConsumerInfo] = await jetstream(broker).consumers_info(stream)
    return found


async def last_message(broker: NatsBroker, stream: str, subject: str) -> bytes | None:
    """The body of the last message of ``subject`` in ``stream``; None when there is none."""
    try:
        msg = await jetstream(broker).get_last_msg(stream, subject)
    except nats.js.errors.NotFoundError:
        return None
    return msg.data or b""


async def account_info(broker: NatsBroker | Client, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
    """JetStream's account info (limits, usage) as a dict, through a broker or a connection of
    nats-py's. Raises :class:`JetStreamOff` when the server has no JetStream, else nats-py's
    errors (a refusal is a JetStream API error)."""
    nc = broker if isinstance(broker, Client) else client(broker)
    try:
        info = await nc.jsm(timeout=timeout).account_info()
    except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError) as err:
        raise JetStreamOff("no responders for $JS.API.INFO (JetStream not enabled)") from err
    return dict(info.as_dict())


class Unreachable(Exception):
    """No connection to the server could be made (refused, or no handshake in time)."""


async def account_info_at(url: str, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
    """:func:`account_info` of the server at ``url``, over a connection of its own that is
    closed whatever happened: when the server accepts the connection but does not finish the
    handshake in time, nats-py (reconnecting disallowed) raises and leaves the socket open.
    Raises :class:`Unreachable` when no connection could be made."""
    nc = Client()
    try:
        try:
            await nc.connect(
                servers=[url],
                connect_timeout=timeout,  # type: ignore[arg-type]  # seconds, as a float
                allow_reconnect=False,
                max_reconnect_attempts=0,
                error_cb=_no_report,  # the raised error says it; nats-py would print a traceback
            )
        except Exception as err:
            raise Unreachable(repr(err)) from err
        return await account_info(nc, timeout)
    finally:
        await nc.close()


async def _no_report(_err: Exception) -> None:
    return None


def is_jetstream_refusal(err: BaseException) -> bool:
    """True when JetStream answered a call with an error (rather than not answering)."""
    return isinstance(err, nats.js.errors.Error)


# -- publishing ------------------------------------------------------------------------------------


class _Acks:
    """The acks of one connection's asynchronous JetStream publishes: one reply subscription
    (``{inbox}.{nuid}.*``, the inbox form nats-py's own asynchronous publish uses, so the same
    permissions allow it), each publish's reply subject a counter's next value under it, and a
    future per publish resolved by its ack, or failed by the server's refusal.

    nats-py's ``publish_async`` does the same, and per message also waits for a semaphore through
    ``asyncio.wait_for`` (a task and a timer), draws random bytes for its token (a system call)
    and registers a completion callback: measured alone, a batch of 4 cost 163-218 us of CPU
    through it and 140-179 us here (docs/benchmarks.md). Here a publish is the PUB and a
    dictionary entry; the caller bounds how many it leaves unanswered
    (:func:`aegis_runtime.bus.publish_many` waits for every batch's acks)."""

    def __init__(self, connection: Client) -> None:
        self.connection = connection
        self.prefix = ""
        self.futures: dict[str, asyncio.Future[api.PubAck]] = {}
        self._next = 0
        self._subscribing = asyncio.Lock()

    async def ready(self) -> None:
        """Subscribe to the replies, once (a failed subscribe is tried again by the next call)."""
        if self.prefix:
            return
        async with self._subscribing:
            if not self.prefix:
                prefix = f"{self.connection.new_inbox()}."
                await self.connection.subscribe(f"{prefix}*", cb=self._answered)
                self.prefix = prefix

    async def _answered(self, msg: Msg) -> None:
        future = self.futures.pop(msg.subject[len(self.prefix) :], None)
        if future is None or future.done():
            return  # given up on (its publish timed out) or answered twice
        if msg.headers and msg.headers.get(api.Header.STATUS) == NO_RESPONDERS_STATUS:
            future.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            answer = json.loads(msg.data)
        except ValueError as err:
            future.set_exception(nats.js.errors.Error(f"an ack that is not JSON: {err}"))
            return
        if "error" in answer:
            future.set_exception(nats.js.errors.APIError.from_error(answer["error"]))
        else:
            future.set_result(api.PubAck.from_response(answer))

    async def publish(
        self, subject: str, data: bytes, headers: dict[str, str]
    ) -> asyncio.Future[api.PubAck]:
        token = str(self._next)
        self._next += 1
        future: asyncio.Future[api.PubAck] = asyncio.get_running_loop().create_future()
        self.futures[token] = future
        try:
            await self.connection.publish(subject, data, reply=self.prefix + token, headers=headers)
        except BaseException:
            del self.futures[token]
            raise
        return future

    def forget_unanswered(self) -> None:
        """Drop the futures of publishes given up on (done or cancelled by their caller)."""
        for token in [t for t, f in self.futures.items() if f.done()]:
            del self.futures[token]


_ACKS: weakref.WeakKeyDictionary[Client, _Acks] = weakref.WeakKeyDictionary()


def _acks(broker: NatsBroker) -> _Acks:
    connection = client(broker)
    acks = _ACKS.get(connection)
    if acks is None:
        acks = _ACKS[connection] = _Acks(connection)
    return acks


async def publish_async(
    broker: NatsBroker, messages: Sequence[tuple[str, bytes, str, dict[str, str]]]
) -> list[asyncio.Future[api.PubAck]]:
    """Send JetStream messages (subject, data, the stream that must store it, headers) without
    waiting: each one's ack is the returned future (see :class:`_Acks`), which fails with the
    server's refusal. A future no answer comes for never resolves: await them with a timeout,
    then :func:`forget_unanswered`. The current trace context (if tracing is on) goes into the
    headers, as FastStream's middleware does for the publishes it makes."""
    acks = _acks(broker)
    await acks.ready()
    futures = []
    for subject, data, stream, headers in messages:
        sent = dict(headers)
        sent[api.Header.EXPECTED_STREAM] = stream
        tracing.inject(sent)
        futures.append(await acks.publish(subject, data, sent))
    return futures


def forget_unanswered(broker: NatsBroker) -> None:
    """After a timeout: drop what :func:`publish_async` kept for publishes never answered."""
    with contextlib.suppress(Exception):  # no connection any more: nothing kept to drop
        _acks(broker).forget_unanswered()


def store_refused(err: BaseException) -> str | None:
    """JetStream's description when it refused to store a message at a discard-new limit of its
    stream or subject ("store failed"); None for any other failure."""
    if isinstance(err, nats.js.errors.APIError) and err.err_code == _STREAM_STORE_FAILED:
        return str(err.description)
    return None


# -- consuming -------------------------------------------------------------------------------------


def jetstream_delivery(msg: object) -> Msg | None:
    """``msg`` when it is a JetStream delivery (a raw nats-py message with JetStream metadata:
    stream, sequence, delivery count); None for a core NATS message or anything else."""
    if not isinstance(msg, Msg):
        return None
    try:
        _ = msg.metadata
    except Exception:
        return None
    return msg


async def pull_durable(
    broker: NatsBroker,
    subject: str,
    *,
    durable: str,
    stream: str,
    ack_wait: float,
    max_deliver: int,
) -> PullSubscription:
    """Bind to (or create) the durable pull consumer ``durable`` of ``stream`` on ``subject``:
    ``fetch(batch, timeout)`` on the result returns messages to settle one by one (``ack``,
    ``nak``); it raises ``TimeoutError`` when none came. ``max_deliver=-1``: no limit."""
    return await jetstream(broker).pull_subscribe(
        subject,
        durable=durable,
        stream=stream,
        config=api.ConsumerConfig(ack_wait=ack_wait, max_deliver=max_deliver),
    )


CLOSED_FETCH_PAUSE_S = 1.0


def pace_fetches(subscription: PullSubscription, pause: float = CLOSED_FETCH_PAUSE_S) -> bool:
    """Make ``subscription``'s fetch wait ``pause`` seconds before it fails for a closed
    connection, and say an empty fetch with nats-py's own ``TimeoutError`` (see the module
    docstring); False when it already does. Called as the subscription is made, before its
    consumer's first fetch (:func:`aegis_runtime.bus.durable_pull`)."""
    fetch = subscription.fetch
    if getattr(fetch, "aegis_paced", False):
        return False

    async def paced_fetch(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fetch(*args, **kwargs)
        except nats.errors.ConnectionClosedError:
            await asyncio.sleep(pause)
            raise
        except nats.errors.TimeoutError:
            raise
        except TimeoutError as err:  # an empty fetch, said the plain way
            raise nats.errors.TimeoutError from err

    paced_fetch.aegis_paced = True  # type: ignore[attr-defined]
    subscription.fetch = paced_fetch  # type: ignore[method-assign]
    return True


def take_buffered(subscription: PullSubscription) -> list[Msg]:
    """The messages the server delivered to ``subscription`` that wait in its buffer, taken out
    of it, without a request to the server. The status messages that end pull requests (No
    Messages, Request Timeout: one arrives after its fetch gave up waiting) are dropped: handed
    to nats-py's fetch, the buffer's status messages made it send a new pull request each time,
    so a stopping consumer went on taking new messages for up to the graceful timeout."""
    sub = subscription._sub  # nats-py's Subscription: its buffer, and the bytes it counts
    taken: list[Msg] = []
    while not sub._pending_queue.empty():
        msg = sub._pending_queue.get_nowait()
        sub._pending_queue.task_done()
        sub._pending_size -= len(msg.data)
        if not JetStreamContext.is_status_msg(msg):
            taken.append(msg)
    return taken
