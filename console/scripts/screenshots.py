"""Take the documentation's screenshots of a running console at 1366 px (and 390 px for the phone).

Start the console with its demo data first (``make start``), then:

    .venv/bin/python console/scripts/screenshots.py --url http://127.0.0.1:8000 --out docs/img/screenshots

Each page is opened as the demo user whose page it is (password ``demo-password``). Pages the
console does not have (an older version without the order page) are skipped and named.
Uses Debian's chromium through Playwright, like the browser tests.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

PASSWORD = "demo-password"  # noqa: S105 - the demo users' password, printed in the README
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]

# (file name, user, path, width). "{order}" is the order page of --order (one of the demo's
# scenario orders, with a refund, a decision and a customer with history).
SHOTS = [
    ("manager-inbox", "maria", "/approvals/", 1366),
    ("review-queue", "fiona", "/review/", 1366),
    ("order-page", "maria", "{order}", 1366),
    ("search", "maria", "/search?q=4821", 1366),
    ("review-queue-phone", "fiona", "/review/", 390),
    ("manager-inbox-phone", "maria", "/approvals/", 390),
]


def _log_in(page: Page, url: str, username: str) -> None:
    page.context.clear_cookies()
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r".*/(\?.*)?$"))


def _order_path(page: Page, url: str, number: str) -> str | None:
    """The order page of order ``number`` (found through the search), else the inbox's first."""
    for where in (f"{url}/search?q={number}", f"{url}/approvals/"):
        page.goto(where)
        link = page.locator("a[href^='/orders/']").first
        if link.count():
            return link.get_attribute("href")
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--out", type=Path, default=Path("docs/img/screenshots"))
    parser.add_argument("--suffix", default="", help="added to each file name, e.g. -before")
    parser.add_argument("--order", default="4902", help="the order whose page is shown")
    options = parser.parse_args()
    executable = shutil.which("chromium")
    if executable is None:
        print("Debian's chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    options.out.mkdir(parents=True, exist_ok=True)
    url = options.url.rstrip("/")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=ARGS)
        try:
            for name, user, path, width in SHOTS:
                page = browser.new_page(viewport={"width": width, "height": 900})
                _log_in(page, url, user)
                if path == "{order}":
                    found = _order_path(page, url, options.order)
                    if found is None:
                        print(f"skipped {name}: no order page link on the inbox")
                        page.close()
                        continue
                    path = found
                response = page.goto(f"{url}{path}")
                if response is None or response.status >= 400:
                    print(f"skipped {name}: {path} answered {response.status if response else 'nothing'}")
                    page.close()
                    continue
                target = options.out / f"{name}{options.suffix}.png"
                page.screenshot(path=str(target), full_page=True)
                print(f"{target}  ({user} at {width} px: {path})")
                page.close()
        finally:
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
