"""Housekeeping prunes old attempts' bodies of final actions, and nothing else.

Storage tidying, not correctness: the tests prove it never touches an action that is not final,
nor any audit event, nor a final action whose evidence is still needed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.housekeeping import PRUNED_MARKER, attempts_prune_bodies
from actions.foundation.signing import signing_key
from actions.foundation.tombstones import tombstone_valid
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import (
    Action,
    ActionEvent,
    ActionStatus,
    Attempt,
    AttemptKind,
    Discrepancy,
    DiscrepancyKind,
    Remedy,
    RemedyKind,
    RetentionTombstone,
)
from actions.review.selectors.common import attempt_summary
from actions.services import Actor
from tests.factories import make_order, make_request

pytestmark = pytest.mark.django_db

S = ActionStatus
LONG_AGO = timedelta(days=400)
NOT_FINAL = [S.PROPOSED, S.AUTHORIZED, S.STALE, S.SUBMITTING, S.UNKNOWN, S.SETTLING, S.NEEDS_REVIEW]
FINAL = [S.SUCCEEDED, S.FAILED_FINAL, S.REJECTED, S.CANCELLED]
REQUEST = {"charge": "ch_1", "amount": 4000, "metadata": {"action_id": "x"}}
RESPONSE = {"id": "re_1", "status": "succeeded", "amount": 4000, "currency": "eur"}


@pytest.fixture(autouse=True)
def trail_key(settings: Any) -> None:
    # Each pruning signs its tombstone with the trail's key.
    settings.TRAIL_SIGNING_KEY = "a-test-key-of-enough-length-0123456789"


def action_in(status: str, agent_actor: Actor, *, final_since: timedelta = LONG_AGO) -> Action:
    """An action put straight into ``status`` (the state machine is not what is tested here),
    with one old attempt carrying full bodies."""
    order = make_order(captured="100.00")
    make_request(order, 1)
    action = action_propose_refund(
        order_number=order.number,
        request_number=1,
        amount="40.00",
        currency="EUR",
        reason_code="damaged",
        proposer=agent_actor,
    ).action
    now = timezone.now()
    Action.objects.filter(pk=action.pk).update(status=status, status_changed_at=now - final_since)
    Attempt.objects.create(
        action=action,
        kind=AttemptKind.SUBMIT,
        idempotency_key=action.idempotency_key,
        request=REQUEST,
        response=RESPONSE,
        outcome="succeeded",
        started_at=now - LONG_AGO,
        finished_at=now - LONG_AGO + timedelta(seconds=1),
    )
    return action


def bodies(action: Action) -> list[tuple[Any, Any]]:
    return list(Attempt.objects.filter(action=action).values_list("request", "response"))


def events() -> list[tuple[Any, ...]]:
    return list(ActionEvent.objects.order_by("pk").values_list("pk", "action_id", "transition", "to_state", "evidence"))


@pytest.fixture(autouse=True)
def quiet_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def test_it_never_touches_an_action_that_is_not_final_however_old(agent_actor: Actor) -> None:
    live = {status: action_in(status, agent_actor) for status in NOT_FINAL}
    before_events = events()

    report = attempts_prune_bodies(retention_days=1)

    assert report.pruned == 0
    for status, action in live.items():
        assert bodies(action) == [(REQUEST, RESPONSE)], status
    assert events() == before_events


def test_it_prunes_old_attempts_of_final_actions_and_keeps_every_audit_event(agent_actor: Actor) -> None:
    final = [action_in(status, agent_actor) for status in FINAL]
    live = action_in(S.UNKNOWN, agent_actor)
    before_events = events()

    report = attempts_prune_bodies(retention_days=90)

    assert report.pruned == len(FINAL)
    tombstone = RetentionTombstone.objects.get()
    assert (tombstone.record_type, tombstone.count, tombstone.retention_days) == ("attempt bodies", len(FINAL), 90)
    assert tombstone_valid(tombstone, key=signing_key())
    for action in final:
        ((request, response),) = bodies(action)
        assert PRUNED_MARKER in request and PRUNED_MARKER in response
        assert len(response["sha256"]) == 64 and response["bytes"] > 0
    assert bodies(live) == [(REQUEST, RESPONSE)]
    assert events() == before_events
    attempt = Attempt.objects.get(action=final[0])
    assert attempt.outcome == "succeeded" and attempt.idempotency_key  # the timeline stays
    assert "removed after" in attempt_summary(attempt)


def test_it_keeps_actions_final_only_recently_or_with_open_follow_ups(agent_actor: Actor) -> None:
    recent = action_in(S.SUCCEEDED, agent_actor, final_since=timedelta(days=3))
    with_remedy = action_in(S.FAILED_FINAL, agent_actor)
    Remedy.objects.create(action=with_remedy, kind=RemedyKind.STORE_CREDIT, amount="40.00", currency="EUR")
    with_discrepancy = action_in(S.SUCCEEDED, agent_actor)
    Discrepancy.objects.create(action=with_discrepancy, kind=DiscrepancyKind.DUPLICATE_EFFECT)

    assert attempts_prune_bodies(retention_days=90).pruned == 0

    for action in (recent, with_remedy, with_discrepancy):
        assert bodies(action) == [(REQUEST, RESPONSE)]


def test_a_second_run_prunes_nothing_more_and_zero_days_switches_it_off(agent_actor: Actor) -> None:
    action_in(S.SUCCEEDED, agent_actor)

    assert attempts_prune_bodies(retention_days=0).pruned == 0
    assert attempts_prune_bodies(retention_days=90).pruned == 1
    assert attempts_prune_bodies(retention_days=90).pruned == 0


def test_beat_runs_it(settings: Any) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["housekeeping-prune-attempt-bodies"]
    assert entry["task"] == "actions.tasks.housekeeping_prune_attempt_bodies"
