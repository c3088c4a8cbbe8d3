"""Shared steps of the browser tests."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import Page

from tests.factories import PASSWORD


def log_in(page: Page, url: str, user: Any) -> None:
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")
