"""The claim of an action whose approval no longer holds: what it returns and what it records.

Kills the mutants of ``actions.engine.claim._invalidate`` that survived the scenario tests
(tests/MUTATION.md): the returned claim's outcome, action and failures, and the STALE event's
reason. A caller that reads ``claim.outcome`` must see STALE, never a claim without an outcome.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, _invalidate, submission_begin
from actions.models import Action, ActionEvent, ActionStatus
from actions.services import Actor
from tests.actions.test_reconciliation import authorized_refund

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


def test_a_claim_after_the_approval_expired_returns_stale_with_the_action_and_the_failures(
    agent_actor: Actor,
) -> None:
    action = authorized_refund(agent_actor)
    # Two days on, the approval (valid for a day at most) has expired.
    later = timezone.now() + timedelta(days=2)

    claim = submission_begin(action_pk=action.pk, now=later)

    assert claim.outcome == ClaimOutcome.STALE
    assert claim.action is not None and claim.action.pk == action.pk
    assert [failure["binding"] for failure in claim.failures] == ["expiry"]
    assert claim.failures[0]["message"].startswith("The approval expired at ")
    event = ActionEvent.objects.get(action=action, transition="invalidate")
    assert event.reason == "The approval no longer holds: " + claim.failures[0]["message"]
    assert event.evidence == {"failed_bindings": claim.failures}
    assert event.created_at == later


def test_invalidating_an_action_that_already_left_authorized_is_taken_and_changes_nothing(
    agent_actor: Actor,
) -> None:
    """Between the claim's check and the invalidation's lock, another worker claimed the action:
    the invalidation reports TAKEN with the action as it found it, and writes nothing."""
    action = authorized_refund(agent_actor)
    Action.objects.filter(pk=action.pk).update(status=ActionStatus.SUBMITTING)

    claim = _invalidate(
        action_pk=action.pk,
        failures=[{"binding": "expiry", "message": "The approval expired."}],
        actor=Actor.system("dispatcher"),
        now=timezone.now(),
    )

    assert claim.outcome == ClaimOutcome.TAKEN
    assert claim.action is not None and (claim.action.pk, claim.action.status) == (action.pk, ActionStatus.SUBMITTING)
    assert not ActionEvent.objects.filter(action=action, transition="invalidate").exists()


def test_every_failed_binding_is_in_the_stale_reason_one_sentence_after_another(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    failures = [
        {"binding": "expiry", "message": "The approval expired."},
        {"binding": "amount", "message": "Approved amount 5.00 differs from 6.00."},
    ]

    claim = _invalidate(action_pk=action.pk, failures=failures, actor=Actor.system("dispatcher"), now=timezone.now())

    assert claim.outcome == ClaimOutcome.STALE
    event = ActionEvent.objects.get(action=action, transition="invalidate")
    assert event.reason == (
        "The approval no longer holds: The approval expired. Approved amount 5.00 differs from 6.00."
    )
