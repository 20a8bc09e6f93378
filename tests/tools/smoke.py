"""Smoke test of a running AEGIS: a device message published to its broker reaches LATEST in the
read model, and the dashboard answers.

    .venv/bin/python tests/tools/smoke.py --mqtt-url mqtt://127.0.0.1:1883 \\
        --aws-endpoint http://127.0.0.1:4566 --table AEGIS-DynamoDB-FactoryStatus \\
        --dashboard-url http://127.0.0.1:8080

Exit 0 when both hold within ``--timeout`` seconds, 1 (with what was missing) otherwise. The
factory is a new one each run (``smoke-{hex}``), so an old LATEST cannot pass for a new one.
Used by the Docker workflow against `docker compose up`, and by the `make run` end-to-end test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from urllib.parse import urlsplit

import aiomqtt
import httpx

from aegis_contracts.ids import topic_for
from aegis_contracts.times import format_ts, utc_now
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.readmodel import ReadModel


async def smoke(args: argparse.Namespace) -> list[str]:
    """What did not happen (empty: all did)."""
    factory = f"smoke-{secrets.token_hex(4)}"
    message_id = f"{factory}-0001"
    payload = {
        "message_id": message_id,
        "factory_id": factory,
        "device_id": "smoke-edge",
        "emitted_at": format_ts(utc_now()),
        "schema_version": "1.0",
        "sensors": {"temperature_c": 21.5, "co_ppm": 2.0},
    }
    url = urlsplit(args.mqtt_url)
    async with aiomqtt.Client(
        url.hostname or "127.0.0.1",
        url.port or 1883,
        identifier=factory,
        protocol=aiomqtt.ProtocolVersion.V5,
    ) as client:
        await client.publish(topic_for(factory, "factory_state"), json.dumps(payload), qos=1)
    print(f"smoke: published {message_id} to {args.mqtt_url}")

    missing = []
    deadline = time.monotonic() + args.timeout
    config = AwsConfig(endpoint_url=args.aws_endpoint, region=args.region)
    async with open_clients(config) as clients:
        readmodel = ReadModel(clients.items, args.table)
        latest = None
        while time.monotonic() < deadline:
            latest = await readmodel.get_latest(factory)
            if latest is not None:
                break
            await asyncio.sleep(0.5)
        if latest is None:
            missing.append(f"no LATEST for {factory} in {args.table} after {args.timeout:.0f} s")
        else:
            print(f"smoke: LATEST of {factory}: level {latest.get('level')}")

    async with httpx.AsyncClient(base_url=args.dashboard_url, timeout=10) as http:
        try:
            answer = await http.get("/healthz")
        except httpx.HTTPError as err:
            missing.append(f"the dashboard at {args.dashboard_url} does not answer: {err}")
        else:
            if answer.status_code != 200:
                missing.append(f"the dashboard's /healthz answered {answer.status_code}")
            else:
                print(f"smoke: the dashboard at {args.dashboard_url} answers")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mqtt-url", default="mqtt://127.0.0.1:1883")
    parser.add_argument("--aws-endpoint", default="http://127.0.0.1:4566")
    parser.add_argument("--region", default="ap-south-1")
    parser.add_argument("--table", default="AEGIS-DynamoDB-FactoryStatus")
    parser.add_argument("--dashboard-url", default="http://127.0.0.1:8080")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    missing = asyncio.run(smoke(args))
    for line in missing:
        print(f"smoke: FAILED: {line}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
