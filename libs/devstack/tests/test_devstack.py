"""``aegis up``: the dashboard's access (the operator's own tokens, else a local token kept in a
file), restarts of a child, and the queue following the store across runs."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from aegis_contracts.subjects import STREAMS, dead_letter_subject
from aegis_devstack import stack as devstack
from aegis_devstack.localservers import ManagedServer
from aegis_devstack.stack import ServiceSpec, dashboard_access, local_dashboard_token
from aegis_runtime import natsio
from aegis_runtime.bus import create_broker, ensure_streams
from aegis_runtime.settings import AegisSettings

DASHBOARD = [ServiceSpec("ingest", 0), ServiceSpec("dashboard-api", 0)]


def test_a_local_token_is_made_once_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / ".run" / "dashboard-token"
    token = local_dashboard_token(path)
    assert len(token) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert local_dashboard_token(path) == token  # a screen stays signed in across runs


def test_an_empty_token_file_gets_a_new_token(tmp_path: Path) -> None:
    path = tmp_path / "dashboard-token"
    path.write_text("\n")
    assert local_dashboard_token(path).strip()


def test_the_dashboard_gets_the_digest_never_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AEGIS_DASHBOARD_TOKENS", raising=False)
    monkeypatch.setattr(devstack, "DASHBOARD_TOKEN_FILE", tmp_path / "dashboard-token")
    env, note = dashboard_access(DASHBOARD)
    token = (tmp_path / "dashboard-token").read_text().strip()
    assert env == {"AEGIS_DASHBOARD_TOKENS": f"admin:{hashlib.sha256(token.encode()).hexdigest()}"}
    assert token not in note and str(tmp_path / "dashboard-token") in note


def test_the_operators_tokens_win_and_no_dashboard_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devstack, "DASHBOARD_TOKEN_FILE", tmp_path / "dashboard-token")
    monkeypatch.setenv("AEGIS_DASHBOARD_TOKENS", "a" * 64)
    assert dashboard_access(DASHBOARD)[0] == {}
    monkeypatch.delenv("AEGIS_DASHBOARD_TOKENS")
    assert dashboard_access([ServiceSpec("ingest", 0)])[0] == {}
    assert not (tmp_path / "dashboard-token").exists()


def test_a_service_that_keeps_exiting_is_restarted_ever_more_slowly() -> None:
    waits, last = [], 0.0
    for _ in range(7):  # each run dies at once
        last = devstack.restart_delay(last, ran_for=0.5)
        waits.append(last)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    # a run that lasted a minute was healthy: the next restart is quick again
    assert devstack.restart_delay(30.0, ran_for=devstack.RESTART_RESET_S) == 1.0


async def test_the_queue_is_kept_with_a_store_that_kept_its_data_or_when_asked() -> None:
    # no NATS answers at this URL: keeping must not need it
    settings = AegisSettings(nats_url="nats://127.0.0.1:9", nats_connect_timeout_s=0.5)
    kept = await devstack.align_queue(settings, store_created=False, start="follow")
    assert kept.startswith("aegis up: the queue kept with the store, which kept its data")
    asked = await devstack.align_queue(settings, store_created=True, start="keep")
    assert asked.startswith("aegis up: the queue kept as asked (--keep)")


@pytest.mark.integration
async def test_a_new_store_empties_every_aegis_stream_and_says_how_much(
    private_nats: ManagedServer,
) -> None:
    settings = AegisSettings(nats_url=private_nats.url)
    broker = create_broker(settings, name="align-test")
    await ensure_streams(broker)
    js = natsio.jetstream(broker)
    for subject, n in (("aegis.raw.f-1.factory_state", 3), (dead_letter_subject("x", "y"), 2)):
        for i in range(n):
            await js.publish(subject, b"{}", headers={"Nats-Msg-Id": f"{subject}-{i}"})
    try:
        said = await devstack.align_queue(settings, store_created=True, start="follow")
        assert said == (
            "aegis up: the store started empty, so the queue starts empty with it: messages "
            "purged: AEGIS_RAW 3, AEGIS_EVENTS 0, AEGIS_DLQ 2 (aegis up --keep keeps them)"
        )
        for spec in STREAMS:
            state = await natsio.stream_state(broker, spec.name)
            assert state is not None and state.messages == 0, spec.name
    finally:
        await natsio.close(broker)


def test_aegis_up_runs_the_daily_seal_beside_the_services() -> None:
    """`make run` seals raw/ daily as compose does: the storage-tools schedule seal-raw is one
    of the children aegis up starts, served by the same loop `aegis seal schedule` runs."""
    names = devstack.stack_names()
    assert "seal-raw" in names and "ingest" in names
    assert devstack.stack_entry_point("seal-raw").value == "aegis_storage_tools.schedule:main"
