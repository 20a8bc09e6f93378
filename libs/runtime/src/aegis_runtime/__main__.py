"""``python -m aegis_runtime``: what this installation (an image) can run, the default command of
every AEGIS image. compose, Kubernetes and ECS name the command to run instead."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points


def describe() -> str:
    services = sorted(entry_points(group="aegis.services"), key=lambda ep: ep.name)
    commands = sorted(ep.name for ep in entry_points(group="console_scripts") if ep.name == "aegis")
    lines = ["AEGIS image. Run one of:"]
    lines += [f"  {'aegis-' + ep.name:<24} the {ep.name} service" for ep in services]
    if commands:
        lines.append(f"  {'aegis --help':<24} the operator CLI")
    if len(lines) == 1:
        lines.append("  (no AEGIS service or command is installed)")
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe(), file=sys.stderr)
    sys.exit(2)
