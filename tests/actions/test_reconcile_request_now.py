"""A receiver's notice (a webhook) makes an action's reconciliation due now, and nothing more.

``reconcile_request_now`` moves ``next_reconcile_at`` to now only for an UNKNOWN or SETTLING
action whose reconciler lease is free, and only when it was not already due. The receiver's word
is never recorded as the outcome: the reconciliation asks the receiver as always.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.reconcile import reconcile_request_now
from actions.models import Action, ActionStatus
from actions.services import Actor
from tests.actions.test_reconciliation import authorized_refund

S = ActionStatus
pytestmark = pytest.mark.django_db


def set_state(action: Action, **columns: Any) -> None:
    Action.objects.filter(pk=action.pk).update(**columns)


def next_reconcile_at(action: Action) -> datetime | None:
    return Action.objects.values_list("next_reconcile_at", flat=True).get(pk=action.pk)


@pytest.mark.parametrize("status", [S.UNKNOWN, S.SETTLING])
def test_a_notice_makes_a_waiting_reconciliation_due_now(agent_actor: Actor, status: str) -> None:
    now = timezone.now()
    action = authorized_refund(agent_actor)
    neighbour = authorized_refund(agent_actor)
    later = now + timedelta(minutes=10)
    for each in (action, neighbour):
        set_state(each, status=status, next_reconcile_at=later, lease_token=None, lease_expires_at=None)

    assert reconcile_request_now(action_pk=action.pk, now=now) is True

    assert next_reconcile_at(action) == now
    assert next_reconcile_at(neighbour) == later, "only the notified action moves"
    assert Action.objects.get(pk=action.pk).status == status, "the notice is not an outcome"


def test_a_notice_for_an_action_with_no_reconciliation_time_makes_it_due_now(agent_actor: Actor) -> None:
    now = timezone.now()
    action = authorized_refund(agent_actor)
    set_state(action, status=S.UNKNOWN, next_reconcile_at=None)

    assert reconcile_request_now(action_pk=action.pk, now=now) is True
    assert next_reconcile_at(action) == now


@pytest.mark.parametrize("offset", [timedelta(0), timedelta(seconds=-5)])
def test_a_notice_for_an_action_already_due_moves_nothing(agent_actor: Actor, offset: timedelta) -> None:
    now = timezone.now()
    action = authorized_refund(agent_actor)
    set_state(action, status=S.UNKNOWN, next_reconcile_at=now + offset)

    assert reconcile_request_now(action_pk=action.pk, now=now) is False
    assert next_reconcile_at(action) == now + offset


def test_a_notice_waits_for_the_reconciler_that_holds_the_lease(agent_actor: Actor) -> None:
    now = timezone.now()
    action = authorized_refund(agent_actor)
    lease_end = now + timedelta(seconds=1)
    set_state(
        action, status=S.UNKNOWN, lease_token=uuid.uuid4(), lease_expires_at=lease_end, next_reconcile_at=lease_end
    )

    assert reconcile_request_now(action_pk=action.pk, now=now) is False
    assert next_reconcile_at(action) == lease_end


@pytest.mark.parametrize("expired_by", [timedelta(0), timedelta(seconds=3)])
def test_a_notice_after_the_reconcilers_lease_ran_out_makes_it_due_now(
    agent_actor: Actor, expired_by: timedelta
) -> None:
    now = timezone.now()
    action = authorized_refund(agent_actor)
    later = now + timedelta(minutes=1)
    set_state(
        action, status=S.SETTLING, lease_token=uuid.uuid4(), lease_expires_at=now - expired_by, next_reconcile_at=later
    )

    assert reconcile_request_now(action_pk=action.pk, now=now) is True
    assert next_reconcile_at(action) == now


@pytest.mark.parametrize("status", [S.AUTHORIZED, S.SUBMITTING, S.SUCCEEDED, S.FAILED_FINAL, S.NEEDS_REVIEW])
def test_a_notice_for_an_action_outside_reconciliation_moves_nothing(agent_actor: Actor, status: str) -> None:
    now = timezone.now()
    action = authorized_refund(agent_actor)
    later = now + timedelta(minutes=10)
    set_state(action, status=status, next_reconcile_at=later, lease_token=None, lease_expires_at=None)

    assert reconcile_request_now(action_pk=action.pk, now=now) is False
    assert next_reconcile_at(action) == later
