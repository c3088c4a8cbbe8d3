"""The AUTHORIZED sweep (``actions.engine.sweeps.sweep_authorized``), both of its paths.

The sweep sends what a lost publish left AUTHORIZED (invariant 8): after a grace period that
leaves fresh approvals to their own publish, within a time budget, at most ``limit`` actions,
counting only the ones it sent. Without rate limits it claims in batches; with them, each
action first takes its receiver's token and is claimed on its own, skipping rows another worker
holds. Written against the survivors of ``make mutate MODULE=actions.engine.dispatch``
(tests/MUTATION.md, sixth batch): the existing sweep tests replaced the send, so nothing checked
what was recorded, and the throttled path had no test in the mutation subset at all.

The budget is measured on a clock the test drives: each call to the receiver takes one second.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.utils import timezone

from actions.engine import send, sweeps
from actions.engine.escalation import action_escalate
from actions.engine.sweeps import sweep_authorized, sweep_batch_size
from actions.kinds import kind_for
from actions.kinds.refund.contract import RefundReceiver
from actions.models import Action, ActionStatus, Attempt
from actions.providers.base import CreateRefund, ProviderRefund
from actions.services import Actor
from approvals.models import Approval, Decision
from tests.actions.test_dispatcher_fence import claimed
from tests.actions.test_reconciliation import FakeReceiver, authorized_refund, guarantees
from tests.approvals.test_policy_pins import other_session  # noqa: F401 -- a fixture
from tests.factories import make_user

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = ActionStatus


@dataclass
class Clock:
    """time.monotonic for the sweep's budget; it starts far from 0 so that a sum of two
    readings cannot pass for a difference."""

    now: float = 1000.0

    def monotonic(self) -> float:
        return self.now


@dataclass
class OneSecondReceiver(FakeReceiver):
    clock: Clock | None = None
    raise_for: set[str] | None = None  # action ids whose call raises something unexpected

    def create_refund(self, req: CreateRefund) -> ProviderRefund:
        assert self.clock is not None
        self.clock.now += 1
        if self.raise_for and req.metadata.get("action_id") in self.raise_for:
            raise RuntimeError("the adapter broke")
        return super().create_refund(req)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(sweeps, "time", SimpleNamespace(monotonic=clock.monotonic))
    return clock


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch, clock: Clock, dispatched: list[int]) -> OneSecondReceiver:
    fake = OneSecondReceiver(
        guarantees(keys=True, lookup=True, authoritative=True, key_retention=timedelta(hours=24)), clock=clock
    )
    monkeypatch.setattr(send, "receiver_for", lambda action: RefundReceiver(fake))
    return fake


@pytest.fixture
def lease_window(settings: Any) -> None:
    """A 60 s lease and time limit with a 10 s provider timeout: batches of up to 5 fit."""
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS, settings.CELERY_TASK_SOFT_TIME_LIMIT = 60, 10, 60


@pytest.fixture(params=["batched", "throttled"])
def path(request: pytest.FixtureRequest, settings: Any, monkeypatch: pytest.MonkeyPatch, lease_window: None) -> str:
    """Both paths of the sweep. Throttled: a rate limit is configured, and every receiver has a
    token (``dispatch_wait`` answers 0; the buckets themselves are tests/actions/test_throttle.py's)."""
    settings.DISPATCH_BATCH_SIZE = 1
    if request.param == "throttled":
        settings.RECEIVER_RATE_LIMITS = {"a receiver": "100/second"}
        monkeypatch.setattr(sweeps, "dispatch_wait", lambda *, action_pk: 0.0)
    else:
        settings.RECEIVER_RATE_LIMITS = {}
    return str(request.param)


def aged(agent_actor: Actor, count: int, *, seconds: float = 60) -> list[Action]:
    """``count`` AUTHORIZED refunds whose approval is ``seconds`` old, the first one the oldest."""
    actions = [authorized_refund(agent_actor) for _ in range(count)]
    now = timezone.now()
    for n, action in enumerate(actions):
        Action.objects.filter(pk=action.pk).update(status_changed_at=now - timedelta(seconds=seconds + count - n))
    return actions


def statuses(actions: list[Action]) -> list[str]:
    return [Action.objects.get(pk=a.pk).status for a in actions]


def test_the_sweep_records_each_answer_under_the_lease_it_claimed(
    agent_actor: Actor, receiver: OneSecondReceiver, path: str
) -> None:
    actions = aged(agent_actor, 2)

    assert sweep_authorized() == 2

    assert statuses(actions) == [S.SUCCEEDED, S.SUCCEEDED]
    for action in actions:
        attempt = Attempt.objects.get(action=action)
        assert (attempt.outcome, attempt.held_lease) == ("succeeded", True)
    assert receiver.calls == ["create_refund", "create_refund"]


def test_a_fresh_approval_is_left_to_its_own_publish_for_half_a_sweep_interval(
    agent_actor: Actor, receiver: OneSecondReceiver, path: str, settings: Any
) -> None:
    """The grace period is half the sweep interval, counted back from the sweep's ``now``."""
    settings.SWEEP_INTERVAL_SECONDS = 30
    [action] = aged(agent_actor, 1, seconds=0)
    approved_at = Action.objects.get(pk=action.pk).status_changed_at

    assert sweep_authorized(now=approved_at + timedelta(seconds=14)) == 0
    assert statuses([action]) == [S.AUTHORIZED]
    assert receiver.calls == []

    assert sweep_authorized(now=approved_at + timedelta(seconds=16)) == 1
    assert statuses([action]) == [S.SUCCEEDED]


def test_the_sweep_stops_starting_sends_once_its_budget_is_spent(
    agent_actor: Actor, receiver: OneSecondReceiver, path: str
) -> None:
    """Each send takes one second here: with a budget of one second the sweep starts a send at 0 s
    and at 1 s (not past the budget yet) and none at 2 s. The rest waits for the next sweep."""
    actions = aged(agent_actor, 3)

    assert sweep_authorized(budget_seconds=1.0) == 2

    assert statuses(actions) == [S.SUCCEEDED, S.SUCCEEDED, S.AUTHORIZED]


def test_without_a_budget_the_sweep_takes_half_its_interval(
    agent_actor: Actor, receiver: OneSecondReceiver, path: str, settings: Any
) -> None:
    """The other sweeps of the period run after it on the same process: they get the rest."""
    settings.SWEEP_INTERVAL_SECONDS = 4
    actions = aged(agent_actor, 4)

    assert sweep_authorized(now=timezone.now()) == 3  # sends started at 0, 1 and 2 s

    assert statuses(actions) == [S.SUCCEEDED, S.SUCCEEDED, S.SUCCEEDED, S.AUTHORIZED]


def test_the_sweep_sends_at_most_its_limit_oldest_first(
    agent_actor: Actor, receiver: OneSecondReceiver, path: str, settings: Any
) -> None:
    settings.DISPATCH_BATCH_SIZE = 2  # batches of 2 and then 1: the last asks for what is left
    actions = aged(agent_actor, 5)

    assert sweep_authorized(limit=3) == 3

    assert statuses(actions) == [S.SUCCEEDED] * 3 + [S.AUTHORIZED] * 2


def test_an_action_that_is_not_authorized_takes_no_place_in_the_limit(
    agent_actor: Actor, receiver: OneSecondReceiver, path: str
) -> None:
    """The oldest row is an action already sent: the sweep's one place goes to the AUTHORIZED one."""
    done, waiting = aged(agent_actor, 2)
    Action.objects.filter(pk=done.pk).update(status=S.SUCCEEDED)

    assert sweep_authorized(limit=1) == 1

    assert statuses([waiting]) == [S.SUCCEEDED]


def test_a_send_that_raises_is_logged_and_the_rest_of_the_batch_is_still_sent(
    agent_actor: Actor,
    receiver: OneSecondReceiver,
    settings: Any,
    caplog: pytest.LogCaptureFixture,
    lease_window: None,
) -> None:
    """Batched path: the claims of a batch are all committed before the first send, so one send
    that raises must not strand the others; its own lease expires to reconciliation."""
    settings.RECEIVER_RATE_LIMITS = {}
    settings.DISPATCH_BATCH_SIZE = 3
    broken, fine = aged(agent_actor, 2)
    receiver.raise_for = {broken.action_id}

    assert sweep_authorized() == 2

    assert statuses([broken, fine]) == [S.SUBMITTING, S.SUCCEEDED]
    failure = next(r for r in caplog.records if r.name == "actions.engine.sweeps" and r.exc_info)
    assert failure.getMessage() == f"action_id={broken.action_id}: its send or record failed"
    assert failure.exc_info is not None and isinstance(failure.exc_info[1], RuntimeError)


# --- the throttled path's own rules ------------------------------------------------------------


def test_with_rate_limits_an_action_whose_receiver_has_no_token_is_skipped_not_waited_for(
    agent_actor: Actor, receiver: OneSecondReceiver, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty bucket (any wait above 0, even half a second) leaves that action AUTHORIZED for a
    later sweep; the sweep goes on with the next action, whose receiver has a token."""
    settings.RECEIVER_RATE_LIMITS = {"a receiver": "100/second"}
    first, second, third = aged(agent_actor, 3)
    waits = {first.pk: 0.5, second.pk: 0.0, third.pk: 2.0}
    monkeypatch.setattr(sweeps, "dispatch_wait", lambda *, action_pk: waits[action_pk])

    assert sweep_authorized() == 1

    assert statuses([first, second, third]) == [S.AUTHORIZED, S.SUCCEEDED, S.AUTHORIZED]


def test_with_rate_limits_a_row_another_worker_holds_is_skipped_and_not_counted(
    agent_actor: Actor,
    receiver: OneSecondReceiver,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    other_session: psycopg.Connection[Any],  # noqa: F811 -- the imported fixture
) -> None:
    """SKIP LOCKED: the sweep does not wait for a row another worker is claiming (``lock_timeout``
    would turn a wait into an error here). Neither that row (TAKEN) nor one whose approval expired
    (STALE) counts as sent."""
    settings.RECEIVER_RATE_LIMITS = {"a receiver": "100/second"}
    monkeypatch.setattr(sweeps, "dispatch_wait", lambda *, action_pk: 0.0)
    held, expired, fine, also_fine = aged(agent_actor, 4)
    Approval.objects.filter(action=expired, decision=Decision.APPROVE).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    other_session.execute("SELECT id FROM actions_action WHERE id = %s FOR UPDATE", [held.pk])
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '2s'")

    assert sweep_authorized() == 2

    assert statuses([held, fine, also_fine]) == [S.AUTHORIZED, S.SUCCEEDED, S.SUCCEEDED]
    assert Action.objects.get(pk=expired.pk).status != S.SUBMITTING
    assert receiver.calls == ["create_refund", "create_refund"]


# --- the batch size ----------------------------------------------------------------------------


def test_the_batch_size_divides_by_at_least_one_second_of_provider_timeout(settings: Any) -> None:
    settings.LEASE_SECONDS, settings.CELERY_TASK_SOFT_TIME_LIMIT, settings.DISPATCH_BATCH_SIZE = 10, 10, 16
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    assert sweep_batch_size() == 9
    settings.PROVIDER_TIMEOUT_SECONDS = 0
    assert sweep_batch_size() == 9


def test_without_a_task_time_limit_the_lease_alone_bounds_the_batch(settings: Any) -> None:
    settings.LEASE_SECONDS, settings.PROVIDER_TIMEOUT_SECONDS, settings.DISPATCH_BATCH_SIZE = 60, 10, 16
    del settings.CELERY_TASK_SOFT_TIME_LIMIT
    assert sweep_batch_size() == 5


# --- escalation to the kind's own owner group ----------------------------------------------------


def test_an_escalation_goes_to_the_kinds_own_owner_group_when_none_is_configured(
    agent_actor: Actor, monkeypatch: pytest.MonkeyPatch, finance: Any, dispatched: list[int]
) -> None:
    """No OwnerGroup row for the kind: the kind's default group decides, not finance's."""
    refund_kind = type(kind_for("refund"))
    monkeypatch.setattr(refund_kind, "owner_group", "refund desk")
    desk = make_user("rita.refunds")
    desk.groups.add(Group.objects.create(name="refund desk"))
    action, _, _ = claimed(agent_actor)
    with transaction.atomic():
        owner = action_escalate(
            action=action, actor=Actor.system("test"), now=timezone.now(), reason="Look.", evidence={}
        )

    assert owner == desk and owner != finance
    assert Action.objects.get(pk=action.pk).owner == desk
