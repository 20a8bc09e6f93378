"""``aegis up``'s dashboard access: the operator's own tokens, else a local token kept in a file."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from aegis_devstack import stack as devstack
from aegis_devstack.stack import ServiceSpec, dashboard_access, local_dashboard_token

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
    assert env == {"AEGIS_DASHBOARD_TOKENS": hashlib.sha256(token.encode()).hexdigest()}
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
