"""Pins on the batched claim's edges (``actions.engine.claim.submission_begin_batch``), written
against the mutants that survived the fast subset (tests/MUTATION.md): the default actor, the
empty and one-action limits, the order of the claim, and the fallback that claims a failed
batch's actions one by one (its actor, its time, its skipping of held rows, its log lines).
PostgreSQL: row locks and separate transactions are the point.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions.engine import claim as claim_module
from actions.engine.claim import ClaimOutcome, submission_begin_batch
from actions.foundation.clock import clock_offset_forget
from actions.kinds.base import BindingFailure
from actions.models import Action, ActionEvent, ActionStatus
from actions.services import Actor
from tests.actions.test_batch_claims import no_publish, poison_reserve  # noqa: F401 -- an autouse fixture
from tests.actions.test_reconciliation import authorized_refund
from tests.approvals.test_policy_pins import other_session  # noqa: F401 -- a fixture

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = ActionStatus


def _begin_event(action: Action) -> ActionEvent:
    return ActionEvent.objects.get(action=action, transition="begin_submission")


def test_a_batch_without_an_actor_is_the_dispatchers(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)

    (claim,) = submission_begin_batch(limit=5)

    assert claim.outcome == ClaimOutcome.CLAIMED
    assert _begin_event(action).actor_label == "system:dispatcher"


def test_an_empty_limit_or_an_empty_set_claims_nothing_and_asks_the_database_nothing(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    clock_offset_forget()  # the engine's clock would measure its offset at its next reading

    with CaptureQueriesContext(connection) as queries:
        assert submission_begin_batch(limit=0) == []
        assert submission_begin_batch(limit=5, action_pks=[]) == []

    assert len(queries) == 0
    assert Action.objects.get(pk=action.pk).status == S.AUTHORIZED


def test_a_limit_of_one_claims_exactly_one(agent_actor: Actor) -> None:
    first, second = authorized_refund(agent_actor), authorized_refund(agent_actor)

    claims = submission_begin_batch(limit=1)

    assert [(c.outcome, c.action.pk if c.action else None) for c in claims] == [(ClaimOutcome.CLAIMED, first.pk)]
    assert Action.objects.get(pk=second.pk).status == S.AUTHORIZED


def test_the_oldest_authorization_goes_first_whatever_the_primary_keys_say(agent_actor: Actor) -> None:
    """Oldest by ``status_changed_at``, not by id: an action authorized again after a re-decision
    keeps its low id but waited less."""
    newer_low_pk, older_high_pk = authorized_refund(agent_actor), authorized_refund(agent_actor)
    now = timezone.now()
    Action.objects.filter(pk=newer_low_pk.pk).update(status_changed_at=now - timedelta(seconds=10))
    Action.objects.filter(pk=older_high_pk.pk).update(status_changed_at=now - timedelta(seconds=30))

    (first,) = submission_begin_batch(limit=1)
    (second,) = submission_begin_batch(limit=1)

    assert first.action is not None and first.action.pk == older_high_pk.pk
    assert second.action is not None and second.action.pk == newer_low_pk.pk


def test_a_failed_batch_is_claimed_one_by_one_with_the_batchs_actor_and_time_and_says_so(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    poison, *others = [authorized_refund(agent_actor) for _ in range(3)]
    poison_reserve(monkeypatch, poison)
    actor = Actor.system("dispatcher-process")
    when = timezone.now() - timedelta(seconds=5)

    with caplog.at_level(logging.ERROR, logger=claim_module.log.name):
        claims = submission_begin_batch(limit=10, actor=actor, now=when)

    assert sorted(c.action.pk for c in claims if c.action) == sorted(a.pk for a in others)
    for action in others:
        event = _begin_event(action)
        assert (event.actor_label, event.created_at) == ("system:dispatcher-process", when)
        assert Action.objects.get(pk=action.pk).status_changed_at == when
    messages = [record.getMessage() for record in caplog.records]
    assert "batch claim of 3 actions failed; claiming them one by one" in messages
    assert f"action {poison.pk}: its claim failed; it stays AUTHORIZED, tried again by the next claim" in messages
    assert Action.objects.get(pk=poison.pk).status == S.AUTHORIZED


def test_the_one_by_one_claim_skips_a_row_another_worker_holds_instead_of_waiting(
    agent_actor: Actor,
    other_session: psycopg.Connection[Any],  # noqa: F811 -- the imported fixture
) -> None:
    """The fallback claims with SKIP LOCKED too: a row another worker holds is TAKEN at once,
    not waited for (which ``lock_timeout`` would turn into an error, and no claim at all)."""
    held = authorized_refund(agent_actor)
    other_session.execute("SELECT id FROM actions_action WHERE id = %s FOR UPDATE", [held.pk])
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")

    claims = claim_module._claim_one_by_one([held.pk], actor=Actor.system("dispatcher"), now=timezone.now())

    assert [(c.outcome, c.action) for c in claims] == [(ClaimOutcome.TAKEN, None)]
    assert Action.objects.get(pk=held.pk).status == S.AUTHORIZED


def test_a_stale_action_whose_invalidation_fails_stays_authorized_and_the_batch_still_returns(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stale, fresh = authorized_refund(agent_actor), authorized_refund(agent_actor)
    monkeypatch.setattr(
        claim_module,
        "binding_failures",
        lambda action, approval, now: (
            [BindingFailure("expiry", "The approval expired.")] if action.pk == stale.pk else []
        ),
    )

    def invalidation_fails(**kwargs: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(claim_module, "_invalidate", invalidation_fails)

    with caplog.at_level(logging.ERROR, logger=claim_module.log.name):
        claims = submission_begin_batch(limit=10)

    assert [(c.outcome, c.action.pk if c.action else None) for c in claims] == [(ClaimOutcome.CLAIMED, fresh.pk)]
    assert Action.objects.get(pk=stale.pk).status == S.AUTHORIZED
    assert [r.getMessage() for r in caplog.records] == [
        f"action {stale.pk}: invalidation after a batch claim failed; it stays AUTHORIZED"
    ]


@pytest.mark.parametrize(
    ("target", "key"),
    [
        ({"order_id": 7, "payload": {"amount": "5.00"}}, (7, 0, "", 41)),
        ({"bill_id": 9, "payload": {"bill": "INV-9"}}, (0, 9, "", 41)),
        ({"payload": {"supplier": "Acme Ltd"}}, (0, 0, "Acme Ltd", 41)),
        ({"payload": ["not", "a", "mapping"]}, (0, 0, "", 41)),
    ],
    ids=["order", "bill", "supplier", "odd-payload"],
)
def test_a_batch_locks_targets_in_one_order_orders_then_bills_then_suppliers(
    target: dict[str, Any], key: tuple[int, int, str, int]
) -> None:
    """Two batches that hold actions on the same targets must lock those rows in the same order,
    or they deadlock: the sort key is (order, bill, supplier, id), a missing target as 0 or ""."""
    assert claim_module.target_lock_order(Action(pk=41, **target)) == key
