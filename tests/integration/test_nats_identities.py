"""The internal bus with identities, on a real nats-server configured by
``aegis_contracts.bus``: the data path runs under its own identities (ingest publishes a raw
event, the processor consumes it and commits LATEST), and the attacks a pod on the network would
try are refused: a forged change event, a forged raw event from the processor's identity, purging
a stream, managing streams from a service."""

from __future__ import annotations

import asyncio
import json
import signal
from dataclasses import replace
from pathlib import Path

import nats.errors
import pytest
from faststream.nats import NatsBroker

from aegis_alert_dispatcher.app import DispatcherApp
from aegis_alert_dispatcher.settings import DispatcherSettings
from aegis_cli.natsauth import server_authorization
from aegis_contracts import keys
from aegis_contracts.archive import Archive, admit
from aegis_contracts.bus import ADMIN
from aegis_contracts.events import ObjectCreated, RawArchived
from aegis_contracts.subjects import STREAMS, change_subject, object_created_subject
from aegis_contracts.times import format_ts, utc_now
from aegis_devstack.testing.natsbus import (
    PASSWORDS,
    TEST_BCRYPT_COST,
    Bus,
    Connect,
    refused,
    refused_publish,
    start_bus,
)
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.waiting import eventually
from aegis_devstack.testing.webhook import FakeWebhook
from aegis_processor.app import create_app
from aegis_processor.settings import ProcessorSettings
from aegis_runtime import natsio
from aegis_runtime.bus import (
    PublishFailed,
    StreamSetupFailed,
    create_broker,
    ensure_streams,
    publish,
    publish_raw_archived,
)
from aegis_runtime.service import ConnectionClosed

pytestmark = pytest.mark.integration


async def archive(foundation: Foundation, factory: str, mid: str, co_ppm: float) -> RawArchived:
    """Archive a device message as ingest does (its own decision, ``admit``) and return the
    event ingest would publish."""
    now = utc_now()
    payload = json.dumps(
        {
            "message_id": mid,
            "factory_id": factory,
            "device_id": "edge-1",
            "emitted_at": now.isoformat(),
            "schema_version": "1.0",
            "sensors": {"co_ppm": co_ppm},
        }
    ).encode()
    decision = admit(
        f"aegis/{factory}/factory_state", payload, now, 1, bucket=foundation.store.bucket
    )
    assert isinstance(decision, Archive)
    await foundation.store.put_immutable(decision.key, payload, metadata=decision.metadata)
    return decision.event


async def stored(admin: NatsBroker, stream: str) -> int:
    js = admin.config.connection_state.stream
    return int((await js.stream_info(stream)).state.messages)


async def test_the_data_path_runs_under_its_own_identities(
    bus: Bus, connect: Connect, foundation: Foundation, aws_endpoint: str, unique_id: str
) -> None:
    factory = f"f-{unique_id}"
    ingest = await connect("ingest")
    # a service checks the streams it needs and may not create them
    assert set((await ensure_streams(ingest, manage=False)).values()) == {"unchanged"}
    event = await archive(foundation, factory, f"m-{unique_id}", 12.0)
    assert await publish_raw_archived(ingest, event) is False
    settings = ProcessorSettings(
        **bus.settings("processor").model_dump(include={"nats_url", "nats_user", "nats_password"}),
        nats_manage_streams=False,
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        table=foundation.table,
        durable=f"processor-{unique_id}",
        subject=f"aegis.raw.{factory}.>",
        refresh_enabled=False,
        processor_fetch_timeout_s=0.3,
    )
    app = create_app(settings)
    await app.start()
    try:

        async def committed() -> bool:
            latest = await foundation.readmodel.get_latest(factory)
            return latest is not None

        await eventually(committed, within=20, what="LATEST from the processor's identity")
    finally:
        await app.stop()
    latest = await foundation.readmodel.get_latest(factory)
    assert latest is not None and latest["factory_state"]["sensors"]["co_ppm"] == 12.0


async def test_forged_events_and_stream_management_are_refused(connect: Connect) -> None:
    admin, ingest, processor = (
        await connect("admin"),
        await connect("ingest"),
        await connect("processor"),
    )
    changes_before = await stored(admin, "AEGIS_EVENTS")
    raw_before = await stored(admin, "AEGIS_RAW")
    # (a JetStream API request the server refuses is dropped: its caller's wait runs out)
    js = natsio.client(ingest).jsm(timeout=1)
    (dlq,) = [spec for spec in STREAMS if spec.name == "AEGIS_DLQ"]
    longer = replace(dlq, max_age_seconds=dlq.max_age_seconds + 86_400)
    # (each refusal waits out its answer: all at once)
    await asyncio.gather(
        # ingest may publish raw events, not a change of LATEST (a forged CRITICAL for the
        # dashboard)
        refused_publish(ingest, change_subject("factory_latest")),
        # the processor may publish changes, not raw events (a forged device message)
        refused_publish(processor, "aegis.raw.factory-b.factory_state"),
        # nobody but the admin manages streams: neither a purge nor a re-configuration (here:
        # keep dead letters a day longer)
        refused(js.purge_stream("AEGIS_RAW"), nats.errors.TimeoutError),
        refused(ensure_streams(processor, [longer]), StreamSetupFailed),
    )
    assert await stored(admin, "AEGIS_EVENTS") == changes_before
    assert await stored(admin, "AEGIS_RAW") == raw_before
    dlq_config = (await admin.config.connection_state.stream.stream_info("AEGIS_DLQ")).config
    assert dlq_config.max_age == dlq.max_age_seconds  # unchanged


def test_every_identity_reads_replies_only_under_its_own_inbox() -> None:
    config = server_authorization({"ingest": "pw-ingest-9f3a", "processor": "pw-proc-71c2"})
    assert '"_INBOX_ingest.>"' in config and '"_INBOX_processor.>"' in config
    assert "_INBOX.>" not in config
    assert "pw-ingest-9f3a" not in config and "$2b$" in config  # bcrypt hashes only
    with pytest.raises(KeyError, match="no NATS identity"):
        server_authorization({"intruder": "z"})


async def test_the_alert_path_runs_under_its_own_identities(
    bus: Bus, connect: Connect, foundation: Foundation, aws_endpoint: str, webhook: FakeWebhook
) -> None:
    """The processor announces a fire snapshot; the dispatcher, under its identity, reads it
    and posts to Slack; the dispatcher may not publish a change event."""
    now = utc_now()
    factory = f"f-fire-{now.microsecond}"
    key = keys.state_snapshot_key(factory, now)
    body = {
        "pk": keys.factory_pk(factory),
        "sk": "LATEST",
        "factory_id": factory,
        "updated_at": format_ts(now),
        "risk": {
            "score": 95,
            "level": "CRITICAL",
            "reasons": [{"code": "FIRE_DETECTED", "severity": "CRITICAL", "detail": "fire"}],
        },
    }
    put = await foundation.store.put_json(key, body)
    processor = await connect("processor")
    settings = DispatcherSettings(
        **bus.settings("alert-dispatcher").model_dump(
            include={"nats_url", "nats_user", "nats_password", "nats_manage_streams"}
        ),
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        table=foundation.table,
        slack_webhook_url=webhook.url,
        alert_durable=f"alerts-{now.microsecond}",
        alert_fetch_timeout_s=0.5,
    )
    app = DispatcherApp(settings)
    await app.start()
    try:
        event = ObjectCreated(
            bucket=foundation.bucket,
            key=key,
            size_bytes=put.size_bytes,
            producer="processor",
            created_at=now,
        )
        await publish(processor, object_created_subject("state_snapshot"), event, msg_id=key)
        await eventually(lambda: len(webhook.delivered) >= 1, within=20, what="the fire alert")
        assert factory in webhook.delivered[0]["text"]
        with pytest.raises(PublishFailed):
            await publish(
                app.broker, change_subject("factory_latest"), b"{}", msg_id="x", ack_timeout=1
            )
    finally:
        await app.stop()


async def test_a_service_whose_identity_is_revoked_exits_to_be_started_again(
    tmp_path: Path, aws_endpoint: str, foundation: Foundation
) -> None:
    """nats-py gives a connection up for good when the server refuses it (a rotated password,
    an identity removed, on a config reload): the service stops and fails, so that its
    supervisor starts it again, instead of living on unready and deaf."""
    bus = start_bus(tmp_path)
    try:
        admin = create_broker(bus.settings(ADMIN), name="test-admin")
        await ensure_streams(admin)
        await natsio.close(admin)
        app = create_app(
            ProcessorSettings(
                **bus.identity("processor"),
                aws_endpoint_url=aws_endpoint,
                bucket=foundation.bucket,
                table=foundation.table,
            )
        )
        stop = asyncio.Event()
        running = asyncio.ensure_future(app.run(stop))
        await asyncio.wait_for(app.started.wait(), 20)
        # the processor's password rotated, the server told to read its config again
        config = bus.folder / "nats.conf"
        text = config.read_text()
        head = text[: text.index("authorization {")]
        config.write_text(
            head
            + server_authorization({**PASSWORDS, "processor": "rotated-pw"}, cost=TEST_BCRYPT_COST)
        )
        assert bus.server.process is not None
        bus.server.process.send_signal(signal.SIGHUP)
        with pytest.raises(ConnectionClosed, match="Authorization"):
            await asyncio.wait_for(running, 30)
        assert app.clients is None  # stopped: its consumers, clients and health server closed
    finally:
        bus.server.stop()
