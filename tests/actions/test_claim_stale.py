"""The claim of an action whose approval no longer holds: what it returns and what it records.

Kills the mutants of ``actions.engine.claim._invalidate`` that survived the scenario tests
(tests/MUTATION.md): the returned claim's outcome, action and failures, and the STALE event's
reason. A caller that reads ``claim.outcome`` must see STALE, never a claim without an outcome.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.models import ActionEvent
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
