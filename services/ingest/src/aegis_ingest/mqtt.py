"""The MQTT side of ingest: an aiomqtt v5 client with a persistent session, a Receive Maximum, and
acknowledgement deferred until a message is safe (raw object stored and event confirmed).

Manual acknowledgement: aiomqtt has no API for it and its paho client sends PUBACK as soon as
``on_message`` returns (aiomqtt issue #345). paho 2.x can defer that PUBACK: ``manual_ack_set(True)``
before the connection exists, then ``ack(mid, qos)`` per message. aiomqtt keeps its paho client in
the private attribute ``Client._client``; :func:`enable_manual_ack` is the one place that reaches
into it, checks that it is what we expect (else start-up fails loudly rather than acking early), and
is covered by a unit test and by the redelivery test in services/ingest/tests/test_ingest.py.

Ordering: MQTT (3.1.1 and v5) asks a client to send PUBACKs in the order the PUBLISHes came;
paho's manual ``ack`` does not enforce it and Mosquitto matches PUBACKs by packet id in any order.
Ingest acknowledges as messages finish, so one slow message never holds back the others' acks.
"""

from __future__ import annotations

import paho.mqtt.client as paho
from aiomqtt import Client, ProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from aegis_ingest.settings import IngestSettings


def connect_properties(*, session_expiry_seconds: int, receive_maximum: int) -> Properties:
    """CONNECT properties: keep the session (and its queued/unacked messages) for
    ``session_expiry_seconds`` after a disconnect; at most ``receive_maximum`` unacked in flight."""
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]  # paho leaves it untyped
    props.SessionExpiryInterval = session_expiry_seconds
    props.ReceiveMaximum = receive_maximum
    return props


def create_client(settings: IngestSettings) -> Client:
    """An unconnected aiomqtt client for ``settings`` with manual acknowledgement on."""
    host, port, username, password = settings.mqtt_endpoint()
    client = Client(
        host,
        port,
        username=username,
        password=password,
        identifier=settings.mqtt_client_id,
        protocol=ProtocolVersion.V5,
        # False on every connect, not only the first: a restarted replica resumes its session
        clean_start=False,
        properties=connect_properties(
            session_expiry_seconds=settings.mqtt_session_expiry_s,
            receive_maximum=settings.mqtt_max_inflight,
        ),
        keepalive=settings.mqtt_keepalive_s,
        tls_context=settings.mqtt_tls_context(),
    )
    enable_manual_ack(client)
    return client


def enable_manual_ack(client: Client) -> paho.Client:
    """Switch the paho client under ``client`` to manual acknowledgement; return it.

    Must run before the client connects: a persistent session redelivers right after CONNACK.
    """
    inner = getattr(client, "_client", None)
    if not isinstance(inner, paho.Client) or not callable(getattr(inner, "manual_ack_set", None)):
        raise TypeError(
            "aiomqtt.Client no longer wraps a paho 2.x client as ._client; ingest cannot defer "
            "MQTT acknowledgements (check the aiomqtt/paho versions)"
        )
    inner.manual_ack_set(True)
    return inner


class Acker:
    """Acknowledges the messages of one connection. Once that connection is gone, acks are dropped:
    the broker redelivers those messages on the next connection, and ingest handles them again."""

    def __init__(self, client: Client) -> None:
        self._paho = enable_manual_ack(client)
        self.open = True

    def ack(self, mid: int, qos: int) -> bool:
        """Send PUBACK for ``mid``; True when it was queued on a live connection."""
        if qos == 0 or not self.open:
            return False
        return self._paho.ack(mid, qos) == paho.MQTT_ERR_SUCCESS

    def close(self) -> None:
        self.open = False
