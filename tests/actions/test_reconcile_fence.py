"""The reconciler's lease fence, decided in memory: only the holder of the current token records
an outcome; a reconciler whose lease was taken over keeps what the receiver said on its own
attempt row (held_lease = false) and changes neither the action nor the money."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.dispatch import submission_record
from actions.engine.reconcile import _record, reconcile_action, reconcile_claim
from actions.kinds.base import Answer, Lookup, LookupVerdict, Outcome
from actions.kinds.refund import refund_contract
from actions.models import Action, ActionStatus, Attempt, AttemptKind
from actions.providers.base import AmbiguousError, LookupFailed
from actions.services import Actor
from tests.actions.test_dispatcher_fence import claimed
from tests.actions.test_reconciliation import AMOUNT, guarantees, order_money
from tests.actions.test_settlement_decisions import SettlingReceiver, refund_effect

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus
CONTRACT = refund_contract(guarantees(keys=True, lookup=True, authoritative=True))


def unknown_and_due(agent_actor: Actor) -> Action:
    action, attempt, token = claimed(agent_actor)
    timeout = AmbiguousError("read timed out", code="timeout")
    submission_record(
        action_pk=action.pk, attempt_pk=attempt.pk, lease_token=token, answer=Answer(Outcome.UNKNOWN, error=timeout)
    )
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=timezone.now() - timedelta(seconds=1))
    return action


def test_a_reconciler_whose_lease_was_taken_over_keeps_its_answer_on_its_attempt_only(
    agent_actor: Actor, settings: Any
) -> None:
    action = unknown_and_due(agent_actor)
    started = timezone.now()
    first = reconcile_claim(action_pk=action.pk, now=started)
    assert first is not None
    _, late_attempt, late_token = first
    # The first reconciler stalls past its lease; a second one takes the action over.
    second = reconcile_claim(action_pk=action.pk, now=started + timedelta(seconds=settings.LEASE_SECONDS + 1))
    assert second is not None
    _, _, current_token = second
    found = Lookup(LookupVerdict.FOUND, effects=[refund_effect(action, "succeeded", Outcome.SUCCEEDED)])

    outcome = _record(
        action_pk=action.pk, attempt_pk=late_attempt.pk, token=late_token, lookup=found, contract=CONTRACT, now=started
    )

    assert outcome == "lease_lost"
    stored = Action.objects.get(pk=action.pk)
    assert (stored.status, stored.lease_token) == (S.UNKNOWN, current_token)
    assert order_money(stored) == (Decimal("0.00"), AMOUNT), "the late answer booked nothing"
    late_attempt.refresh_from_db()
    assert (late_attempt.held_lease, late_attempt.outcome) == (False, LookupVerdict.FOUND)
    assert late_attempt.response == found.response_json() and late_attempt.finished_at is not None


@pytest.mark.parametrize("verdict", [LookupVerdict.FOUND, LookupVerdict.INCONCLUSIVE])
def test_the_receivers_answer_is_kept_on_the_lookup_attempt(agent_actor: Actor, verdict: str) -> None:
    action = unknown_and_due(agent_actor)
    if verdict == LookupVerdict.FOUND:
        lookup = Lookup(verdict, effects=[refund_effect(action, "succeeded", Outcome.SUCCEEDED)])
    else:
        lookup = Lookup(verdict, error=LookupFailed("connection reset", code="network"))

    reconcile_action(action_pk=action.pk, receiver=SettlingReceiver(lookup))

    attempt = Attempt.objects.get(action=action, kind=AttemptKind.LOOKUP)
    assert (attempt.held_lease, attempt.outcome) == (True, verdict)
    assert attempt.response == lookup.response_json()
    assert attempt.error == lookup.error_json()
    if verdict == LookupVerdict.INCONCLUSIVE:
        assert attempt.error == {"type": "LookupFailed", "code": "network", "message": "connection reset"}
    else:
        assert attempt.response == {"effects": [{"id": "re_settling_1", "status": "succeeded"}]}
