"""Batched claims (``actions.engine.claim.submission_begin_batch``).

Several AUTHORIZED actions are claimed in ONE transaction, and each is still claimed exactly as a
single claim would claim it: its binding checked, its target reserved, its own lease, event and
attempt, all committed before any call. PostgreSQL: the row locks and the commits are the point.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from actions.engine import leases
from actions.engine.claim import ClaimOutcome, submission_begin_batch
from actions.engine.sweeps import sweep_authorized, sweep_batch_size
from actions.kinds import kind_for
from actions.models import Action, ActionEvent, ActionStatus, AgentWebhook, AgentWebhookDelivery, Attempt, Order
from actions.services import Actor
from approvals.models import Approval, Decision
from approvals.services import approval_decide, approval_decide_group
from tests.actions.test_reconciliation import AMOUNT, authorized_refund
from tests.approvals.test_policy_pins import other_session  # noqa: F401 -- a fixture
from tests.approvals.test_views import order_of, propose
from tests.factories import make_agent, make_order

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = ActionStatus


@pytest.fixture(autouse=True)
def no_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


def poison_reserve(monkeypatch: pytest.MonkeyPatch, poison: Action) -> None:
    """The poison action's kind hook raises (no binding failure): in the batch and one by one."""
    refund_kind = type(kind_for(poison.kind))
    real_reserve = refund_kind.reserve

    def reserve(self: Any, action: Action, *, approved_version: int | None) -> Any:
        if action.pk == poison.pk:
            raise RuntimeError("a hook that raises")
        return real_reserve(self, action, approved_version=approved_version)

    monkeypatch.setattr(refund_kind, "reserve", reserve)


def test_a_batch_claims_each_action_with_its_own_lease_attempt_event_and_reservation(agent_actor: Actor) -> None:
    """Invariants 3, 5 and 9: each claimed action holds its own lease and attempt, its order
    reserves exactly its amount, and every transition has its event."""
    actions = [authorized_refund(agent_actor) for _ in range(4)]
    versions = {a.pk: order_of(a).version for a in actions}

    claims = submission_begin_batch(limit=10)

    assert sorted(c.action.pk for c in claims if c.action) == sorted(a.pk for a in actions)
    assert {c.outcome for c in claims} == {ClaimOutcome.CLAIMED}
    tokens = {c.lease_token for c in claims}
    assert len(tokens) == 4 and None not in tokens
    for claim in claims:
        assert claim.action is not None and claim.attempt is not None
        stored = Action.objects.get(pk=claim.action.pk)
        assert (stored.status, stored.lease_token) == (S.SUBMITTING, claim.lease_token)
        attempt = Attempt.objects.get(action=stored)
        assert (attempt.pk, attempt.lease_token) == (claim.attempt.pk, claim.lease_token)
        assert ActionEvent.objects.filter(action=stored, transition="begin_submission").count() == 1
        order = Order.objects.get(pk=stored.order_id)
        assert (order.reserved_amount, order.version) == (AMOUNT, versions[stored.pk] + 1)


def test_a_batch_takes_at_most_its_limit_oldest_authorization_first(agent_actor: Actor) -> None:
    actions = [authorized_refund(agent_actor) for _ in range(3)]
    now = timezone.now()
    for age, action in zip((30, 20, 10), actions, strict=True):
        Action.objects.filter(pk=action.pk).update(status_changed_at=now - timedelta(seconds=age))

    claims = submission_begin_batch(limit=2)

    assert [c.action.pk for c in claims if c.action] == [actions[0].pk, actions[1].pk]
    assert Action.objects.get(pk=actions[2].pk).status == S.AUTHORIZED
    assert not Attempt.objects.filter(action=actions[2]).exists()


def test_a_batch_is_one_transaction_so_a_failure_mid_batch_claims_nothing(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Intent before effect: either every claim of the batch is committed, or none is, and then
    nothing was reserved either (invariant 5). Here every claim fails from the third attempt
    row on, in the batch and then one by one: nothing at all is claimed."""
    actions = [authorized_refund(agent_actor) for _ in range(3)]
    real_write = leases.attempt_write
    written: list[Attempt] = []

    def write_then_fail(attempt: Attempt, **kwargs: Any) -> Attempt:
        if len(written) == 2:
            raise RuntimeError("the database went away mid-batch")
        written.append(attempt)
        return real_write(attempt, **kwargs)

    monkeypatch.setattr(leases, "attempt_write", write_then_fail)

    assert submission_begin_batch(limit=10) == []

    assert {a.status for a in Action.objects.filter(pk__in=[a.pk for a in actions])} == {S.AUTHORIZED}
    assert not Attempt.objects.exists()
    assert not ActionEvent.objects.filter(transition="begin_submission").exists()
    assert {o.reserved_amount for o in Order.objects.filter(actions__in=actions)} == {Decimal("0")}


def test_one_action_whose_claim_raises_holds_up_only_itself(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 8: an action whose claim fails for a reason that is no binding (a kind's hook
    raising) rolls its batch back, and the batch's other actions are then claimed one by one;
    oldest first, it would otherwise be in every batch and nothing would ever be sent."""
    poison, *others = [authorized_refund(agent_actor) for _ in range(3)]
    poison_reserve(monkeypatch, poison)

    claims = submission_begin_batch(limit=10)

    assert sorted(c.action.pk for c in claims if c.outcome == ClaimOutcome.CLAIMED and c.action) == sorted(
        a.pk for a in others
    )
    assert Action.objects.get(pk=poison.pk).status == S.AUTHORIZED
    assert Order.objects.get(actions=poison).reserved_amount == Decimal("0")
    assert {Order.objects.get(actions=a).reserved_amount for a in others} == {AMOUNT}


def test_a_batch_costs_fewer_statements_than_claiming_one_by_one(agent_actor: Actor) -> None:
    """Measured where it can be seen: the batch reads its rows and their approvals once."""
    actions = [authorized_refund(agent_actor) for _ in range(8)]
    with CaptureQueriesContext(connection) as batch:
        claims = submission_begin_batch(limit=8)
    assert len([c for c in claims if c.outcome == ClaimOutcome.CLAIMED]) == len(actions)
    # Per action: the reservation; for the batch: the locked read of the actions (their agent's
    # webhook with them), one read of their approvals, one UPDATE of all their transitions, one
    # read of the last event of each one's trail (the hash chain's previous link), one INSERT of
    # all their events and one of all their attempts (a single claim pays each of the last four
    # itself, and reads the webhook on its own).
    statements = [q["sql"] for q in batch.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) == len(actions) + 6, "\n".join(statements)
    hook_reads = [sql for sql in statements if 'FROM "actions_agentwebhook"' in sql]
    assert len(hook_reads) == 1 and hook_reads[0].endswith("FOR UPDATE SKIP LOCKED"), hook_reads
    inserts = [sql.split('"')[1] for sql in statements if sql.startswith("INSERT")]
    assert inserts == ["actions_actionevent", "actions_attempt"]
    action_updates = [sql for sql in statements if sql.startswith('UPDATE "actions_action"')]
    assert len(action_updates) == 1


def test_a_batchs_events_and_attempts_are_written_inside_its_transaction(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 9: the events are inserted together at the end of the batch, still before its
    commit. When that insert fails the whole batch rolls back (nothing reserved, no lease), and
    its actions are then claimed one by one, each with exactly one event and one attempt."""
    actions = [authorized_refund(agent_actor) for _ in range(3)]

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the events' INSERT failed")

    monkeypatch.setattr(ActionEvent.objects, "bulk_create", fail)

    claims = submission_begin_batch(limit=10)

    assert sorted(c.action.pk for c in claims if c.outcome == ClaimOutcome.CLAIMED and c.action) == sorted(
        a.pk for a in actions
    )
    for action in actions:
        assert ActionEvent.objects.filter(action=action, transition="begin_submission").count() == 1
        assert Attempt.objects.filter(action=action).count() == 1
        assert Order.objects.get(actions=action).reserved_amount == AMOUNT


def test_an_action_whose_approval_no_longer_holds_goes_stale_alone_and_the_rest_are_claimed(
    agent_actor: Actor,
) -> None:
    """Invariant 6: nothing is submitted under an expired approval or against a changed order; the
    other actions of the batch are claimed as if it were not there."""
    expired, changed, fine = (authorized_refund(agent_actor) for _ in range(3))
    Approval.objects.filter(action=expired, decision=Decision.APPROVE).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    Order.objects.filter(actions=changed).update(version=F("version") + 1)

    claims = {c.action.pk: c for c in submission_begin_batch(limit=10) if c.action}

    assert claims[fine.pk].outcome == ClaimOutcome.CLAIMED
    assert claims[expired.pk].outcome == ClaimOutcome.STALE
    assert [f["binding"] for f in claims[expired.pk].failures] == ["expiry"]
    assert claims[changed.pk].outcome == ClaimOutcome.STALE
    assert [f["binding"] for f in claims[changed.pk].failures] == ["order_version"]
    for stale in (expired, changed):
        # The auto-approval policy decides again on the order as it is now, in the same
        # transaction as the invalidation (approvals.policy.approval_redecide_by_policy).
        assert ActionEvent.objects.filter(action=stale, transition="invalidate").count() == 1
        assert not Attempt.objects.filter(action=stale).exists()
        assert Order.objects.get(actions=stale).reserved_amount == Decimal("0")
    assert Order.objects.get(actions=fine).reserved_amount == AMOUNT


def test_two_separate_approvals_on_one_order_in_one_batch_reserve_once_and_the_other_goes_stale(
    manager: Any, agent_actor: Actor, settings: Any
) -> None:
    """Invariant 5 inside one batch: the second reservation finds the order one version on, as a
    second single claim would, and never reserves against the version the first one left."""
    settings.AUTO_APPROVAL_ENABLED = False
    order = make_order(captured="310.00")
    a, b = propose(agent_actor, amount="40.00", order=order), propose(agent_actor, amount="60.00", order=order)
    approval_decide(action_pk=a.pk, user=manager, decision="approve")
    approval_decide(action_pk=b.pk, user=manager, decision="approve")

    claims = {c.action.pk: c.outcome for c in submission_begin_batch(limit=10) if c.action}

    assert sorted(claims.values(), key=str) == sorted([ClaimOutcome.CLAIMED, ClaimOutcome.STALE], key=str)
    claimed = a if claims[a.pk] == ClaimOutcome.CLAIMED else b
    stored = Order.objects.get(pk=order.pk)
    assert stored.reserved_amount == claimed.amount
    assert stored.version == order.version + 1


def test_grouped_siblings_in_one_batch_both_reserve_along_their_version_chain(
    manager: Any, agent_actor: Actor, settings: Any
) -> None:
    settings.AUTO_APPROVAL_ENABLED = False
    order = make_order(captured="310.00")
    a, b = propose(agent_actor, amount="40.00", order=order), propose(agent_actor, amount="60.00", order=order)
    approval_decide_group(action_pks=[a.pk, b.pk], user=manager)

    claims = submission_begin_batch(limit=10)

    assert {c.outcome for c in claims} == {ClaimOutcome.CLAIMED} and len(claims) == 2
    stored = Order.objects.get(pk=order.pk)
    assert (stored.reserved_amount, stored.version) == (Decimal("100.00"), order.version + 2)


def test_a_batch_skips_rows_another_worker_holds_instead_of_waiting(
    agent_actor: Actor,
    other_session: psycopg.Connection[Any],  # noqa: F811 -- the imported fixture
) -> None:
    held, free = authorized_refund(agent_actor), authorized_refund(agent_actor)
    other_session.execute("SELECT id FROM actions_action WHERE id = %s FOR UPDATE", [held.pk])
    with connection.cursor() as cursor:
        # Waiting for the held row would fail the test instead of hanging it.
        cursor.execute("SET lock_timeout = '2s'")

    claims = submission_begin_batch(limit=10)

    assert [c.action.pk for c in claims if c.action] == [free.pk]
    assert Action.objects.get(pk=held.pk).status == S.AUTHORIZED


def test_only_actions_authorized_before_the_cutoff_or_in_the_given_set_are_claimed(agent_actor: Actor) -> None:
    old, fresh, other = (authorized_refund(agent_actor) for _ in range(3))
    now = timezone.now()
    Action.objects.filter(pk__in=[old.pk, other.pk]).update(status_changed_at=now - timedelta(minutes=1))
    Action.objects.filter(pk=fresh.pk).update(status_changed_at=now)

    assert [c.action.pk for c in submission_begin_batch(limit=10, action_pks=[old.pk]) if c.action] == [old.pk]
    assert submission_begin_batch(limit=10, action_pks=[]) == []
    claimed = [c.action.pk for c in submission_begin_batch(limit=10, authorized_before=now) if c.action]
    assert claimed == [other.pk]
    assert Action.objects.get(pk=fresh.pk).status == S.AUTHORIZED


def test_the_sweep_claims_in_batches_that_fit_in_one_lease_and_its_time_limit(settings: Any) -> None:
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS, settings.DISPATCH_BATCH_SIZE = 60, 10, 16
    settings.CELERY_TASK_SOFT_TIME_LIMIT = 60
    # Sent one after the other: five calls of up to 10 s each still end inside a 60 s lease.
    assert sweep_batch_size() == 5
    # The sweep task itself is stopped after its soft time limit (0.6 of the lease by default).
    settings.CELERY_TASK_SOFT_TIME_LIMIT = 36
    assert sweep_batch_size() == 2
    settings.CELERY_TASK_SOFT_TIME_LIMIT, settings.DISPATCH_BATCH_SIZE = 60, 3
    assert sweep_batch_size() == 3
    settings.LEASE_SECONDS = 5
    assert sweep_batch_size() == 1


def test_the_sweep_sends_every_lost_publish_through_batched_claims(
    agent_actor: Actor, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 8: an AUTHORIZED action whose publish was lost is sent by the sweep; each of them
    once, each under its own lease."""
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS, settings.DISPATCH_BATCH_SIZE = 60, 10, 2
    settings.CELERY_TASK_SOFT_TIME_LIMIT = 60
    actions = [authorized_refund(agent_actor) for _ in range(5)]
    sent: list[tuple[int, Any]] = []
    batches: list[int] = []
    real_batch = submission_begin_batch

    def counting_batch(**kwargs: Any) -> Any:
        claims = real_batch(**kwargs)
        batches.append(len(claims))
        return claims

    def send(*, action: Action, attempt: Attempt, lease_token: Any) -> str:
        assert Action.objects.get(pk=action.pk).lease_token == lease_token  # committed before the call
        sent.append((action.pk, lease_token))
        return "sent"

    monkeypatch.setattr("actions.engine.sweeps.submission_begin_batch", counting_batch)
    monkeypatch.setattr("actions.engine.sweeps.submission_send_and_record", send)

    assert sweep_authorized(now=timezone.now() + timedelta(minutes=1)) == 5

    assert sorted(pk for pk, _ in sent) == sorted(a.pk for a in actions)
    assert len({token for _, token in sent}) == 5
    assert batches == [2, 2, 1, 0]


def test_an_agents_webhook_gets_one_delivery_per_claim_naming_its_event(agent_actor: Actor) -> None:
    """The events of a batch are written together at its end, and each still gets its outbox row,
    which names the event it announces (the row is written once the event has its key)."""
    assert agent_actor.agent is not None
    AgentWebhook.objects.create(agent=agent_actor.agent, url="https://hooks.example.test/console", secret="s" * 32)
    actions = [authorized_refund(agent_actor) for _ in range(3)]

    claims = submission_begin_batch(limit=10)

    assert len([c for c in claims if c.outcome == ClaimOutcome.CLAIMED]) == 3
    for action in actions:
        event = ActionEvent.objects.get(action=action, transition="begin_submission")
        delivery = AgentWebhookDelivery.objects.get(action=action, event_type="action.submitting")
        assert (delivery.audit_event_id, delivery.event_id) == (event.pk, f"evt_{event.pk}")
        assert delivery.payload["data"]["previous_status"] == S.AUTHORIZED


def test_a_batch_of_two_agents_writes_outbox_rows_only_for_the_one_whose_webhook_is_active(
    agent_actor: Actor, agent_owner: Any
) -> None:
    """The batch learns each agent's webhook from its locked read of the actions: an agent with an
    active webhook gets one delivery per claimed action, an agent whose webhook is switched off
    gets none, in the same batch."""
    assert agent_actor.agent is not None
    quiet = make_agent(agent_owner, name="quiet-bot")
    AgentWebhook.objects.create(agent=agent_actor.agent, url="https://hooks.example.test/on", secret="s" * 32)
    AgentWebhook.objects.create(agent=quiet, url="https://hooks.example.test/off", secret="s" * 32, is_active=False)
    heard = [authorized_refund(agent_actor) for _ in range(2)]
    unheard = [authorized_refund(Actor.for_agent(quiet)) for _ in range(2)]

    claims = submission_begin_batch(limit=10)

    assert len([c for c in claims if c.outcome == ClaimOutcome.CLAIMED]) == 4
    submitting = AgentWebhookDelivery.objects.filter(event_type="action.submitting")
    assert sorted(submitting.values_list("action_id", flat=True)) == sorted(a.pk for a in heard)
    assert set(submitting.values_list("agent_id", flat=True)) == {agent_actor.agent.pk}
    assert not AgentWebhookDelivery.objects.filter(action__in=unheard).exists()
