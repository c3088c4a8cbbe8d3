"""An escalation keeps the owner finance already chose, while that person can still resolve it
(docs/architecture.md section 7, invariant 8).

test_escalation_owners.py covers the pick from the owner group; these cover the owner already
on the action, which the pick must not override, and what the audit event then says. Escalated
through the reconciler, for a receiver with no lookup and no keys, with an explicit ``now``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group

from actions.engine.reconcile import reconcile_action
from actions.kinds.refund.contract import RefundReceiver
from actions.models import Action, ActionEvent, ActionStatus
from actions.services import Actor
from tests.actions.test_reconciliation import NO_LOOKUP_NO_KEYS, FakeReceiver, unknown_without_receiver
from tests.factories import make_user

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


def escalate(action: Action) -> tuple[Action, ActionEvent]:
    assert action.next_reconcile_at is not None
    now = action.next_reconcile_at
    result = reconcile_action(
        action_pk=action.pk, receiver=RefundReceiver(FakeReceiver(guarantees=NO_LOOKUP_NO_KEYS)), now=now
    )
    assert result == S.NEEDS_REVIEW
    action = Action.objects.get(pk=action.pk)
    assert action.status_changed_at == now, "the escalation is dated by the pass that decided it"
    assert action.due_at == now + timedelta(hours=settings.REVIEW_DUE_HOURS)
    return action, ActionEvent.objects.filter(action=action, transition="escalate").get()


def test_an_escalation_keeps_the_finance_member_already_assigned(agent_actor: Actor, finance: Any) -> None:
    """Invariant 8: the owner finance set stays the owner, even though the group's pick (the
    longest-standing member with the fewest open items) would be someone else."""
    bea = make_user("bea.finance", "finance")
    action = unknown_without_receiver(agent_actor)
    Action.objects.filter(pk=action.pk).update(owner=bea)

    action, event = escalate(Action.objects.get(pk=action.pk))

    assert action.owner == bea
    assert event.evidence["owner"] == "bea.finance"
    assert event.reason.endswith("Assigned to bea.finance (already its owner).")


@pytest.mark.parametrize("why", ["inactive", "not_finance"])
def test_an_owner_who_can_no_longer_resolve_is_replaced_by_the_groups_pick(
    agent_actor: Actor, finance: Any, why: str
) -> None:
    """Invariant 8: an owner who left (inactive) or cannot resolve reviews is replaced by a named
    member of the owner group, and the event says it was the group's pick."""
    former = make_user("fred.former", "finance" if why == "inactive" else "manager", is_active=why != "inactive")
    action = unknown_without_receiver(agent_actor)
    Action.objects.filter(pk=action.pk).update(owner=former)

    action, event = escalate(Action.objects.get(pk=action.pk))

    assert action.owner == finance
    assert event.reason.endswith(
        f"Assigned to {finance.get_username()} (the owner group's member with the fewest open items)."
    )


def test_with_no_active_member_in_the_owner_group_the_event_says_nobody(agent_actor: Actor) -> None:
    """Invariant 8: the escalation still happens, and its event tells the admin that no one owns
    it, instead of pretending someone does."""
    Group.objects.get_or_create(name="finance")
    action = unknown_without_receiver(agent_actor)

    action, event = escalate(action)

    assert action.owner is None
    assert event.evidence["owner"] is None
    assert "Assigned to nobody: the owner group has no active member" in event.reason
