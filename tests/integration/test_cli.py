"""The ``aegis`` command as scripts use it, run as a subprocess against the real emulator and NATS:
with ``--json`` stdout is one JSON document and nothing else, whatever the command logs (logs go
to stderr, JSON lines with AEGIS_LOG_FORMAT=json); a command whose NATS or S3/DynamoDB does not
answer ends, within its connect timeout and retries, with exit code 5 and one line naming the
URL, a password in it hidden."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from aegis_cli.exitcodes import FOUND, OK, UNAVAILABLE
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.cli import run_aegis
from aegis_devstack.testing.storage import Foundation

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "deploy" / "jobs" / "examples.yaml"
DAY = "2026-11-29"
SECRET = "s3cret-in-the-url"


aegis = run_aegis


def environment(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")}
    return env | {"AEGIS_LOG_FORMAT": "json", "AEGIS_LOG_LEVEL": "INFO", **values}


def log_events(stderr: str) -> list[str]:
    """The ``event`` of every JSON log line on stderr (other lines are messages to a person)."""
    events = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            events.append(json.loads(line)["event"])
    return events


async def test_json_goes_to_stdout_and_logs_to_stderr(
    foundation: Foundation, aws_endpoint: str, nats_url: str, tmp_path: Path
) -> None:
    env = environment(
        AEGIS_AWS_ENDPOINT_URL=aws_endpoint,
        AEGIS_BUCKET=foundation.bucket,
        AEGIS_TABLE=foundation.table,
        AEGIS_NATS_URL=nats_url,
        AEGIS_STATE_DIR=str(tmp_path / "state"),
    )
    devices = ["--password-file", str(tmp_path / "passwd"), "--acl-file", str(tmp_path / "acl")]
    # streams first: the commands after it that publish check that the streams exist
    first: list[tuple[list[str], int]] = [(["streams", "--json"], OK)]
    commands: list[tuple[list[str], int]] = [
        (["status", "--json"], OK),
        (["bootstrap", "--check", "--json"], OK),
        (["devices", "list", "--json", *devices], OK),
        (["aggregate", "--from", f"{DAY}T00:00Z", "--to", f"{DAY}T00:10Z", "--json"], OK),
        (["report", "--date", DAY, "--no-events", "--json", "--no-progress"], OK),
        (["jobs", "list", "--json"], OK),
        (["jobs", "validate", str(EXAMPLES), "--json"], OK),
        (["migrate", "plan", "--preset", "datasets-processing", "--json", "--no-progress"], OK),
        (["seal", "raw", "--date", DAY, "--json"], OK),
        (["audit", "raw", "--factory", "factory-z", "--date", DAY, "--json"], FOUND),
        (["replay", "--factory", "factory-z", "--from", f"{DAY}T00:00Z", "--to", f"{DAY}T01:00Z"], OK),
        (["alerts", "resend", "--dry-run", "--json"], OK),
    ]  # fmt: skip
    results: dict[str, tuple[int, str, str]] = {}
    slots = asyncio.Semaphore(3)  # a few at a time: the machine's cores are shared

    async def one(args: list[str]) -> None:
        async with slots:
            results[" ".join(args[:2])] = await aegis(env, *args)

    for batch in (first, commands):
        await asyncio.gather(*(one(args) for args, _ in batch))
    docs: dict[str, Any] = {}
    for args, expected in [*first, *commands]:
        code, out, err = results[" ".join(args[:2])]
        assert code == expected, f"aegis {' '.join(args)}: {code}\n{out}\n{err}"
        docs[args[0]] = json.loads(out)  # the whole of stdout is one document
        assert "Traceback" not in err, err
    assert set(docs["streams"]["streams"]) >= {"AEGIS_RAW", "AEGIS_DLQ"}
    assert docs["bootstrap"]["drift"] == [] and docs["bootstrap"]["exit_code"] == OK
    assert docs["devices"] == [] and docs["jobs"] is not None
    assert [w["start"] for w in docs["aggregate"]["windows"]] == [
        f"{DAY}T00:00:00.000Z",
        f"{DAY}T00:05:00.000Z",
    ]
    assert docs["report"]["days"][0]["date"] == DAY
    assert docs["audit"]["exit_code"] == FOUND and docs["audit"]["partitions"] == []
    assert docs["replay"]["found"] == 0
    assert docs["alerts"]["dry_run"] is True
    # what the commands log is on stderr, as JSON lines
    assert "streams_ensured" in log_events(results["streams --json"][2])
    assert "nats_without_identity" in log_events(results["aggregate --from"][2])


async def test_jobs_validate_json_lists_each_problem(tmp_path: Path) -> None:
    bad = tmp_path / "jobs.json"
    bad.write_text(json.dumps({"jobs": [{"id": "x", "job_name": "n", "trigger_type": "Nope"}, 7]}))
    code, out, err = await aegis(environment(), "jobs", "validate", str(bad), "--json")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["valid"] is False and doc["jobs"] == []
    assert {"job": "x", "field": "trigger_type"}.items() <= doc["problems"][0].items()
    assert doc["problems"][-1] == {"job": "1", "field": None, "reason": "not a mapping"}


@pytest.mark.parametrize(
    "args",
    [
        ["aggregate", "--from", f"{DAY}T00:00Z", "--to", f"{DAY}T00:10Z"],
        ["report", "--date", DAY],
        ["replay", "--factory", "factory-z", "--from", f"{DAY}T00:00Z", "--to", f"{DAY}T01:00Z"],
        ["streams"],
    ],
    ids=lambda args: args[0],
)
async def test_a_command_gives_up_when_nats_does_not_answer(
    args: list[str], aws_endpoint: str
) -> None:
    port = free_port()  # nothing listens there
    env = environment(
        AEGIS_AWS_ENDPOINT_URL=aws_endpoint,
        AEGIS_NATS_URL=f"nats://operator:{SECRET}@127.0.0.1:{port}",
        AEGIS_NATS_CONNECT_TIMEOUT_S="1",
    )
    code, out, err = await aegis(env, *args)
    assert code == UNAVAILABLE, err
    assert out == ""
    assert f"NATS not reachable at nats://operator:**********@127.0.0.1:{port} within 1 s" in err
    assert "AEGIS_NATS_CONNECT_TIMEOUT_S" in err
    assert SECRET not in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["bootstrap", "--check"],
        ["jobs", "list"],
        ["audit", "raw", "--factory", "factory-z", "--date", DAY],
        ["report", "--date", DAY, "--no-events"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
async def test_a_command_gives_up_when_storage_does_not_answer(args: list[str]) -> None:
    port = free_port()
    # two attempts a request, not five: the give-up, without the back-off of three more retries
    env = environment(AEGIS_AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AEGIS_AWS_MAX_ATTEMPTS="2")
    code, out, err = await aegis(env, *args)
    assert code == UNAVAILABLE, err
    assert f"127.0.0.1:{port}" in err and "Traceback" not in err
    assert "AEGIS_AWS_MAX_ATTEMPTS" in err  # it names its setting, as the NATS give-up does
    assert out == "" or not out.strip().startswith("{")


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["incidents", "list"],
        ["silences", "list"],
        ["tokens", "list"],
        ["jobs", "list"],
        ["bootstrap", "--check"],
        ["report", "--date", DAY, "--no-events"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
async def test_a_command_without_aws_credentials_says_how_to_reach_the_emulator(
    args: list[str], tmp_path: Path
) -> None:
    """A shell with no endpoint set reads AWS itself: with no credentials there (none in the
    environment, no files, no instance role), one line says so and names the emulator's
    setting, and no traceback."""
    nowhere = str(tmp_path / "none")
    env = {k: v for k, v in environment().items() if not k.startswith("AWS_")} | {
        "AWS_SHARED_CREDENTIALS_FILE": nowhere,
        "AWS_CONFIG_FILE": nowhere,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    code, out, err = await aegis(env, *args)
    assert code == 1, err
    assert out == ""  # nothing half-read
    assert "no AWS credentials were found" in err, err
    assert "AEGIS_AWS_ENDPOINT_URL=http://127.0.0.1:4566" in err and "Traceback" not in err


async def test_alerts_resend_on_a_nats_without_the_aegis_streams_says_so(
    private_nats, aws_endpoint: str
) -> None:
    """No dead-letter stream is no list of dead letters, not "nothing to resend": pointed at a
    NATS that is not AEGIS's (or not set up yet), the command says which and fails."""
    url = private_nats.url.replace("nats://", f"nats://operator:{SECRET}@")
    env = environment(
        AEGIS_AWS_ENDPOINT_URL=aws_endpoint,
        AEGIS_NATS_URL=url,
        AEGIS_SLACK_WEBHOOK_URL="http://127.0.0.1:9/hook",
    )
    for args in (["--dry-run"], []):
        code, out, err = await aegis(env, "alerts", "resend", *args)
        assert code == 1, err
        assert out == "" and "Traceback" not in err and SECRET not in err
        assert "has no stream AEGIS_DLQ" in err and "`aegis streams`" in err
