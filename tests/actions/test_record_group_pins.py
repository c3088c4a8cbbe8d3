"""The group commit of records, pinned edge by edge (the survivors of its mutation testing):
a group of one, a lease taken over under the same status, an answer that hands
its action to a person inside a group, the lock order of the targets, the attempt rows, the log
line of a lost lease, and the meeting point's answer when a recorder returns too few results.

``test_record_groups.py`` has the scenarios; these pin what its mutants showed unprotected.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from actions.engine.dispatcher import RecordGroups
from actions.engine.record import submission_record_group
from actions.engine.send import Sent
from actions.kinds import kind_for
from actions.kinds.refund.contract import RefundReceiver
from actions.models import Action, ActionStatus, Attempt
from actions.services import Actor
from tests.actions.test_dispatcher_fence import LATE_ANSWERS, Snapshot, claimed
from tests.actions.test_reconciliation import NO_LOOKUP_NO_KEYS, FakeReceiver
from tests.actions.test_record_groups import booking_fails_for, fake_sent, recorded_successfully, sent_success

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
S = ActionStatus


def sent(proposer: Actor, answer: str = "succeeded") -> Sent:
    action, attempt, token = claimed(proposer)
    return Sent(
        action=action,
        attempt_pk=attempt.pk,
        lease_token=token,
        answer=LATE_ANSWERS[answer](action),
        contract=kind_for(action.kind).contract(),
    )


def locking_reads(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT") and "FOR UPDATE" in q["sql"]]


def test_a_group_of_one_is_recorded_from_the_claims_copy_without_reading_its_row_back(
    agent_actor: Actor, dispatched: list[int]
) -> None:
    """An idle dispatcher records each answer alone, as ``submission_record`` with the claim's copy:
    the fenced UPDATE is the first write, and no row is read under lock."""
    one = sent(agent_actor)
    with CaptureQueriesContext(connection) as queries:
        assert submission_record_group(sent=[one]) == [S.SUCCEEDED]
    assert recorded_successfully(one)
    assert locking_reads(queries) == []


def test_in_a_group_a_lease_another_holder_took_under_the_same_status_is_lost(
    agent_actor: Actor, dispatched: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """The fence is the token, not the status: SUBMITTING under someone else's token (a retry's
    lease) is a lost lease, kept on the attempt only, with a log line naming the attempt."""
    kept, taken = sent(agent_actor), sent(agent_actor)
    other_token = uuid.uuid4()
    Action.objects.filter(pk=taken.action.pk).update(lease_token=other_token)
    before = Snapshot.of(taken.action.pk)

    assert submission_record_group(sent=[kept, taken]) == [S.SUCCEEDED, "lease_lost"]

    assert recorded_successfully(kept)
    assert Snapshot.of(taken.action.pk) == before
    lost_attempt = Attempt.objects.get(pk=taken.attempt_pk)
    assert (lost_attempt.held_lease, lost_attempt.outcome) == (False, "succeeded")
    assert lost_attempt.response == taken.answer.response_json()
    assert lost_attempt.finished_at == Attempt.objects.get(pk=kept.attempt_pk).finished_at, "one instant per group"
    assert (
        f"action_id={taken.action.action_id} lease lost before recording ({taken.answer.summary()}); "
        f"the answer is kept on attempt {taken.attempt_pk}"
    ) in caplog.messages


def test_in_a_group_each_answer_gets_its_own_result_in_the_order_given_whatever_the_lock_order(
    agent_actor: Actor, dispatched: list[int], finance: Any
) -> None:
    """The group records in the targets' lock order (lowest order first) but answers each caller
    in its own place; an answer that hands its action to a person reads the row under lock and
    picks the owner inside the group."""
    first, second, third = sent(agent_actor, "failed"), sent(agent_actor, "key_mismatch"), sent(agent_actor)
    order_pks = [one.action.order_id or 0 for one in (first, second, third)]
    assert order_pks == sorted(order_pks), "claimed in order: each later refund has a later order"

    with CaptureQueriesContext(connection) as queries:
        results = submission_record_group(sent=[third, second, first])

    assert results == [S.SUCCEEDED, S.NEEDS_REVIEW, S.FAILED_FINAL]
    escalated = Action.objects.get(pk=second.action.pk)
    assert escalated.owner == finance
    order_updates = [
        int(match.group(1))
        for q in queries.captured_queries
        if q["sql"].startswith('UPDATE "actions_order"')
        and (match := re.search(r'"actions_order"\."id" = \(?(\d+)', q["sql"]))
    ]
    assert order_updates == sorted(order_updates) and len(order_updates) == 2, order_updates
    attempts = {a.pk: a for a in Attempt.objects.filter(pk__in=[s.attempt_pk for s in (first, second, third)])}
    assert {attempts[s.attempt_pk].outcome for s in (first, second, third)} == {
        "failed_final",
        "needs_review",
        "succeeded",
    }
    assert all(attempt.held_lease is True for attempt in attempts.values())
    assert attempts[second.attempt_pk].error == second.answer.error_json()


def test_the_meeting_point_records_through_the_group_service_by_default(
    agent_actor: Actor, dispatched: list[int]
) -> None:
    one = sent(agent_actor)
    sizes: list[int] = []
    assert RecordGroups(on_group=sizes.append).record(one) == S.SUCCEEDED
    assert recorded_successfully(one)
    assert sizes == [1]


@pytest.mark.django_db(transaction=False)
def test_an_answer_the_recorder_gave_no_result_for_is_told_it_was_interrupted() -> None:
    sizes: list[int] = []
    records = RecordGroups(record=lambda group: [], on_group=sizes.append)
    with pytest.raises(RuntimeError, match=r"^the record was interrupted$"):
        records.record(fake_sent("a"))
    assert sizes == [1], "the group is counted even when it failed"
    assert records._recording is False and records._waiting == []


def test_a_recorder_stopped_by_a_shutdown_still_lets_the_next_answer_record() -> None:
    """A ``SystemExit`` (the dispatcher told to stop mid-record) is not an ``Exception``: it goes
    up as it is, and the recorder's place is still handed on, so the next answer records."""
    stops = [SystemExit(0)]

    def record(sent: Any) -> list[str | Exception]:
        if stops:
            raise stops.pop()
        return ["SUCCEEDED" for _ in sent]

    records = RecordGroups(record=record)
    with pytest.raises(SystemExit):
        records.record(fake_sent("a"))
    assert records._recording is False and records._waiting == []
    assert records.record(fake_sent("b")) == "SUCCEEDED"


def sent_timeout_from_a_receiver_that_cannot_be_asked(proposer: Actor) -> Sent:
    """A claimed refund whose call timed out, at a receiver with no lookup and no keys: only a
    person can find out what happened."""
    action, attempt, token = claimed(proposer)
    return Sent(
        action=action,
        attempt_pk=attempt.pk,
        lease_token=token,
        answer=LATE_ANSWERS["timed_out"](action),
        contract=RefundReceiver(FakeReceiver(NO_LOOKUP_NO_KEYS)).contract,
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_answer_recorded_alone_after_its_group_failed_keeps_its_receivers_contract(
    agent_actor: Actor, dispatched: list[int], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """After a group is rolled back, each answer is recorded alone, with what its receiver
    promised: a timeout from a receiver that can never be asked goes to a person at once, not to
    a reconciler that could only give up. The broken record's log line names it, word for word."""
    broken = sent_success(agent_actor)
    unaskable = sent_timeout_from_a_receiver_that_cannot_be_asked(agent_actor)
    booking_fails_for(broken, monkeypatch)

    results = submission_record_group(sent=[broken, unaskable])

    assert isinstance(results[0], RuntimeError) and results[1] == ActionStatus.NEEDS_REVIEW
    assert Action.objects.get(pk=unaskable.action.pk).status == ActionStatus.NEEDS_REVIEW
    assert (
        f"action_id={broken.action.action_id}: its record failed; its lease expires to reconciliation"
    ) in caplog.messages
    assert "a group of 2 records failed and was rolled back; recording each on its own" in caplog.messages


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_in_a_group_each_answer_is_recorded_with_its_receivers_contract(
    agent_actor: Actor, dispatched: list[int]
) -> None:
    """A timeout from a receiver that can never be asked goes to a person at once, in a group as
    alone; the other answer of the group is recorded as it said."""
    succeeded = sent_success(agent_actor)
    unaskable = sent_timeout_from_a_receiver_that_cannot_be_asked(agent_actor)

    assert submission_record_group(sent=[succeeded, unaskable]) == [ActionStatus.SUCCEEDED, ActionStatus.NEEDS_REVIEW]
    assert recorded_successfully(succeeded)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_group_reads_its_actions_once_and_records_each_from_the_claims_copy(
    agent_actor: Actor, dispatched: list[int]
) -> None:
    """The group locks its rows and reads their leases in one statement; each record then writes
    from the claim's copy, fenced on its token, without reading its row again."""
    group = [sent_success(agent_actor) for _ in range(3)]

    with CaptureQueriesContext(connection) as queries:
        assert submission_record_group(sent=group) == [ActionStatus.SUCCEEDED] * 3

    action_reads = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and 'FROM "actions_action"' in q["sql"]
    ]
    assert len(action_reads) == 1 and action_reads[0].endswith("FOR UPDATE"), action_reads
    assert all(recorded_successfully(one) for one in group)
