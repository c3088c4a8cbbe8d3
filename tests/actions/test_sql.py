"""The dispatch path's statements in plain SQL (actions.foundation.sql).

Each named statement must write each row's own values and nothing else, hold its
compare-and-set (a claim only on a row still AUTHORIZED, a record only on a row still
SUBMITTING under its own lease token: a stale token changes no row), and leave rows that read
back through the ORM exactly as the ORM would have written them. On PostgreSQL each is one
statement of one text for any number of rows.

The tests not marked ``postgres`` run on whichever database the suite runs on; on PostgreSQL
(CI), ``test_the_statements_hold_on_sqlite_too`` runs them once more on SQLite, the embedded
default of ``make start``, where the statements differ (actions.foundation.sql._Dialect).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from actions.engine.claim import submission_begin
from actions.foundation import sql
from actions.foundation.chain import chain_link
from actions.foundation.sql import trail_events
from actions.foundation.trail import Writes, action_transition
from actions.models import (
    Action,
    ActionEvent,
    ActionStatus,
    AgentWebhook,
    ArchivedActionEvent,
    Attempt,
    AttemptKind,
    Order,
)
from actions.models.actions import MaterialFieldChanged
from actions.services import Actor
from approvals.models import Approval, Decision
from tests.actions.test_reconciliation import AMOUNT, authorized_refund
from tests.factories import make_order, make_user

pytestmark = pytest.mark.django_db
S = ActionStatus
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_publish(dispatched: list[int]) -> list[int]:
    return dispatched


@contextmanager
def texts_sent() -> Iterator[list[str]]:
    """The SQL texts sent in the block, as sent: before the parameters are bound."""
    sent: list[str] = []

    def record(execute: Any, text: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(text)
        return execute(text, params, many, context)

    with connection.execute_wrapper(record):
        yield sent


def copies(actions: list[Action]) -> list[Action]:
    """The actions as a claim or a record has them: loaded from the database."""
    by_pk = Action.objects.in_bulk([action.pk for action in actions])
    return [by_pk[action.pk] for action in actions]


def claim_in_memory(action: Action, token: uuid.UUID | None = None) -> uuid.UUID:
    """The claim's transition, run in memory as the claim runs it (its row is not written)."""
    token = token or uuid.uuid4()
    now = timezone.now()
    action_transition(
        action=action,
        transition="begin_submission",
        actor=Actor.system("test"),
        writes=Writes(),
        now=now,
        lease_token=token,
        lease_expires_at=now + timedelta(minutes=5),
        started_at=now,
    )
    return token


def claimed(proposer: Actor, count: int) -> list[tuple[Action, uuid.UUID]]:
    """Claimed refunds: SUBMITTING under their leases, each with the claim's copy."""
    result = []
    for _ in range(count):
        claim = submission_begin(action_pk=authorized_refund(proposer).pk)
        assert claim.action is not None and claim.lease_token is not None
        result.append((claim.action, claim.lease_token))
    return result


def succeed_in_memory(action: Action, reference: str) -> None:
    action_transition(
        action=action,
        transition="record_success",
        actor=Actor.system("test"),
        writes=Writes(),
        provider_reference=reference,
    )


# --- the claim's compare-and-set ---------------------------------------------------------------------


def test_a_claim_writes_each_rows_own_lease_and_only_on_rows_still_authorized(agent_actor: Actor) -> None:
    actions = copies([authorized_refund(agent_actor) for _ in range(3)])
    tokens = [claim_in_memory(action) for action in actions]
    # Another writer moves the last one first (the claim locks its rows; this one is not locked).
    Action.objects.filter(pk=actions[2].pk).update(status=S.CANCELLED)

    with transaction.atomic():
        assert sql.actions_claim(actions) == 2

    for action, token in zip(actions[:2], tokens[:2], strict=True):
        stored = Action.objects.get(pk=action.pk)
        assert (stored.status, stored.lease_token, stored.attempt_count) == (S.SUBMITTING, token, 1)
        assert stored.lease_expires_at == action.lease_expires_at
        assert stored.first_attempt_at == stored.last_attempt_at == action.last_attempt_at
        assert stored.status_changed_at == action.status_changed_at
    moved = Action.objects.get(pk=actions[2].pk)
    assert (moved.status, moved.lease_token, moved.attempt_count) == (S.CANCELLED, None, 0)


def test_a_claimed_copy_saves_again_through_the_orm_from_its_new_status(agent_actor: Actor) -> None:
    (action,) = copies([authorized_refund(agent_actor)])
    claim_in_memory(action)
    with transaction.atomic():
        assert sql.actions_claim([action]) == 1
        # The copy knows its row is SUBMITTING now: the ORM's conditional save finds it.
        action_transition(
            action=action,
            transition="mark_unknown",
            actor=Actor.system("test"),
            next_reconcile_at=timezone.now(),
        )
    assert Action.objects.get(pk=action.pk).status == S.UNKNOWN


def test_a_material_change_is_never_written_and_nor_is_a_column_the_statement_does_not_own(
    agent_actor: Actor,
) -> None:
    first, second = copies([authorized_refund(agent_actor) for _ in range(2)])
    claim_in_memory(first)
    first.amount = first.amount + 1
    with pytest.raises(MaterialFieldChanged, match="amount"):
        sql.actions_claim([first])
    claim_in_memory(second)
    second.reconcile_failures = 3
    with pytest.raises(ValueError, match="reconcile_failures"):
        sql.actions_claim([second])
    stored = Action.objects.filter(pk__in=[first.pk, second.pk])
    assert {(a.status, a.amount, a.reconcile_failures) for a in stored} == {(S.AUTHORIZED, AMOUNT, 0)}


# --- the record's lease fence -----------------------------------------------------------------------


def test_a_record_writes_each_rows_own_outcome_and_a_stale_token_changes_no_row(agent_actor: Actor) -> None:
    (first, first_token), (stale, stale_token), (last, last_token) = claimed(agent_actor, 3)
    for action, reference in ((first, "re_first"), (stale, "re_stale"), (last, "re_last")):
        succeed_in_memory(action, reference)

    with transaction.atomic():
        assert sql.actions_record([(first, first_token), (stale, uuid.uuid4()), (last, last_token)]) == 2
        assert sql.actions_record([(stale, None)]) == 0  # no token holds no lease

    for action, reference in ((first, "re_first"), (last, "re_last")):
        stored = Action.objects.get(pk=action.pk)
        assert (stored.status, stored.provider_reference, stored.lease_token) == (S.SUCCEEDED, reference, None)
        assert stored.lease_expires_at is None and stored.status_changed_at == action.status_changed_at
    untouched = Action.objects.get(pk=stale.pk)
    assert (untouched.status, untouched.provider_reference, untouched.lease_token) == (S.SUBMITTING, "", stale_token)


def test_a_record_leaves_an_owner_set_meanwhile_and_an_escalation_writes_its_own(
    agent_actor: Actor, finance: Any
) -> None:
    """Finance may take a SUBMITTING action while its call is out: the record of a success
    writes the lease's columns, not the claim copy's owner over finance's. A record that hands
    its action to a person writes the owner it picked."""
    (succeeded, succeeded_token), (escalated, escalated_token) = claimed(agent_actor, 2)
    Action.objects.filter(pk=succeeded.pk).update(owner=finance)
    succeed_in_memory(succeeded, "re_1")
    reviewer = make_user("rita.reviewer", "finance")
    due = timezone.now() + timedelta(hours=4)
    action_transition(
        action=escalated,
        transition="escalate",
        actor=Actor.system("test"),
        writes=Writes(),
        owner=reviewer,
        due_at=due,
    )

    with transaction.atomic():
        assert sql.actions_record([(succeeded, succeeded_token), (escalated, escalated_token)]) == 2

    stored = Action.objects.get(pk=succeeded.pk)
    assert (stored.status, stored.owner_id) == (S.SUCCEEDED, finance.pk)
    stored = Action.objects.get(pk=escalated.pk)
    assert (stored.status, stored.owner_id, stored.due_at, stored.lease_token) == (
        S.NEEDS_REVIEW,
        reviewer.pk,
        due,
        None,
    )


# --- new rows and answers ------------------------------------------------------------------------------


def events_of(action: Action, count: int) -> list[ActionEvent]:
    now = timezone.now()
    return [
        ActionEvent(
            action=action,
            transition=f"step_{index}",
            from_state="AUTHORIZED",
            to_state="SUBMITTING",
            actor_kind="system",
            actor_label=f"system:test-{index}",
            reason=f"reason {index}",
            evidence={"index": index, "nested": [index, None], "quote": 'say "hi"'},
            created_at=now + timedelta(seconds=index),
        )
        for index in range(count)
    ]


def attempts_of(action: Action, count: int) -> list[Attempt]:
    now = timezone.now()
    return [
        Attempt(
            action=action,
            kind=AttemptKind.SUBMIT,
            lease_token=uuid.uuid4(),
            idempotency_key=f"key-{index}",
            request={"amount": index, "metadata": {"index": str(index)}},
            started_at=now + timedelta(seconds=index),
        )
        for index in range(count)
    ]


def test_events_and_attempts_are_inserted_with_their_own_values_each_given_its_key(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    before = set(ActionEvent.objects.values_list("pk", flat=True))
    events, attempts = events_of(action, 4), attempts_of(action, 3)

    sql.events_insert(events)
    sql.attempts_insert(attempts)

    assert all(event.pk is not None and not event._state.adding for event in events)
    assert sorted(ActionEvent.objects.exclude(pk__in=before).values_list("pk", flat=True)) == [e.pk for e in events]
    for event in events:
        row = ActionEvent.objects.get(pk=event.pk)
        assert (row.action_id, row.transition, row.actor_label, row.reason, row.evidence, row.created_at) == (
            action.pk,
            event.transition,
            event.actor_label,
            event.reason,
            event.evidence,
            event.created_at,
        )
        assert (row.actor_user_id, row.actor_agent_id) == (None, None)
    for attempt in attempts:
        stored = Attempt.objects.get(pk=attempt.pk)
        assert (stored.lease_token, stored.idempotency_key, stored.request, stored.started_at) == (
            attempt.lease_token,
            attempt.idempotency_key,
            attempt.request,
            attempt.started_at,
        )
        assert (stored.response, stored.error, stored.outcome, stored.held_lease, stored.finished_at) == (
            None,
            None,
            "",
            None,
            None,
        )


def test_only_new_rows_without_a_key_are_inserted(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    saved = events_of(action, 1)
    sql.events_insert(saved)
    count = ActionEvent.objects.count()
    for bad in (saved, [ActionEvent(pk=10**9, action=action)], attempts_of(action, 1)):
        with pytest.raises(ValueError, match="only new rows"):
            sql.events_insert([*events_of(action, 1), *bad])
    sql.events_insert([])  # nothing to write: no statement, no error
    assert ActionEvent.objects.count() == count


def test_answers_are_written_each_on_its_own_attempt(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    first, second, other = attempts_of(action, 3)
    sql.attempts_insert([first, second, other])
    now = timezone.now()
    answers = [
        Attempt(
            pk=first.pk, response={"id": "re_1"}, error=None, outcome="succeeded", held_lease=True, finished_at=now
        ),
        Attempt(
            pk=second.pk,
            response=None,
            error={"message": 'timed "out"'},
            outcome="unknown",
            held_lease=False,
            finished_at=now + timedelta(seconds=1),
        ),
    ]

    assert sql.attempt_answers(answers) == 2

    for answer in answers:
        row = Attempt.objects.get(pk=answer.pk)
        assert [getattr(row, name) for name in sql.ATTEMPT_ANSWER_FIELDS] == [
            getattr(answer, name) for name in sql.ATTEMPT_ANSWER_FIELDS
        ]
        assert row.request == (first if answer.pk == first.pk else second).request  # not touched
    assert Attempt.objects.get(pk=other.pk).finished_at is None


# --- reads --------------------------------------------------------------------------------------------


def test_the_claimable_read_gives_the_oldest_authorized_actions_loaded_as_the_orm_loads_them(
    agent_actor: Actor,
) -> None:
    actions = [authorized_refund(agent_actor) for _ in range(4)]
    now = timezone.now()
    for age, action in zip((40, 30, 20, 10), actions, strict=True):
        Action.objects.filter(pk=action.pk).update(status_changed_at=now - timedelta(seconds=age))
    Action.objects.filter(pk=actions[0].pk).update(status=S.CANCELLED)
    assert agent_actor.agent is not None
    hook = AgentWebhook.objects.create(agent=agent_actor.agent, url="https://hooks.example.test/a", secret="s" * 32)

    with transaction.atomic():
        loaded = sql.claimable_actions(limit=2)
    assert [a.pk for a in loaded] == [actions[1].pk, actions[2].pk]
    by_orm = Action.objects.in_bulk([a.pk for a in loaded])
    for action in loaded:  # every column as the ORM loads it: JSON as dicts, money as Decimal
        assert type(action) is Action and action.changed_fields() == []
        assert isinstance(action.payload, dict) and isinstance(action.amount, Decimal)
        expected = by_orm[action.pk]
        assert [getattr(action, f.attname) for f in Action._meta.concrete_fields] == [
            getattr(expected, f.attname) for f in Action._meta.concrete_fields
        ]
        assert action.agent_webhook_pk == hook.pk  # type: ignore[attr-defined]

    AgentWebhook.objects.filter(pk=hook.pk).update(is_active=False)
    with transaction.atomic():
        before = sql.claimable_actions(limit=10, authorized_before=now - timedelta(seconds=15))
        among = sql.claimable_actions(limit=10, action_pks=[actions[0].pk, actions[3].pk])
    assert [a.pk for a in before] == [actions[1].pk, actions[2].pk]
    assert [(a.pk, a.agent_webhook_pk) for a in among] == [(actions[3].pk, None)]  # type: ignore[attr-defined]


def test_the_approvals_in_force_are_each_actions_newest_approve_row(agent_actor: Actor) -> None:
    from approvals.policy import approvals_in_force

    first, second, other = (authorized_refund(agent_actor) for _ in range(3))
    old = Approval.objects.get(action=first)
    columns = {f.attname: getattr(old, f.attname) for f in Approval._meta.concrete_fields if not f.primary_key}
    newer = Approval.objects.create(**{**columns, "note": "decided again"})
    Approval.objects.create(**{**columns, "decision": Decision.REJECT, "note": "a later reject"})

    in_force = approvals_in_force(action_pks=[first.pk, second.pk])

    assert {pk: a.pk for pk, a in in_force.items()} == {
        first.pk: newer.pk,
        second.pk: Approval.objects.get(action=second).pk,
    }
    assert other.pk not in in_force and approvals_in_force(action_pks=[]) == {}
    assert in_force[first.pk].note == "decided again" and in_force[first.pk].amount == old.amount


def test_an_agents_active_webhook_is_read_by_its_key(agent_actor: Actor) -> None:
    assert agent_actor.agent is not None
    agent = agent_actor.agent
    assert sql.active_webhook(agent_id=agent.pk) is None
    hook = AgentWebhook.objects.create(agent=agent, url="https://hooks.example.test/a", secret="s" * 32)
    assert sql.active_webhook(agent_id=agent.pk) == hook.pk
    AgentWebhook.objects.filter(pk=hook.pk).update(is_active=False)
    assert sql.active_webhook(agent_id=agent.pk) is None


def test_the_records_lock_reads_each_actions_status_lease_and_webhook(agent_actor: Actor) -> None:
    (submitting, token), (other, _) = claimed(agent_actor, 2)
    assert agent_actor.agent is not None
    hook = AgentWebhook.objects.create(agent=agent_actor.agent, url="https://hooks.example.test/a", secret="s" * 32)
    Action.objects.filter(pk=other.pk).update(status=S.UNKNOWN, lease_token=None)

    with transaction.atomic():
        locked = sql.actions_lock_for_record(action_pks=[submitting.pk, other.pk, 10**9])

    assert locked == {
        submitting.pk: sql.LockedForRecord(S.SUBMITTING, token, agent_actor.agent.pk, hook.pk),
        other.pk: sql.LockedForRecord(S.UNKNOWN, None, agent_actor.agent.pk, hook.pk),
    }


# --- a refund's money on its order ------------------------------------------------------------------


def money(order: Order) -> tuple[Decimal, Decimal, int]:
    order.refresh_from_db()
    return order.reserved_amount, order.refunded_amount, order.version


def test_the_orders_money_moves_on_its_own_row_and_a_reservation_holds_its_conditions() -> None:
    first, second = make_order(captured="100.00"), make_order(captured="100.00")
    version = first.version

    assert sql.order_reserve(order_pk=first.pk, version=version + 1, amount=Decimal("10.00")) is False
    assert sql.order_reserve(order_pk=first.pk, version=version, amount=Decimal("100.01")) is False
    assert money(first) == (Decimal("0"), Decimal("0"), version)

    assert sql.order_reserve(order_pk=first.pk, version=version, amount=Decimal("60.00")) is True
    assert money(first) == (Decimal("60.00"), Decimal("0"), version + 1)
    # 40.01 no longer fits beside the 60.00 reserved, at the new version either.
    assert sql.order_reserve(order_pk=first.pk, version=version + 1, amount=Decimal("40.01")) is False

    assert sql.order_book(order_pk=first.pk, amount=Decimal("30.00")) == 1
    assert sql.order_release(order_pk=first.pk, amount=Decimal("5.50")) == 1
    assert money(first) == (Decimal("24.50"), Decimal("30.00"), version + 1)
    assert money(second) == (Decimal("0"), Decimal("0"), second.version)


# --- one statement of one text for any number of rows (PostgreSQL) -------------------------------------


@pytest.mark.postgres
def test_each_statement_is_one_statement_of_one_text_for_any_number_of_rows(agent_actor: Actor, settings: Any) -> None:
    settings.AUTO_APPROVAL_AGENT_DAILY_AMOUNTS = {"EUR": Decimal("10000")}  # one agent proposes them all
    texts: dict[str, set[str]] = {}
    for count in (1, 4):
        action = authorized_refund(agent_actor)
        authorized = copies([authorized_refund(agent_actor) for _ in range(count)])
        for one in authorized:
            claim_in_memory(one)
        records = claimed(agent_actor, count)
        for one, _ in records:
            succeed_in_memory(one, "re_x")
        events, attempts = events_of(action, count), attempts_of(action, count)
        runs: list[tuple[str, Callable[[], Any]]] = [
            ("claim", partial(sql.actions_claim, authorized)),
            ("record", partial(sql.actions_record, records)),
            ("events", partial(sql.events_insert, events)),
            ("attempts", partial(sql.attempts_insert, attempts)),
            ("answers", partial(sql.attempt_answers, attempts)),
            ("approvals", partial(sql.approve_rows, action_pks=[a.pk for a in authorized])),
            ("lock", partial(sql.actions_lock_for_record, action_pks=[a.pk for a, _ in records])),
        ]
        with transaction.atomic():
            for name, run in runs:
                with texts_sent() as sent:
                    run()
                assert len(sent) == 1, (name, sent)
                texts.setdefault(name, set()).update(sent)
    for name, each in texts.items():
        assert len(each) == 1, (name, each)
        # The arrays go in PostgreSQL's binary format (console.settings binds on the server).
        (text,) = each
        assert "unnest(%b::" in text and "unnest(%s" not in text, (name, text)


def test_the_archive_moves_an_actions_events_whole_and_its_chain_continues_from_there(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    before = list(ActionEvent.objects.filter(action=action).order_by("id").values(*trail_events.TRAIL_EVENT_COLUMNS))
    assert len(before) == 2
    triggers = sqlite_triggers() if connection.vendor == "sqlite" else []
    with transaction.atomic():
        assert trail_events.events_archive(action_pks=[action.pk]) == (2, 2)
    # The same rows, keys, hashes and transaction ids, in the archive only.
    moved = ArchivedActionEvent.objects.filter(action=action).order_by("id").values(*trail_events.TRAIL_EVENT_COLUMNS)
    assert list(moved) == before
    assert not ActionEvent.objects.filter(action=action).exists()
    assert trail_events.event_chain_heads(action_pks=[action.pk]) == {
        action.pk: (2, before[-1]["chain_hash"])
    }
    with transaction.atomic():
        locked = Action.objects.select_for_update().get(pk=action.pk)
        event = action_transition(action=locked, transition="cancel", actor=Actor.system("test"), reason="x")
    assert event.sequence == 3
    assert event.chain_hash == chain_link(before[-1]["chain_hash"], event.content_hash)
    # Outside the archive's own statements the guard is as it was: on SQLite the archive dropped
    # the delete trigger for its transaction and made it again.
    if connection.vendor == "sqlite":
        assert sqlite_triggers() == triggers
    else:
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM actions_actionevent WHERE id = %s", [event.pk])


def sqlite_triggers() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
        return [name for (name,) in cursor.fetchall()]


@pytest.mark.django_db(transaction=True)
def test_the_archive_moves_events_only_inside_its_callers_transaction(agent_actor: Actor) -> None:
    action = authorized_refund(agent_actor)
    with pytest.raises(RuntimeError, match="transaction"):
        trail_events.events_archive(action_pks=[action.pk])
    assert ActionEvent.objects.filter(action=action).count() == 2


@pytest.mark.postgres
@pytest.mark.slow
def test_the_statements_hold_on_sqlite_too(tmp_path: Path) -> None:
    """The same tests, on SQLite (DATABASE_URL unset: the embedded default), in a process of
    their own: the suite's database is PostgreSQL here."""
    env = {name: value for name, value in os.environ.items() if name != "DATABASE_URL"}
    env["CONSOLE_DATA_DIR"] = str(tmp_path)
    env["CI"] = "false"  # the postgres tests skip, as they do on SQLite outside CI
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-m", "not postgres", __file__],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1], done.stdout[-2000:]
