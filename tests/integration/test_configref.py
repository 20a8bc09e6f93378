"""The configuration reference and the names checked at start, against the real settings.

* docs/configuration-reference.md and aegis_runtime/settings_names.py are what
  ``python -m aegis_devstack.configref`` writes from the installed services and commands today;
* the deployment files set only names some component reads, and no deprecated one;
* every ``AEGIS_*`` name the code itself reads (options, the jobs' variables, the tests' servers)
  is in the reference;
* a real service process, and an ``aegis`` command, warn about a misspelt variable at start.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from aegis_contracts.subjects import STREAMS
from aegis_devstack.configref import COMMAND, outputs
from aegis_devstack.localservers import free_port
from aegis_runtime.envcheck import check_environment
from aegis_runtime.settings_names import DEPRECATED, KNOWN, PREFIXES

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REGENERATE = f"regenerate it: `.venv/bin/{COMMAND}` at the repository root"

# where a deployment file names a variable it sets
SET_IN = {
    "*.env": re.compile(r"^(AEGIS_[A-Z0-9_]+)=", re.MULTILINE),
    "*.yaml": re.compile(r"(?:name:\s*|^\s+|-\s+)(AEGIS_[A-Z0-9_]+)\b(?=\s*(?::|=|$))", re.M),
    "*.json": re.compile(r'"name":\s*"(AEGIS_[A-Z0-9_]+)"'),
}


def test_the_reference_and_the_names_module_are_current() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, text in outputs(ROOT).items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"{stale} do not match the settings classes: {REGENERATE}"


def deployment_names() -> dict[str, set[str]]:
    """Every AEGIS_* variable a deployment file sets, with the files that set it."""
    found: dict[str, set[str]] = {}
    files = [ROOT / "compose.yaml", *(ROOT / "deploy").rglob("*")]
    for path in files:
        for pattern, regex in SET_IN.items():
            if path.is_file() and path.match(pattern):
                for name in regex.findall(path.read_text(encoding="utf-8")):
                    found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_deployment_files_set_only_current_names() -> None:
    names = deployment_names()
    assert {"AEGIS_BUCKET", "AEGIS_HEALTH_PORT", "AEGIS_MQTT_CLIENT_ID"} <= set(names)
    report = check_environment(dict.fromkeys(names, ""))
    unknown = {n: (report.unknown[n], sorted(names[n])) for n in report.unknown}
    assert not unknown, f"no AEGIS component reads (name: closest known, files): {unknown}"
    deprecated = {n: sorted(names[n]) for n in report.deprecated}
    assert not deprecated, f"deprecated names, use their replacements ({DEPRECATED}): {deprecated}"


def code_names() -> dict[str, set[str]]:
    """Every string constant of the packages' source that is an AEGIS_* name, with its files."""
    found: dict[str, set[str]] = {}
    sources = [*ROOT.glob("libs/*/src/**/*.py"), *ROOT.glob("services/*/src/**/*.py")]
    for path in sources:
        if path.name == "settings_names.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and re.fullmatch(r"AEGIS_[A-Z0-9_]*", value):
                found.setdefault(value, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_name_the_code_reads_is_in_the_reference() -> None:
    streams = {s.name for s in STREAMS}
    undocumented = {
        name: sorted(files)
        for name, files in code_names().items()
        if name not in KNOWN
        and name not in DEPRECATED
        and name not in streams
        and name != "AEGIS_"
        and not name.startswith(PREFIXES)  # a family: a job's own variables, the tests'
    }
    assert not undocumented, (
        "read by the code but in no settings class and not in "
        f"aegis_devstack.configref.OTHER_VARIABLES: {undocumented}"
    )


# -- warnings at start, from real processes ------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AEGIS_")}
    return env | {"AEGIS_LOG_FORMAT": "json"} | extra


def events(text: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for line in text.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            found.setdefault(entry["event"], []).append(entry)
    return found


@pytest.mark.integration
async def test_a_service_warns_at_start_about_a_misspelt_and_a_deprecated_variable(
    tmp_path: Path,
) -> None:
    env = clean_env(
        AEGIS_BUKCET="my-bucket",  # AEGIS_BUCKET, misspelt
        AEGIS_ACK_WAIT_S="3",  # deprecated: each consumer has its own now
        AEGIS_DASHBOARD_PORT="8080",  # another service's: known, so not reported
        # no broker there: the simulator keeps retrying, which is all this needs
        AEGIS_MQTT_URL=f"mqtt://127.0.0.1:{free_port()}",
        AEGIS_SIMULATOR_IMAGES="false",
        AEGIS_HEALTH_PORT="0",
    )
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "aegis-simulator"),
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen: list[bytes] = []
    try:
        async with asyncio.timeout(30):
            while not any(b"health_server_started" in line for line in seen):
                line = await proc.stdout.readline()
                assert line, f"the simulator exited: {b''.join(seen).decode(errors='replace')}"
                seen.append(line)
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    found = events(b"".join([*seen, rest]).decode(errors="replace"))
    (unknown,) = found["unknown_settings"]
    assert unknown["level"] == "warning"
    assert unknown["names"] == ["AEGIS_BUKCET"]
    assert unknown["closest"] == {"AEGIS_BUKCET": "AEGIS_BUCKET"}
    (deprecated,) = found["deprecated_setting"]
    assert deprecated["variable"] == "AEGIS_ACK_WAIT_S"
    assert deprecated["replacements"]["AEGIS_PROCESSOR_ACK_WAIT_S"] == "processor"
    assert "service_stopped" in found


@pytest.mark.integration
async def test_a_command_warns_on_stderr_and_keeps_stdout_for_its_result(tmp_path: Path) -> None:
    (tmp_path / "passwd").touch()
    (tmp_path / "acl").touch()
    env = clean_env(
        AEGIS_BROKER_PASSWORD_FILE=str(tmp_path / "passwd"),  # the option's variable: known
        AEGIS_BROKER_ACL_FILE=str(tmp_path / "acl"),
        AEGIS_LOG_LEVL="DEBUG",  # AEGIS_LOG_LEVEL, misspelt
        AEGIS_MQTT_SESSION_EXPIRY_SECONDS="60",  # deprecated: AEGIS_MQTT_SESSION_EXPIRY_S
    )
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "aegis"),
        "devices",
        "list",
        "--json",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode(errors="replace")
    assert json.loads(out) == []  # the result alone
    found = events(err.decode(errors="replace"))
    (unknown,) = found["unknown_settings"]
    assert unknown["names"] == ["AEGIS_LOG_LEVL"]
    assert unknown["closest"] == {"AEGIS_LOG_LEVL": "AEGIS_LOG_LEVEL"}
    (deprecated,) = found["deprecated_setting"]
    assert deprecated["variable"] == "AEGIS_MQTT_SESSION_EXPIRY_SECONDS"
    assert deprecated["replacement"] == "AEGIS_MQTT_SESSION_EXPIRY_S"
