"""Browser tests: Debian's Chromium driven by Playwright against pytest-django's live server.

Playwright cannot download its own browsers here, so it launches the system's ``chromium``.

Playwright's sync API runs an asyncio event loop on the test's thread while a browser is open,
and Django refuses database queries from a thread with a running loop. So the browser is opened
as a context manager inside the test: set up data before it, check the database after it. The
live server answers from its own thread, where there is no loop.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO_ROOT / "artifacts" / "screenshots"

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Long enough for a cold Chromium on a busy two-core CI machine, short enough to fail fast.
TIMEOUT_MS = 15_000


@pytest.fixture
def chromium_page() -> Callable[[], AbstractContextManager[Page]]:
    """Open a fresh browser page with ``with chromium_page() as page:``."""
    executable = shutil.which("chromium")
    if executable is None:
        message = "Debian's chromium is not installed (apt-get install chromium)"
        # In CI a missing browser must fail the run, not hide the browser tests.
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)

    @contextmanager
    def open_page() -> Iterator[Page]:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(TIMEOUT_MS)
                yield page
            finally:
                browser.close()

    return open_page


@pytest.fixture
def screenshot_dir() -> Path:
    """Where browser tests leave screenshots for people to look at (git-ignored)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
