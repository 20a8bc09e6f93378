"""The workspace as deployment files see it: members, their deployables, console scripts and
``aegis`` subcommands, read from the ``pyproject.toml`` files (not from what the venv installed).

compose.yaml, deploy/k8s and deploy/ecs name images (build arg PACKAGE), commands and health
ports; the static tests of those files check every name against this one reading.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, cast

# where a service answers /healthz, /readyz and /metrics inside its container: AEGIS_HEALTH_PORT,
# except the dashboard API, which serves them on its API port (AEGIS_DASHBOARD_PORT)
HEALTH_PORT = 8081
API_HEALTH_PORTS = {"dashboard-api": 8080}
# the `aegis` CLI's own subcommands (aegis_cli.app); members add theirs as entry points
BUILTIN_AEGIS_COMMANDS = frozenset({"bootstrap", "devices", "nats-auth", "status", "streams"})


@dataclass(frozen=True, slots=True)
class Member:
    name: str  # distribution, e.g. aegis-ingest
    path: Path
    project: dict[str, Any]

    @property
    def scripts(self) -> dict[str, str]:
        return cast("dict[str, str]", self.project.get("scripts", {}))

    def entry_points(self, group: str) -> dict[str, str]:
        groups = cast("dict[str, dict[str, str]]", self.project.get("entry-points", {}))
        return groups.get(group, {})

    @property
    def requires(self) -> list[str]:
        """Names of the distributions it depends on (no versions, extras or markers)."""
        names = []
        for requirement in self.project.get("dependencies", []):
            match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
            if match:
                names.append(match[0].lower().replace("_", "-"))
        return names


@dataclass(frozen=True, slots=True)
class Deployable:
    """A long-running service: a member with an ``aegis.services`` entry point."""

    name: str  # service name, e.g. ingest
    package: str  # distribution, e.g. aegis-ingest
    script: str  # its console script, e.g. aegis-ingest
    health_port: int


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root

    @cached_property
    def members(self) -> dict[str, Member]:
        found: dict[str, Member] = {}
        for manifest in sorted(
            [*self.root.glob("libs/*/pyproject.toml"), *self.root.glob("services/*/pyproject.toml")]
        ):
            project = tomllib.loads(manifest.read_text(encoding="utf-8"))["project"]
            found[project["name"]] = Member(project["name"], manifest.parent, project)
        return found

    def closure(self, package: str) -> list[Member]:
        """``package`` and the workspace members it depends on, directly or not: what its image
        (``uv sync --package``) installs of the workspace."""
        seen: dict[str, Member] = {}
        stack = [package]
        while stack:
            name = stack.pop()
            if name in seen or name not in self.members:
                continue
            seen[name] = self.members[name]
            stack.extend(seen[name].requires)
        return list(seen.values())

    def scripts(self, package: str) -> set[str]:
        """Console scripts on the PATH of ``package``'s image."""
        return {script for member in self.closure(package) for script in member.scripts}

    def aegis_commands(self, package: str) -> set[str]:
        """``aegis`` subcommands in ``package``'s image (the CLI loads members' entry points)."""
        if "aegis" not in self.scripts(package):
            return set()
        plugins = {
            name
            for member in self.closure(package)
            for name in member.entry_points("aegis.commands")
        }
        return set(BUILTIN_AEGIS_COMMANDS) | plugins

    @cached_property
    def deployables(self) -> dict[str, Deployable]:
        found: dict[str, Deployable] = {}
        for member in self.members.values():
            for name, target in member.entry_points("aegis.services").items():
                scripts = [script for script, ref in member.scripts.items() if ref == target]
                assert len(scripts) == 1, (
                    f"{member.name}: service {name} ({target}) needs exactly one console script "
                    f"running it, has {scripts}"
                )
                found[name] = Deployable(
                    name, member.name, scripts[0], API_HEALTH_PORTS.get(name, HEALTH_PORT)
                )
        return found
