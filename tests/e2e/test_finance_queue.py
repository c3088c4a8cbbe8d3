"""Finance works the review queue in a real browser, against the live sandbox provider.

Fiona filters the queue to her own items, opens an action that needs review, looks it up at
the provider (which did make the refund: the timeout hid it), confirms it, and sees it leave
the queue. Meanwhile a colleague resolves another of her items as failed: the queue refreshes
by itself, keeps her filter, and shows the remedy that replaced it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from actions.engine import resolutions
from actions.models import Action, ActionEvent, ActionStatus, Order, Remedy
from actions.services import Actor
from tests.actions.test_finance_services import AMOUNT_MINOR, CHARGE_MINOR, escalated, settling, unknown
from tests.e2e.test_manager_inbox import as_someone_else
from tests.factories import PASSWORD, make_user
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

S = ActionStatus


def test_finance_filters_looks_up_and_resolves_an_action_that_leaves_the_queue(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    screenshot_dir: Path,
    live_sandbox: SandboxClient,
    finance: Any,
    agent_actor: Actor,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    """Invariants 2, 5 and 8 end to end: the refund the provider made is recorded once, with its
    reference; the order's money adds up; the queue shows what is left, to its owner."""
    # Auto-approval publishes a dispatch on commit; the builders reserve and record by themselves.
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)
    # The items were just attempted; "failed" needs their lease and the provider's visibility
    # delay to have passed. No worker runs here, so both are zero.
    settings.LEASE_SECONDS = 0
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 0
    felix = make_user("felix.finance", "finance")
    review = escalated(agent_actor, owner=finance)
    other_mine = escalated(agent_actor, owner=finance)
    theirs = escalated(agent_actor, owner=felix)
    unknown(agent_actor)
    settling(agent_actor)
    for action in (review, other_mine):
        live_sandbox.seed_charge(action.payload["charge"], CHARGE_MINOR, "eur")
    reference = live_sandbox.plant_refund(
        charge=review.payload["charge"], amount=AMOUNT_MINOR, metadata={"action_id": review.action_id}
    )["id"]
    url = live_server.url

    with chromium_page() as page:
        page.goto(f"{url}/login/")
        page.get_by_label("Username").fill(finance.username)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{url}/")
        page.get_by_role("link", name="Review queue", exact=True).click()
        page.wait_for_url(f"{url}/review/")
        expect(page.locator(f"#queue-action-{theirs.pk}")).to_be_visible()

        page.get_by_label("Mine").check()
        # The filter is applied in place and kept in the address, so a reload keeps it.
        page.wait_for_url(f"{url}/review/?mine=1")
        expect(page.locator(f"#queue-action-{theirs.pk}")).to_have_count(0)
        expect(page.locator("#review-table tbody tr")).to_have_count(2)
        page.screenshot(path=str(screenshot_dir / "review-queue.png"), full_page=True)

        # A colleague resolves one of Fiona's items as failed: the queue refreshes by itself, with
        # her filter, and shows the remedy (now hers) instead of the action.
        as_someone_else(
            lambda: resolutions.action_resolve_failed(
                action_pk=other_mine.pk, user=finance, reason="Card closed.", remedy_kind="manual_transfer"
            )
        )
        expect(page.locator(f"#queue-action-{other_mine.pk}")).to_have_count(0, timeout=15_000)
        expect(page.locator("#review-table tr[data-kind='remedy']")).to_have_count(1)
        expect(page.get_by_label("Mine")).to_be_checked()

        page.locator(f"#queue-action-{review.pk}").get_by_test_id("item-title").click()
        page.wait_for_url(f"{url}/review/actions/{review.pk}/")
        expect(page.get_by_test_id("idempotency-key")).to_have_text(review.idempotency_key)
        page.get_by_role("button", name="Look up at the provider now").click()
        expect(page.get_by_test_id("lookup-summary")).to_contain_text(f"Lookup found refund {reference} succeeded")

        form = page.locator("#resolve-succeeded")
        expect(form.get_by_label("Provider's refund reference")).to_have_value(reference)
        page.screenshot(path=str(screenshot_dir / "review-detail.png"), full_page=True)
        form.get_by_label("Reason").fill("The timeout hid a refund the provider made.")
        form.get_by_role("button", name="Record as succeeded").click()
        expect(page.get_by_test_id("action-status")).to_have_text("Succeeded")
        expect(page.locator("#review-notice")).to_contain_text(
            f"recorded as succeeded with the provider's refund {reference}"
        )
        expect(page.get_by_test_id("order-refunded")).to_have_text("20.00 EUR")

        page.get_by_role("link", name="← Review queue").click()
        page.wait_for_url(f"{url}/review/")
        page.get_by_label("Mine").check()
        page.wait_for_url(f"{url}/review/?mine=1")
        expect(page.locator(f"#queue-action-{review.pk}")).to_have_count(0)
        expect(page.locator("#review-table tbody tr")).to_have_count(1)

        page.get_by_role("link", name="Home").click()
        page.wait_for_url(f"{url}/")
        expect(page.get_by_test_id("stuck-chart")).to_be_visible()
        page.screenshot(path=str(screenshot_dir / "finance-dashboard.png"), full_page=True)

    review = Action.objects.get(pk=review.pk)
    assert (review.status, review.provider_reference) == (S.SUCCEEDED, reference)
    order = Order.objects.get(actions=review)
    assert (order.refunded_amount, order.reserved_amount) == (Decimal("20.00"), Decimal("0"))
    event = ActionEvent.objects.filter(action=review).latest("pk")
    assert (event.transition, event.actor_user) == ("resolve_succeeded", finance)
    assert Remedy.objects.get(action=other_mine).owner == finance
    assert [r["id"] for r in live_sandbox.ledger() if r["metadata"].get("action_id") == review.action_id] == [reference]
    assert (screenshot_dir / "review-queue.png").stat().st_size > 10_000
    assert (screenshot_dir / "review-detail.png").stat().st_size > 10_000
