"""nats-py stays behind :mod:`aegis_runtime.natsio`: no other module of a library or a service
imports it, not even for the type checker (tests may)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WRAPPER = ROOT / "libs" / "runtime" / "src" / "aegis_runtime" / "natsio.py"


def _imports_nats(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name == "nats" or name.startswith("nats.") for name in names):
            lines.append(node.lineno)
    return lines


def test_only_the_wrapper_imports_nats_py() -> None:
    sources = sorted((ROOT / "libs").glob("*/src/**/*.py"))
    sources += sorted((ROOT / "services").glob("*/src/**/*.py"))
    assert WRAPPER in sources
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sources
        if path != WRAPPER
        for line in _imports_nats(path)
    ]
    assert not found, "nats-py imported outside aegis_runtime.natsio:\n" + "\n".join(found)
