"""Pages lead with what a clerk knows; ids, hashes, template names and the receivers' raw errors
stay behind "Technical details" (actions/plain.py holds the words)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from actions.plain import action_words, clerk_words
from actions.services import Actor
from tests.actions.test_finance_services import escalated
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    assert client.login(username=user.get_username(), password=PASSWORD)
    return client


def _outside_details(html: str) -> str:
    """The page without its folds: what a clerk reads before opening "Technical details"."""
    return re.sub(r"<details class=\"technical\".*?</details>", "", html, flags=re.S)


def test_a_refund_is_named_by_its_kind_money_order_and_customer(agent_actor: Actor) -> None:
    action = escalated(agent_actor)
    order = action.order
    assert order is not None
    assert action_words(action) == f"Refund · {action.amount} EUR · Order {order.number} · {order.customer_name}"


def test_the_queue_leads_with_the_item_in_words_and_says_the_timeout_in_a_sentence(
    finance: Any, agent_actor: Actor, settings: Any
) -> None:
    action = escalated(agent_actor, owner=finance)
    page = _client(finance).get("/review/").content.decode()
    shown = _outside_details(page)
    assert action.order is not None
    assert f"Refund · Order {action.order.number}" in shown
    assert action.action_id not in shown
    assert "AmbiguousError" not in shown and "connection_error" not in shown
    assert "we do not know yet whether the refund was made" in shown
    # Behind the fold, with a copy button for the id.
    assert action.action_id in page and "AmbiguousError" in page
    assert f'data-copy="#id-queue-action-{action.pk}"' in page


def test_the_queue_item_keeps_its_id_key_and_hash_behind_the_technical_details(
    finance: Any, agent_actor: Actor
) -> None:
    action = escalated(agent_actor, owner=finance)
    page = _client(finance).get(f"/review/actions/{action.pk}/").content.decode()
    shown = _outside_details(page)
    for technical in (action.action_id, action.payload_hash[:20], "Payload hash", "Idempotency key"):
        assert technical not in shown, technical
    assert action.payload_hash in page and action.idempotency_key in page


def test_the_kinds_page_does_not_speak_of_payload_hashes_or_status_codes(finance: Any) -> None:
    page = _client(finance).get("/kinds/").content.decode()
    assert "payload hash" not in page and "409" not in page and "naming the fields" not in page
    assert "the agent is told which" in page


def test_clerk_words_leaves_plain_text_alone() -> None:
    assert clerk_words("The order changed.") == "The order changed."
