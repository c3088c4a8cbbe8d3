"""What a status means, in words an agent (and the person reading its log) can act on."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.models import Action, ActionStatus
from actions.models.actions import TERMINAL_STATUSES
from actions.selectors import action_explain_status

S = ActionStatus


def unsaved_action(status: str, **fields: Any) -> Action:
    action = Action(action_id="refund:order-1:request-1", amount=Decimal("40.00"), currency="EUR", **fields)
    # The status is a protected FSM field: a read-side test sets it the way the database would.
    action.__dict__["status"] = status
    return action


@pytest.mark.parametrize("status", [s for s in ActionStatus.values if s != S.NEW])
def test_every_status_is_explained_with_what_happens_next_and_who_holds_it(status: str) -> None:
    explanation = action_explain_status(unsaved_action(status))

    assert explanation.summary and explanation.next_step and explanation.held_by
    assert explanation.final is (status in TERMINAL_STATUSES)
    assert "40.00 EUR" in explanation.summary or status in (S.STALE,)


@pytest.mark.parametrize("status", [S.PROPOSED, S.AUTHORIZED, S.SUBMITTING, S.UNKNOWN, S.NEEDS_REVIEW, S.STALE])
def test_every_waiting_status_tells_the_agent_not_to_send_again(status: str) -> None:
    next_step = action_explain_status(unsaved_action(status)).next_step
    assert "propose it again" in next_step or "never send a new request" in next_step


def test_an_action_in_review_names_the_role_that_holds_it_and_when_it_is_due(finance: Any) -> None:
    finance.first_name, finance.last_name = "Fiona", "Finance"
    due = timezone.now() + timedelta(hours=24)

    explanation = action_explain_status(unsaved_action(S.NEEDS_REVIEW, owner=finance, due_at=due))

    # A role, not the person's name: agents are not told who works in finance.
    assert explanation.held_by == "a person in finance"
    assert explanation.needs_person is True
    assert f"{due:%Y-%m-%d %H:%M}" in explanation.next_step


def test_a_rejection_explains_its_reasons() -> None:
    action = unsaved_action(S.REJECTED, rejection_reasons=[{"code": "rejected_by_manager", "message": "Used item."}])
    assert "Used item." in action_explain_status(action).summary
