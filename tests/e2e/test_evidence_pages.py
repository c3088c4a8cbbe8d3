"""The evidence pages finance reads, in a real browser: an action's evidence bundle, and the
notification of a break in the audit trail. Each test also takes the screenshot the docs show
(docs/img/evidence-bundle.png and docs/img/trail-broken-notification.png, in docs/evidence.md):
run this file to take them again.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from playwright.sync_api import Page, ViewportSize, expect

from actions.engine.dispatch import execution_dispatch
from actions.models import Action, ActionEvent, ActionStatus, Notification
from actions.providers.money import to_minor_units
from actions.services import Actor
from approvals.services import approval_decide
from tests.approvals.test_views import order_of, propose
from tests.e2e.helpers import log_in
from tests.evidence.test_bundle import checkpoint_after_commits
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
DESKTOP: ViewportSize = {"width": 1366, "height": 900}


@pytest.fixture(autouse=True)
def signed_trail(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.TRAIL_SIGNING_KEY = "a-test-key-of-enough-length-0123456789"
    settings.TRAIL_CHECKPOINT_LOG = tmp_path / "checkpoints.jsonl"
    settings.AUTO_APPROVAL_ENABLED = False
    settings.NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    # The worker's part is played by the test, in order.
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def _refunded(agent_actor: Actor, manager: Any, sandbox: SandboxClient) -> Action:
    """A refund proposed, approved and made at the sandbox provider: a trail of four events,
    an attempt with the provider's answer, and the order's money after it."""
    action = propose(agent_actor, amount="45.00", customer_name="Adele Goldberg")
    order = order_of(action)
    sandbox.seed_charge(order.charge_reference, to_minor_units(order.captured_amount, "EUR"), "eur")
    approval_decide(action_pk=action.pk, user=manager, decision="approve", note="Photos check out.")
    assert execution_dispatch(action_pk=action.pk) == ActionStatus.SUCCEEDED
    return Action.objects.get(pk=action.pk)


def test_finance_reads_an_actions_evidence_bundle_from_its_review_page(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    live_sandbox: SandboxClient,
    agent_actor: Actor,
    manager: Any,
    finance: Any,
) -> None:
    action = _refunded(agent_actor, manager, live_sandbox)
    checkpoint_after_commits()
    events = ActionEvent.objects.filter(action=action).count()
    url = live_server.url

    with chromium_page() as page:
        page.set_viewport_size(DESKTOP)
        log_in(page, url, finance)
        page.goto(f"{url}/review/actions/{action.pk}/")
        page.get_by_role("link", name="read it").click()
        page.wait_for_url(f"{url}/review/actions/{action.pk}/evidence")
        expect(page.get_by_role("heading", level=1)).to_have_text(f"Evidence for {action.action_id}")
        trail = page.locator("ol.trail > li")
        expect(trail).to_have_count(events)
        expect(trail.last).to_contain_text("record_success")
        # Every event is signed by the checkpoint made above.
        expect(page.locator("ol.trail")).not_to_contain_text("not yet covered by a checkpoint")
        expect(page.get_by_role("link", name="Download the signed file")).to_be_visible()
        page.screenshot(path=str(DOCS_IMG / "evidence-bundle.png"), full_page=False)


def _rewrite_reason(event: ActionEvent, text: str) -> None:
    """What only the database's owner can do: lift the append-only triggers for one
    transaction and change an event's reason."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("ALTER TABLE actions_actionevent DISABLE TRIGGER USER")
        cursor.execute("UPDATE actions_actionevent SET reason = %s WHERE id = %s", [text, event.pk])
        cursor.execute("ALTER TABLE actions_actionevent ENABLE TRIGGER USER")


def test_finance_finds_a_broken_trail_under_the_bell_named_in_words(
    live_server: Any,
    chromium_page: Callable[[], AbstractContextManager[Page]],
    live_sandbox: SandboxClient,
    agent_actor: Actor,
    manager: Any,
    finance: Any,
) -> None:
    action = _refunded(agent_actor, manager, live_sandbox)
    approval = ActionEvent.objects.get(action=action, transition="approve")
    _rewrite_reason(approval, "Approved by the CFO in person.")
    with pytest.raises(SystemExit) as exit_:
        call_command("verify_trail", "--notify", stdout=StringIO(), stderr=StringIO())
    assert exit_.value.code == 1
    [note] = Notification.objects.filter(recipient=finance, kind="trail_break")
    order = order_of(action)
    url = live_server.url

    with chromium_page() as page:
        page.set_viewport_size(DESKTOP)
        log_in(page, url, finance)
        bell = page.get_by_test_id("nav-bell")
        expect(bell).to_contain_text("1")
        bell.click()
        page.wait_for_url(f"{url}/notifications/")
        item = page.get_by_test_id("notification")
        expect(item).to_have_count(1)
        expect(item).to_contain_text(
            f"The audit trail of Refund · 45.00 EUR · Order {order.number} · Adele Goldberg: one of its events "
            f"was changed after it was written (event {approval.pk}, sequence 2)."
        )
        expect(item.locator("a")).to_have_attribute("href", f"/review/actions/{action.pk}/")
        page.screenshot(path=str(DOCS_IMG / "trail-broken-notification.png"), full_page=False)

    assert note.link == f"/review/actions/{action.pk}/"
