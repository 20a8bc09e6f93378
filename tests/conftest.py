"""Fixtures of the tests that drive a browser (the dashboard's pages, ``aegis up`` end to end):
Debian's chromium through Playwright, never a browser download."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, BrowserContext, async_playwright

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


@pytest.fixture(scope="module")
async def chromium() -> AsyncIterator[Browser]:
    """One Chromium for a test file: starting one takes longer than most page tests."""
    assert chromium_installed(), f"{CHROMIUM} is missing: `make test` installs Debian's chromium"
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def browser(chromium: Browser) -> AsyncIterator[BrowserContext]:
    """A browser context of the test's own: no cookie, storage or cache of another test's."""
    context = await chromium.new_context(viewport={"width": 1600, "height": 1000}, locale="en-US")
    try:
        yield context
    finally:
        await context.close()
