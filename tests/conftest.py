"""Fixtures of the tests that drive a browser (the dashboard's pages, ``aegis up`` end to end):
Debian's chromium through Playwright, never a browser download."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import BrowserContext, async_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_installed() -> bool:
    return Path(CHROMIUM).exists()


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[BrowserContext]:
    assert chromium_installed(), f"{CHROMIUM} is missing: `make test` installs Debian's chromium"
    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            tmp_path / "chromium-profile",  # a new, empty user-data-dir
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1600, "height": 1000},
            locale="en-US",
        )
        try:
            yield context
        finally:
            await context.close()
