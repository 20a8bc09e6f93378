"""``deploy/infra/render.py`` (the template's renderer, not a package) as a module for tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_render(infra: Path) -> ModuleType:
    """The renderer in ``infra`` (the repository's ``deploy/infra``), imported from its file."""
    spec = importlib.util.spec_from_file_location("aegis_infra_render", infra / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
