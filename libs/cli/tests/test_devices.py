"""``aegis devices``: Mosquitto-compatible password hashes, the ACL per role, hostile names refused,
the password printed once and only to stdout. The broker itself is exercised in
tests/integration/test_broker_identity.py."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aegis_cli.app import app
from aegis_cli.devices import (
    DeviceError,
    DeviceRegistry,
    Role,
    hash_password,
    verify_password,
)

runner = CliRunner()


def test_hash_is_the_one_mosquitto_passwd_writes() -> None:
    # `mosquitto_passwd -b pw alice secret` (Mosquitto 2.0.11) wrote this line
    line = (
        "$7$101$fxolFejMJ/CqFkes$vBo1oZUiXNDO+JO2ctHm5DRVDN6WKCMrMB+UZCna2RYzFgusaNq139Cm9a1uinhuE"
        "TmgMsObwn5jpYt8Yz8gHg=="
    )
    salt = base64.b64decode("fxolFejMJ/CqFkes")
    assert hash_password("secret", salt=salt) == line
    assert verify_password("secret", line)
    assert not verify_password("Secret", line)
    assert not verify_password("secret", "plain-text")


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto-clients absent")
def test_mosquitto_passwd_writes_what_we_verify(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.touch()
    subprocess.run(["mosquitto_passwd", "-b", str(pw), "bob", "hunter2"], check=True)
    _, encoded = pw.read_text().strip().split(":", 1)
    assert verify_password("hunter2", encoded)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "../etc",
        "factory/a",
        "factory+",
        "factory#",
        "a:b",
        "a b",
        "Factory-A",
        "fаctory",  # Cyrillic a
        "-lead",
        "x" * 64,
        "a\nuser root",  # ACL injection
        "$SYS",
    ],
)
def test_hostile_names_are_refused(tmp_path: Path, name: str) -> None:
    registry = DeviceRegistry(tmp_path / "passwd", tmp_path / "acl")
    with pytest.raises(DeviceError):
        registry.add(name, Role.FACTORY)
    assert registry.devices() == []
    assert not (tmp_path / "passwd").exists()


def test_cloud_infra_and_the_services_prefix_are_reserved_for_factories(tmp_path: Path) -> None:
    registry = DeviceRegistry(tmp_path / "p", tmp_path / "a")
    for name in ("cloud-infra", "aegis-ingest-ingest-0"):  # the second is a service's client id
        with pytest.raises(DeviceError, match="reserved"):
            registry.add(name, Role.FACTORY)
    assert registry.add("aegis-ingest", Role.INGEST)  # a service account may be so named


def test_add_list_revoke_and_the_files(tmp_path: Path) -> None:
    registry = DeviceRegistry(tmp_path / "passwd", tmp_path / "acl")
    pa = registry.add("factory-a", Role.FACTORY)
    registry.add("aegis-ingest", Role.INGEST)
    registry.add("aegis-collector", Role.MONITOR)
    assert len(pa) == 32 and pa != registry.add("factory-b", Role.FACTORY)
    with pytest.raises(DeviceError, match="exists"):
        registry.add("factory-a", Role.FACTORY)
    assert [(d.name, d.role) for d in registry.devices()] == [
        ("aegis-collector", Role.MONITOR),
        ("aegis-ingest", Role.INGEST),
        ("factory-a", Role.FACTORY),
        ("factory-b", Role.FACTORY),
    ]
    acl = (tmp_path / "acl").read_text()
    assert (
        "user factory-a\n# role factory\ntopic write aegis/factory-a/+\n"
        "topic read aegis/factory-a/upload_url/+\n"
    ) in acl
    assert (
        "user aegis-ingest\n# role ingest\ntopic read aegis/+/+\ntopic write aegis/+/upload_url/+\n"
    ) in acl
    assert "user aegis-collector\n# role monitor\ntopic read $SYS/#\n" in acl
    hashes = dict(line.split(":", 1) for line in (tmp_path / "passwd").read_text().splitlines())
    assert verify_password(pa, hashes["factory-a"]) and pa not in (tmp_path / "passwd").read_text()
    assert (tmp_path / "passwd").stat().st_mode & 0o777 == 0o640
    # devices and services are in separate files (the broker's two listeners)
    assert set(hashes) == {"factory-a", "factory-b"}
    services = (tmp_path / "passwd-services").read_text()
    assert {line.split(":", 1)[0] for line in services.splitlines()} == {
        "aegis-collector",
        "aegis-ingest",
    }

    assert registry.revoke("factory-a").role is Role.FACTORY
    assert "factory-a" not in (tmp_path / "passwd").read_text()
    assert "factory-a" not in (tmp_path / "acl").read_text()
    with pytest.raises(DeviceError, match="no device"):
        registry.revoke("factory-a")


def test_sync_rewrites_an_older_acl_with_each_roles_current_lines_and_keeps_passwords(
    tmp_path: Path,
) -> None:
    registry = DeviceRegistry(tmp_path / "passwd", tmp_path / "acl")
    registry.add("factory-a", Role.FACTORY)
    registry.add("aegis-ingest", Role.INGEST)
    passwords = (tmp_path / "passwd").read_text(), (tmp_path / "passwd-services").read_text()
    # what an older version wrote: no upload lines
    (tmp_path / "acl").write_text(
        "user factory-a\n# role factory\ntopic write aegis/factory-a/+\n\n"
        "user aegis-ingest\n# role ingest\ntopic read aegis/+/+\n"
    )
    assert [d.name for d in registry.sync()] == ["factory-a", "aegis-ingest"]
    acl = (tmp_path / "acl").read_text()
    assert "topic read aegis/factory-a/upload_url/+\n" in acl
    assert "topic write aegis/+/upload_url/+\n" in acl
    assert ((tmp_path / "passwd").read_text(), (tmp_path / "passwd-services").read_text()) == (
        passwords
    )
    files = ["--password-file", str(tmp_path / "passwd"), "--acl-file", str(tmp_path / "acl")]
    synced = runner.invoke(app, ["devices", "sync", *files])
    assert synced.exit_code == 0, synced.output
    assert (tmp_path / "acl").read_text() == acl


def test_an_acl_with_an_unknown_role_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "acl").write_text("user x\n# role admin\ntopic readwrite #\n")
    (tmp_path / "passwd").write_text("x:$7$101$AAAA$BBBB\n")
    with pytest.raises(DeviceError, match="unknown role"):
        DeviceRegistry(tmp_path / "passwd", tmp_path / "acl").devices()


def test_cli_prints_the_password_once_on_stdout_only(tmp_path: Path) -> None:
    files = ["--password-file", str(tmp_path / "passwd"), "--acl-file", str(tmp_path / "acl")]
    added = runner.invoke(app, ["devices", "add", "factory-a", *files])
    assert added.exit_code == 0, added.output
    password = added.stdout.strip()
    assert len(password) == 32 and password not in added.stderr
    assert "publish to aegis/factory-a/+" in added.stderr and "kill -HUP" in added.stderr

    listed = runner.invoke(app, ["devices", "list", "--json", *files])
    assert json.loads(listed.stdout) == [{"name": "factory-a", "role": "factory"}]
    assert password not in listed.output

    again = runner.invoke(app, ["devices", "add", "factory-a", *files])
    assert again.exit_code == 1 and "exists" in again.stderr and again.stdout == ""
    hostile = runner.invoke(app, ["devices", "add", "../../x", *files])
    assert hostile.exit_code == 1 and "factory_id" in hostile.stderr
    role = runner.invoke(app, ["devices", "add", "x", "--role", "admin", *files])
    assert role.exit_code == 2

    revoked = runner.invoke(app, ["devices", "revoke", "factory-a", *files])
    assert revoked.exit_code == 0 and "revoked factory-a" in revoked.stderr
    assert runner.invoke(app, ["devices", "revoke", "factory-a", *files]).exit_code == 1
    assert runner.invoke(app, ["devices", "list", "--json", *files]).stdout.strip() == "[]"
