"""The operator's commands run from a read-only working directory, as in the images (whose /app
is read-only and root-owned): anything a command keeps goes to the state directory
(``AEGIS_STATE_DIR``), never next to where it was started. A migration that wrote its journal
into the working directory crashed after copying, before verifying and deleting.

As root the test drops the capability that lets root write anywhere (setpriv), so the
directory's mode binds it as it binds the images' user."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from aegis_runtime.settings import AegisSettings

pytestmark = pytest.mark.integration

AEGIS = str(Path(sys.executable).parent / "aegis")
DAY = "2026-11-29"


def unprivileged() -> list[str]:
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only directory would not bind")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]


async def run(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *unprivileged(),
        *args,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")


@pytest.fixture
def read_only(tmp_path: Path) -> Any:
    folder = tmp_path / "app"
    folder.mkdir()
    folder.chmod(0o555)
    yield folder
    folder.chmod(0o755)


async def test_every_command_runs_from_a_read_only_directory(
    foundation: Any, aws_endpoint: str, read_only: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")} | {
        "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
        "AEGIS_BUCKET": foundation.bucket,
        "AEGIS_TABLE": foundation.table,
        "AEGIS_STATE_DIR": str(state),
    }
    # the directory really is read-only for the commands
    assert (await run(["touch", "probe"], read_only, env))[0] != 0

    # a legacy dataset's partition (migrated into raw/ as it is, then sealed and audited)
    legacy = f"country=kr/date={DAY}/old.json"
    await foundation.store.put_bytes(f"datasets/{legacy}", b'{"legacy": true}')
    commands = [
        ["migrate", "run", "--preset", "datasets-processing", "--no-delete"],
        ["seal", "raw", "--date", DAY],
        ["audit", "raw", "--prefix", "raw/country=kr/", "--date", DAY],
        ["status", "--json"],
        ["bootstrap", "--check"],
    ]
    for args in commands:
        code, said = await run([AEGIS, *args], read_only, env)
        assert code in (0, 3), f"aegis {' '.join(args)}: {said}"
        assert "Read-only" not in said and "Permission denied" not in said, args
    assert not os.listdir(read_only)
    journal = json.loads((state / "migrate-journal.json").read_bytes())
    assert journal  # the migration finished and said what it did
    assert await foundation.store.get_bytes(f"raw/{legacy}") == b'{"legacy": true}'


def test_without_a_state_dir_the_user_s_state_folder_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AEGIS_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert AegisSettings().state_path("x.json") == tmp_path / "xdg" / "aegis" / "x.json"
    assert (tmp_path / "xdg" / "aegis").is_dir()
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".local" / "state" / "aegis" / "x.json"
    assert AegisSettings().state_path("x.json") == expected
