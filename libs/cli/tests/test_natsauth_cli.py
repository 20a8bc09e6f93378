"""`aegis nats-auth`: a passwords file completed for every identity (kept private), and the
server's authorization block with bcrypt hashes of those passwords, never the passwords."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import bcrypt
from typer.testing import CliRunner

from aegis_cli.app import app
from aegis_contracts.bus import ADMIN, IDENTITIES


def read(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def users(block: str) -> dict[str, dict[str, object]]:
    return {u["user"]: u for u in map(json.loads, re.findall(r"\{\"user\".*\}", block))}


def test_passwords_are_made_kept_private_and_only_their_hashes_reach_the_block(tmp_path: Path):
    passwords, out = tmp_path / "nats-passwords.env", tmp_path / "auth.conf"
    passwords.write_text("ingest=chosen-by-the-operator\n")
    # bcrypt's cheapest cost: what is checked here does not depend on it (the default's below)
    result = CliRunner().invoke(
        app, ["nats-auth", str(passwords), "--out", str(out), "--cost", "4"]
    )
    assert result.exit_code == 0, result.output
    made = read(passwords)
    assert set(made) == {ADMIN, *IDENTITIES} and made["ingest"] == "chosen-by-the-operator"
    assert stat.S_IMODE(passwords.stat().st_mode) == 0o600
    block = out.read_text()
    found = users(block)
    assert set(found) == set(made)
    for name, password in made.items():
        assert password not in block
        assert bcrypt.checkpw(password.encode(), str(found[name]["password"]).encode()), name
    assert "permissions" not in found[ADMIN] and "permissions" in found["ingest"]
    assert all(str(u["password"]).startswith("$2b$04$") for u in found.values())
    # a second run keeps every password (services already hold them), and hashes at the
    # default cost, `nats server passwd`'s
    again = CliRunner().invoke(app, ["nats-auth", str(passwords)])
    assert again.exit_code == 0 and read(passwords) == made
    assert {str(u["password"])[:7] for u in users(again.stdout).values()} == {"$2b$11$"}


def test_an_unknown_identity_is_refused_not_locked_out(tmp_path: Path):
    passwords = tmp_path / "nats-passwords.env"
    passwords.write_text("ingset=typo\n")
    result = CliRunner().invoke(app, ["nats-auth", str(passwords)])
    assert result.exit_code != 0
    assert "not a NATS identity" in result.output
    assert passwords.read_text() == "ingset=typo\n"
