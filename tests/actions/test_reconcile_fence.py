"""The reconciler's lease fence, decided in memory: only the holder of the current token records
an outcome; a reconciler whose lease was taken over keeps what the receiver said on its own
attempt row (held_lease = false) and changes neither the action nor the money."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.reconcile import _record, reconcile_action, reconcile_claim
from actions.kinds.base import Lookup, LookupVerdict, Outcome
from actions.kinds.refund.contract import refund_contract
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind, Discrepancy, DiscrepancyKind
from actions.providers.base import LookupFailed
from actions.services import Actor
from tests.actions.test_reconciliation import AMOUNT, guarantees, order_money, unknown_and_due
from tests.actions.test_settlement_decisions import SettlingReceiver, refund_effect

pytestmark = pytest.mark.django_db(transaction=True)
S = ActionStatus
CONTRACT = refund_contract(guarantees(keys=True, lookup=True, authoritative=True))


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


# --- what a lookup found, for an UNKNOWN action ----------------------------------------------------


def test_a_found_refund_is_recorded_as_reconciliations_finding_and_booked(agent_actor: Actor) -> None:
    action = unknown_and_due(agent_actor)
    found = Lookup(LookupVerdict.FOUND, effects=[refund_effect(action, "succeeded", Outcome.SUCCEEDED)])
    now = timezone.now()

    assert reconcile_action(action_pk=action.pk, receiver=SettlingReceiver(found), now=now) == S.SUCCEEDED

    stored = Action.objects.get(pk=action.pk)
    assert (stored.status, stored.provider_reference) == (S.SUCCEEDED, "re_settling_1")
    assert order_money(stored) == (AMOUNT, Decimal("0.00"))
    lookup = Attempt.objects.get(action=action, kind=AttemptKind.LOOKUP)
    event = ActionEvent.objects.get(action=action, transition="reconcile_found")
    assert (event.actor_label, event.created_at) == ("system:reconciler", now)
    assert event.reason == "Reconciliation found the receiver's record: re_settling_1 succeeded."
    assert event.evidence == {
        "answer": "re_settling_1 succeeded",
        "source": "reconciliation",
        "attempt_id": lookup.pk,
        "verdict": LookupVerdict.FOUND,
    }


def test_two_effects_for_one_action_are_a_discrepancy_for_a_named_person(agent_actor: Actor, finance: Any) -> None:
    action = unknown_and_due(agent_actor)
    first = refund_effect(action, "succeeded", Outcome.SUCCEEDED)
    second = dataclasses.replace(first, reference="re_settling_2", raw={"id": "re_settling_2"})
    duplicate = Lookup(LookupVerdict.DUPLICATE, effects=[first, second])

    assert reconcile_action(action_pk=action.pk, receiver=SettlingReceiver(duplicate)) == S.NEEDS_REVIEW

    stored = Action.objects.get(pk=action.pk)
    assert (stored.status, stored.owner) == (S.NEEDS_REVIEW, finance)
    assert order_money(stored) == (Decimal("0.00"), AMOUNT), "nothing booked: a person decides"
    [discrepancy] = Discrepancy.objects.all()
    assert (discrepancy.kind, discrepancy.action_id, discrepancy.provider_reference) == (
        DiscrepancyKind.DUPLICATE_EFFECT,
        action.pk,
        "re_settling_1",
    )
    assert discrepancy.details == {"effects": ["re_settling_1", "re_settling_2"], "found_by": "reconciliation"}
    lookup = Attempt.objects.get(action=action, kind=AttemptKind.LOOKUP)
    escalation = ActionEvent.objects.get(action=action, transition="escalate")
    assert escalation.reason.startswith(
        "The receiver has 2 effects for this action (re_settling_1, re_settling_2). Assigned to "
    )
    assert escalation.evidence["effects"] == ["re_settling_1", "re_settling_2"]
    assert (escalation.evidence["attempt_id"], escalation.evidence["verdict"]) == (lookup.pk, LookupVerdict.DUPLICATE)


def test_a_duplicate_the_ledger_audit_stored_first_still_goes_to_a_person_on_one_row(
    agent_actor: Actor, finance: Any
) -> None:
    """The hourly audit can find a duplicate before reconciliation does: both store it under the
    same key, and reconciliation's record (the escalation with it) is not rolled back by it."""
    action = unknown_and_due(agent_actor)
    first = refund_effect(action, "succeeded", Outcome.SUCCEEDED)
    second = dataclasses.replace(first, reference="re_settling_2", raw={"id": "re_settling_2"})
    Discrepancy.objects.create(
        kind=DiscrepancyKind.DUPLICATE_EFFECT,
        action=action,
        provider_reference="re_settling_1",
        details={"effects": ["re_settling_1", "re_settling_2"], "count": 2},
    )

    duplicate = Lookup(LookupVerdict.DUPLICATE, effects=[first, second])
    assert reconcile_action(action_pk=action.pk, receiver=SettlingReceiver(duplicate)) == S.NEEDS_REVIEW

    stored = Action.objects.get(pk=action.pk)
    assert (stored.status, stored.owner) == (S.NEEDS_REVIEW, finance)
    [discrepancy] = Discrepancy.objects.all()
    assert discrepancy.provider_reference == "re_settling_1"
    assert discrepancy.details["count"] == 2, "the audit's row is kept as it was"
