"""Who an escalated action goes to (docs/architecture.md section 7: "assigned to a named owner").

The owner is the active member of the kind's owner group (finance unless an OwnerGroup maps the
kind elsewhere) with the fewest open NEEDS_REVIEW items, ties to the longest-standing member.
The escalate audit event says who and why. Actions are escalated here by the reconciler, for a
receiver that offers no lookup and no keys, so no network is involved.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group

from actions.engine.reconcile import reconcile_action
from actions.kinds.refund.contract import RefundReceiver
from actions.models import Action, ActionEvent, ActionStatus, OwnerGroup
from actions.services import Actor
from tests.actions.test_reconciliation import NO_LOOKUP_NO_KEYS, FakeReceiver, unknown_without_receiver
from tests.factories import make_user

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


def escalated(proposer: Actor) -> Action:
    action = unknown_without_receiver(proposer)
    result = reconcile_action(
        action_pk=action.pk,
        receiver=RefundReceiver(FakeReceiver(guarantees=NO_LOOKUP_NO_KEYS)),
        now=action.next_reconcile_at,
    )
    assert result == S.NEEDS_REVIEW
    return Action.objects.get(pk=action.pk)


def escalation_event(action: Action) -> ActionEvent:
    return ActionEvent.objects.get(action=action, transition="escalate")


def test_escalation_goes_to_the_finance_member_with_the_fewest_open_items(agent_actor: Actor, finance: Any) -> None:
    """Invariant 8: every escalated action has a named, active owner, chosen by load, and the audit
    event (invariant 9) records who and why."""
    already_owned = [escalated(agent_actor), escalated(agent_actor)]
    assert [action.owner for action in already_owned] == [finance, finance]
    # Longer-standing than Fred and just as free, but gone: an inactive user is never the owner.
    make_user("ivan.finance", "finance", is_active=False)
    fred = make_user("fred.finance", "finance")

    action = escalated(agent_actor)

    assert action.owner == fred
    event = escalation_event(action)
    assert event.evidence["owner"] == "fred.finance"
    assert "Assigned to fred.finance" in event.reason
    assert "fewest open items" in event.reason
    assert event.actor_label == "system:reconciler"
    assert (event.from_state, event.to_state) == (S.UNKNOWN, S.NEEDS_REVIEW)
    # Fiona still has two open items and Fred one: the next one goes to Fred again.
    assert escalated(agent_actor).owner == fred
    # Two each: the tie goes to the longest-standing member.
    assert escalated(agent_actor).owner == finance


def test_an_owner_group_for_the_kind_replaces_finance(agent_actor: Actor, finance: Any) -> None:
    """Invariant 8: the admin's OwnerGroup mapping decides whose queue an escalated kind lands in."""
    desk = Group.objects.create(name="refund-desk")
    rita = make_user("rita.refunds")
    rita.groups.add(desk)
    escalated_before = escalated(agent_actor)
    assert escalated_before.owner == finance
    OwnerGroup.objects.create(kind="refund", group=desk)

    action = escalated(agent_actor)

    assert action.owner == rita
    assert escalation_event(action).evidence["owner"] == "rita.refunds"
