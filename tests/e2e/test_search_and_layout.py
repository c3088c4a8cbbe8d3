"""Search, the order page, the queue's layout, the phone layout and accessibility, in a real browser.

- A manager finds an action from the navigation's search box by the customer's email and by the
  provider's refund reference (``re_...``), and opens its order page.
- At 1366 px the review queue's work column (Assign, Reassign) is fully inside the window,
  measured from the bounding boxes.
- At 390 px no main page is wider than the screen (scrollWidth <= clientWidth).
- axe-core finds no serious or critical accessibility violation on the main pages. axe-core 4.14.1
  is vendored unmodified in tests/e2e/vendor/axe.min.js (MPL-2.0, licence alongside), as
  published on the npm registry (``npm install axe-core``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action
from actions.services import Actor
from tests.actions.test_finance_services import escalated, succeeded, unknown
from tests.factories import PASSWORD, make_order, make_request

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXE = Path(__file__).parent / "vendor" / "axe.min.js"


def log_in(page: Page, url: str, user: Any) -> None:
    page.context.clear_cookies()
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{url}/")


def _proposal(agent_actor: Actor, *, email: str, amount: str = "60.00") -> Action:
    order = make_order(captured="300.00", customer_name="Grace Hopper")
    order.customer_email = email
    order.save(update_fields=["customer_email"])
    request = make_request(order, external_reference=f"ZD-{order.number}")
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=amount,
        currency="EUR",
        reason_code="damaged",
        evidence="Photo of the broken lid.",
        proposer=agent_actor,
    ).action


@pytest.fixture
def no_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def test_the_search_box_finds_an_action_by_customer_email_and_by_refund_reference(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    manager: Any,
    agent_actor: Actor,
    no_dispatch: None,
) -> None:
    wanted = _proposal(agent_actor, email="grace.hopper@navy.example")
    _proposal(agent_actor, email="alan@bletchley.example")
    refunded = succeeded(agent_actor)
    assert refunded.order is not None
    order_number = refunded.order.number  # read now: no database queries while the browser is open
    url = live_server.url

    with chromium_page() as page:
        log_in(page, url, manager)
        box = page.get_by_role("searchbox", name="Search orders, customers, tickets and references")
        box.fill("grace.hopper@navy")
        box.press("Enter")
        page.wait_for_url(f"{url}/search?q=grace.hopper%40navy")
        hits = page.locator("[data-testid=search-actions] tbody tr")
        expect(hits).to_have_count(1)
        expect(hits.first).to_have_attribute("data-action-id", wanted.action_id)
        page.screenshot(path=str(screenshot_dir / "search-email.png"), full_page=True)

        box = page.get_by_role("searchbox", name="Search orders, customers, tickets and references")
        box.fill(refunded.provider_reference)
        box.press("Enter")
        hits = page.locator("[data-testid=search-actions] tbody tr")
        expect(hits).to_have_count(1)
        expect(hits.first).to_have_attribute("data-action-id", refunded.action_id)
        expect(hits.first).to_contain_text(refunded.provider_reference)

        # From the hit to its order page: the refund, its reference and the money.
        hits.first.get_by_role("link", name=f"Order {order_number}").click()
        page.wait_for_url(f"{url}/orders/{refunded.order_id}")
        expect(page.get_by_role("heading", level=1)).to_have_text(f"Order {order_number}")
        expect(page.locator("[data-testid=order-refunds]")).to_contain_text(refunded.provider_reference)
        expect(page.locator("[data-testid=order-money]")).to_contain_text("Refundable")


def test_the_queues_work_column_is_fully_visible_at_1366_px(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    finance: Any,
    agent_actor: Actor,
    no_dispatch: None,
) -> None:
    for _ in range(2):
        escalated(agent_actor, owner=finance)
    unknown(agent_actor)
    url = live_server.url

    with chromium_page() as page:
        page.set_viewport_size({"width": 1366, "height": 900})
        log_in(page, url, finance)
        page.goto(f"{url}/review/")
        rows = page.locator("#review-table tbody tr")
        expect(rows).to_have_count(3)
        viewport = page.viewport_size
        assert viewport is not None
        buttons = page.locator("#review-table .row-actions button")
        assert buttons.count() >= 3
        for index in range(buttons.count()):
            box = buttons.nth(index).bounding_box()
            assert box is not None
            assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"], (index, box)
        for index in range(rows.count()):
            cell = rows.nth(index).locator("td.row-actions").bounding_box()
            assert cell is not None and cell["x"] + cell["width"] <= viewport["width"], (index, cell)
        # Nothing of the table is hidden to the right: it needs no sideways scroll at all.
        hidden = page.evaluate(
            "(() => { const w = document.querySelector('#review-table .table-wrap');"
            " return w.scrollWidth - w.clientWidth; })()"
        )
        assert hidden <= 0, hidden
        page.screenshot(path=str(screenshot_dir / "review-queue-1366.png"), full_page=True)


def _main_pages(
    manager: Any, finance: Any, agent_actor: Actor
) -> tuple[list[tuple[str, Any, str]], dict[str, Action]]:
    proposal = _proposal(agent_actor, email="grace.hopper@navy.example")
    review = escalated(agent_actor, owner=finance)
    refunded = succeeded(agent_actor)
    assert proposal.order is not None
    pages = [
        ("login", None, "/login/"),
        ("dashboard (manager)", manager, "/"),
        ("inbox", manager, "/approvals/"),
        ("proposal detail", manager, f"/approvals/{proposal.pk}/"),
        ("order page", manager, f"/orders/{refunded.order_id}"),
        ("search", manager, f"/search?q={proposal.order.number}"),
        ("dashboard (finance, with the chart)", finance, "/"),
        ("queue", finance, "/review/"),
        ("action detail", finance, f"/review/actions/{review.pk}/"),
        ("kinds (the provider's answers)", finance, "/kinds/"),
        ("API docs", None, "/api/v1/docs"),
    ]
    return pages, {"proposal": proposal, "review": review, "refunded": refunded}


def _visit(page: Page, url: str, user: Any, path: str, current: list[Any]) -> None:
    if current[0] is not user:
        if user is None:
            page.context.clear_cookies()
        else:
            log_in(page, url, user)
        current[0] = user
    response = page.goto(f"{url}{path}")
    assert response is not None and response.status == 200, (path, response and response.status)


def test_nothing_is_wider_than_a_390_px_phone_on_the_main_pages(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    manager: Any,
    finance: Any,
    agent_actor: Actor,
    no_dispatch: None,
) -> None:
    pages, _ = _main_pages(manager, finance, agent_actor)
    url = live_server.url
    wide: list[str] = []
    with chromium_page() as page:
        page.set_viewport_size({"width": 390, "height": 844})
        current: list[Any] = [object()]
        for name, user, path in pages:
            _visit(page, url, user, path, current)
            widths = page.evaluate(
                "({scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth})"
            )
            if widths["scroll"] > widths["client"]:
                wide.append(f"{name} ({path}): {widths['scroll']} px in {widths['client']} px")
                page.screenshot(path=str(screenshot_dir / f"overflow-390-{len(wide)}.png"), full_page=True)
    assert not wide, wide


def test_axe_finds_no_serious_or_critical_violation_on_the_main_pages(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    manager: Any,
    finance: Any,
    agent_actor: Actor,
    no_dispatch: None,
) -> None:
    pages, _ = _main_pages(manager, finance, agent_actor)
    wanted = {"inbox", "queue", "action detail", "order page", "search", "dashboard (manager)",
              "dashboard (finance, with the chart)", "login", "proposal detail"}  # fmt: skip
    url = live_server.url
    script = AXE.read_text(encoding="utf-8")
    found: dict[str, list[str]] = {}
    with chromium_page() as page:
        page.set_viewport_size({"width": 1366, "height": 900})
        current: list[Any] = [object()]
        for name, user, path in pages:
            if name not in wanted:
                continue
            _visit(page, url, user, path, current)
            # The page's Content-Security-Policy refuses inline scripts: Playwright's evaluate runs
            # in the page through the DevTools protocol, which the policy does not govern.
            page.evaluate(script)
            result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
            serious = [
                f"{v['id']} ({v['impact']}): {v['help']} — {json.dumps([n['target'] for n in v['nodes']][:5])}"
                for v in result["violations"]
                if v["impact"] in ("serious", "critical")
            ]
            if serious:
                found[f"{name} {path}"] = serious
    assert not found, json.dumps(found, indent=2, ensure_ascii=False)
