"""Black-box harness: the real ingest and processor processes (their console scripts) against a
private Mosquitto, a private NATS JetStream and the S3/DynamoDB emulator, so a test may SIGKILL a
service or restart a server and observe only what a user would: objects, items and events."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiomqtt
import pytest

from aegis_contracts.ids import topic_for
from aegis_contracts.times import format_ts
from aegis_devstack.localservers import ManagedServer
from aegis_devstack.testing.holds import Holds
from aegis_devstack.testing.processes import ServiceProcesses
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsClients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

SCRIPTS = Path(sys.executable).parent


class Pipeline(ServiceProcesses):
    """The services of one test against its private servers, its bucket and its table."""

    def __init__(
        self,
        *,
        mqtt: ManagedServer,
        nats: ManagedServer,
        aws_endpoint: str,
        bucket: str,
        table: str,
        store: ObjectStore,
        readmodel: ReadModel,
        uid: str,
        logs: Path,
    ) -> None:
        super().__init__(
            {
                "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
                "AEGIS_BUCKET": bucket,
                "AEGIS_TABLE": table,
                "AEGIS_MQTT_URL": mqtt.url,
                "AEGIS_NATS_URL": nats.url,
                "AEGIS_LOG_FORMAT": "json",
                # the same client id across restarts: the broker keeps the session and its messages
                "AEGIS_MQTT_CLIENT_ID": f"ingest-{uid}",
                # one ingest: a plain subscription, which the broker restores when it restarts
                "AEGIS_MQTT_SHARE_GROUP": "",
                # an unacked message comes back quickly after a crash
                "AEGIS_PROCESSOR_ACK_WAIT_S": "3",
                "AEGIS_REFRESH_ENABLED": "false",
                # a stop waits out each consumer's fetch in progress: short fetches, short stops
                "AEGIS_FETCH_TIMEOUT_S": "0.2",
            },
            logs,
        )
        self.mqtt, self.nats, self.aws_endpoint = mqtt, nats, aws_endpoint
        self.bucket, self.table, self.store, self.readmodel = bucket, table, store, readmodel
        self.uid = uid

    async def held(self, holds: Holds, name: str, *, within: float) -> None:
        """``holds.held``; when the work never reaches the hold, the failure carries the last
        lines of every service's log (what they were doing instead)."""
        try:
            await holds.held(name, within=within)
        except AssertionError as err:
            tails = "".join(f"\n{self.log_tail(service, 60)}" for service in sorted(self.procs))
            raise AssertionError(f"{err}{tails}") from None

    def factories(self, n: int) -> list[str]:
        return [f"e{self.uid[2:]}-{i}" for i in range(n)]


def factory_state(factory_id: str, seq: int, at: datetime) -> bytes:
    return json.dumps(
        {
            "message_id": f"{factory_id}-{seq:06d}",
            "factory_id": factory_id,
            "device_id": "edge-1",
            "emitted_at": format_ts(at),
            "schema_version": "1.0",
            "sensors": {"temperature_c": 24.0 + seq % 7, "co_ppm": 3.0},
        }
    ).encode()


def stream_of(factories: list[str], per_factory: int, start: datetime) -> list[tuple[str, bytes]]:
    """Interleaved (topic, payload) pairs, event times increasing per factory."""
    return [
        (topic_for(f, "factory_state"), factory_state(f, i, start + timedelta(seconds=i)))
        for i in range(per_factory)
        for f in factories
    ]


async def publish_all(mqtt_url: str, messages: list[tuple[str, bytes]]) -> None:
    host, port = mqtt_url.removeprefix("mqtt://").split(":")
    async with aiomqtt.Client(
        host, int(port), protocol=aiomqtt.ProtocolVersion.V5, max_queued_outgoing_messages=0
    ) as client:
        for topic, payload in messages:
            await client.publish(topic, payload, qos=1)


@pytest.fixture
async def pipeline(
    private_mosquitto: ManagedServer,
    private_nats: ManagedServer,
    aws_endpoint: str,
    aws: AwsClients,
    unique_id: str,
    tmp_path: Path,
) -> AsyncIterator[Pipeline]:
    bucket, table = f"aegis-{unique_id}", f"AEGIS-{unique_id}"
    await bootstrap(aws, bucket=bucket, table=table)
    p = Pipeline(
        mqtt=private_mosquitto,
        nats=private_nats,
        aws_endpoint=aws_endpoint,
        bucket=bucket,
        table=table,
        store=ObjectStore(aws, bucket),
        readmodel=ReadModel(aws.items, table),
        uid=unique_id,
        logs=tmp_path,
    )
    try:
        yield p
    finally:
        # off the event loop: the fakes a test serves in it (a webhook, a trace collector) go on
        # answering while the services stop (a service exports its last spans as it stops)
        await asyncio.to_thread(p.stop)


@pytest.fixture
def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


__all__ = ["Pipeline", "publish_all", "stream_of"]
