"""The /kinds/ page: the five checks per kind, computed from each receiver's contract."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from actions.agents.services import agent_token_issue
from actions.kinds.five_checks import kind_cards
from actions.models import LedgerAuditRun
from tests.actions.test_finance_services import escalated
from tests.factories import make_user

pytestmark = pytest.mark.django_db


def checks_of(page: str, kind: str) -> dict[str, str]:
    """{check number: "yes"/"no"} for one kind's card, as the page marks them."""
    card = page.split(f'id="kind-{kind}"', 1)[1].split("</section>", 1)[0]
    return dict(re.findall(r'data-check="(\d)" data-ok="(yes|no)"', card))


def test_finance_sees_a_card_per_kind_with_five_answers(client: Client, finance: Any) -> None:
    LedgerAuditRun.objects.create(started_at=timezone.now(), finished_at=timezone.now())
    client.force_login(finance)

    response = client.get("/kinds/")

    assert response.status_code == 200
    page = response.content.decode()
    assert checks_of(page, "refund") == {"1": "yes", "2": "yes", "3": "yes", "4": "yes", "5": "yes"}
    assert "refund:order-4821:request-3" in page
    # A person is the compensation's receiver: no key, no lookup, no ledger, in red, with what happens.
    assert checks_of(page, "compensation") == {"1": "yes", "2": "no", "3": "no", "4": "yes", "5": "no"}
    assert "No key and no lookup: an ambiguous send goes straight to a person; never resent automatically" in page


def test_the_answers_follow_the_live_settings(client: Client, finance: Any, settings: Any) -> None:
    settings.PROVIDER_KEY_RETENTION_SECONDS = 7200
    settings.RECONCILE_MAX_FAILURES = 7
    settings.APPROVAL_TTL_SECONDS = 1800
    client.force_login(finance)

    page = client.get("/kinds/").content.decode()

    assert "deduplicates the id for 2 h" in page
    assert "after 7 inconclusive lookups" in page
    assert "it expires after 30 min" in page


def test_the_audit_check_is_red_until_the_ledger_audit_has_run(finance: Any) -> None:
    refund = next(card for card in kind_cards() if card.name == "refund")
    audit = refund.checks[4]
    assert not audit.ok and "has not run yet" in audit.answer

    LedgerAuditRun.objects.create(started_at=timezone.now(), error="Could not read the receiver's ledger: 503")
    audit = next(card for card in kind_cards() if card.name == "refund").checks[4]
    assert not audit.ok and "the last run failed" in audit.answer


def test_an_admin_may_read_the_kinds_page(client: Client, console_admin: Any) -> None:
    client.force_login(console_admin)
    assert client.get("/kinds/").status_code == 200


def test_managers_are_refused_and_anonymous_visitors_are_sent_to_log_in(client: Client, manager: Any) -> None:
    assert client.get("/kinds/").status_code == 302
    client.force_login(manager)
    assert client.get("/kinds/").status_code == 403


def test_an_agents_token_does_not_open_the_kinds_page(client: Client, agent: Any) -> None:
    """Agents use the API with a token; the console's pages need a person's session."""
    token = agent_token_issue(agent=agent).plain
    response = client.get("/kinds/", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_action_detail_links_to_its_kinds_card(client: Client, finance: Any, agent_actor: Any) -> None:
    action = escalated(agent_actor)
    client.force_login(make_user("felix.finance", "finance"))
    page = client.get(f"/review/actions/{action.pk}/").content.decode()
    assert 'href="/kinds/#kind-refund"' in page


def test_the_invoice_adjustment_card_answers_the_five_checks_from_the_accounting_contract(
    client: Client, finance: Any, settings: Any
) -> None:
    settings.ACCOUNTING_KEY_RETENTION_SECONDS = 6 * 3600
    LedgerAuditRun.objects.create(started_at=timezone.now(), finished_at=timezone.now())
    client.force_login(finance)

    page = client.get("/kinds/").content.decode()

    assert checks_of(page, "invoice-adjustment") == {"1": "yes", "2": "yes", "3": "yes", "4": "yes", "5": "yes"}
    card = page.split('id="kind-invoice-adjustment"', 1)[1].split("</section>", 1)[0]
    assert "invoice-adjustment:bill-INV-2291:adjustment-1" in card
    assert "accounting system" in card and "6 h" in card and "accounts payable" in card
    assert "void the credit note" in card.lower() or "voided" in card
    # The correction's own card: a set step, read back by the credit note's id.
    assert checks_of(page, "credit-note-void")["3"] == "yes"
