"""Root conftest: every test gets the real-infrastructure fixtures of aegis_devstack.testing,
and the end-to-end files are handed out first."""

from __future__ import annotations

import pytest

pytest_plugins = [
    "aegis_devstack.testing.fixtures",
    "aegis_devstack.testing.hygiene",
    "aegis_devstack.testing.natsbus",
    "aegis_devstack.testing.oidc",
    "aegis_devstack.testing.storage",
    "aegis_devstack.testing.webhook",
]

# files that take minutes on one worker (whole stacks started, killed, restarted)
FIRST = ("tests/e2e/",)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end files first, in the order pytest-randomly gave them, then the rest in
    theirs: a test file runs on one worker, so a file of minutes handed out last keeps one
    worker busy while the other has nothing left (it made the suite minutes longer). The
    Makefile tells pytest-xdist to keep this order (--no-loadscope-reorder: by default it hands
    out the files with the most tests first, and an end-to-end file has few)."""
    root = str(items[0].config.rootpath) + "/" if items else ""
    items.sort(key=lambda item: not str(item.path).removeprefix(root).startswith(FIRST))
