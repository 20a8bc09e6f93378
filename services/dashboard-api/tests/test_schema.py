"""schemathesis against the API's own OpenAPI schema: the app on a real HTTP server (its own thread
and event loop, storage clients opened by its lifespan) over a seeded read model in the emulator,
every operation called with generated inputs and a valid token. No 500, no response that breaks
the schema (status, content type, body, headers), and no data without the token. The examples are
bounded so it runs in seconds."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from aegis_contracts import keys
from aegis_contracts.keys import ReportArtifact
from aegis_contracts.times import format_ts
from aegis_dashboard_api.access import token_digest
from aegis_dashboard_api.app import create_app
from aegis_dashboard_api.settings import DashboardSettings
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.builders import seed_latest
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

pytestmark = pytest.mark.integration

TOKEN = "schema-check-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FACTORY = "factory-a"


async def _seed(endpoint: str, bucket: str, table: str) -> None:
    now = datetime.now(UTC)
    async with open_clients(AwsConfig(endpoint_url=endpoint)) as clients:
        await bootstrap(clients, bucket=bucket, table=table)
        store, rm = ObjectStore(clients, bucket), ReadModel(clients.items, table)
        image = keys.image_snapshot_key(FACTORY, now, "cam-1.jpg")
        await store.put_bytes(image, b"\xff\xd8 frame", content_type="image/jpeg")
        await seed_latest(
            rm,
            FACTORY,
            {
                "risk": {"score": 40.0, "level": "WARNING", "reasons": [{"code": "CO_HIGH"}]},
                "pipeline_status": {"status": "OK", "checked_at": format_ts(now)},
                "last_factory_state_at": format_ts(now),
                "latest_image_snapshot": {"s3_key": image, "camera_id": "cam-1"},
                "updated_at": format_ts(now),
            },
        )
        ttl = int((now + timedelta(hours=1)).timestamp())
        pk = keys.factory_pk(FACTORY)
        await rm.put_item({"pk": pk, "sk": keys.history_state_sk(now), "ttl": ttl})
        bucket_start = now.replace(second=0, microsecond=0) - timedelta(minutes=now.minute % 5 + 5)
        await rm.put_item({"pk": pk, "sk": keys.graph_5m_sk(bucket_start), "ttl": ttl})
        await rm.put_item({"pk": keys.CLOUD_PK, "sk": keys.LATEST_SK, "overall_status": "NORMAL"})
        day = now.date()
        await store.put_bytes(
            keys.report_key(day, FACTORY, ReportArtifact.REPORT),
            b"# report\n",
            content_type="text/markdown",
        )


@pytest.fixture(scope="module")
def base_url(aws_endpoint: str) -> Iterator[str]:
    uid = f"schema-{free_port()}"
    bucket, table = f"aegis-{uid}", f"AEGIS-{uid}"
    asyncio.run(_seed(aws_endpoint, bucket, table))
    app_settings = DashboardSettings(
        aws_endpoint_url=aws_endpoint,
        bucket=bucket,
        table=table,
        dashboard_tokens=token_digest(TOKEN),
        dashboard_live=False,  # the live feed is not part of the schema
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(app_settings), host="127.0.0.1", port=port, log_config=None, access_log=False
        )
    )
    thread = threading.Thread(target=server.run, name="dashboard-schema", daemon=True)
    thread.start()
    deadline = datetime.now(UTC) + timedelta(seconds=20)
    while not server.started:
        assert datetime.now(UTC) < deadline, "the dashboard did not start"
        threading.Event().wait(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)


# the schema the app itself serves at /openapi.json (building the app connects nothing)
schema = schemathesis.openapi.from_dict(
    create_app(DashboardSettings(dashboard_live=False)).openapi()
)


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_operation_conforms_to_the_schema(case: schemathesis.Case, base_url: str) -> None:
    # a new silence that fits the schema may still be refused by the safety guard (a CRITICAL
    # silence without a reason, or longer than 8 hours): a 422 there is the guard, documented
    guarded = case.method == "POST" and case.path == "/api/silences"
    excluded = [positive_data_acceptance] if guarded else []
    case.call_and_validate(base_url=base_url, headers=AUTH, excluded_checks=excluded)


def test_the_served_schema_is_the_one_tested(base_url: str) -> None:
    served = httpx.get(f"{base_url}/openapi.json").json()
    assert served == create_app(DashboardSettings(dashboard_live=False)).openapi()
