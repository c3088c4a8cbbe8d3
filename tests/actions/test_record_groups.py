"""The dispatcher's group commit of records: answers that come back together are
recorded in one transaction, each still under its own lease fence (invariant 3), and one bad
record holds up only itself.

``submission_record_group`` is the service; ``RecordGroups`` is the dispatcher threads' meeting
point that decides who records which answers. The real-process crash matrix with the dispatcher
(tests/faults/test_dispatcher_crashes.py) runs with grouping on.
"""

from __future__ import annotations

import sys
import threading
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from actions.engine.dispatcher import RecordGroups
from actions.engine.record import submission_record_group
from actions.engine.send import Sent
from actions.kinds import kind_for
from actions.models import Action, ActionEvent, ActionStatus, AgentWebhook, AgentWebhookDelivery, Attempt, Order
from actions.services import Actor
from tests.actions.test_dispatcher_fence import LATE_ANSWERS, Snapshot, claimed, expire_lease
from tests.actions.test_reconciliation import AMOUNT
from tests.factories import make_agent
from tests.processes import wait_until

S = ActionStatus


def sent_success(proposer: Actor) -> Sent:
    """A claimed refund whose receiver answered "succeeded", not yet recorded."""
    action, attempt, token = claimed(proposer)
    return Sent(
        action=action,
        attempt_pk=attempt.pk,
        lease_token=token,
        answer=LATE_ANSWERS["succeeded"](action),
        contract=kind_for(action.kind).contract(),
    )


def booking_fails_for(broken: Sent, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refund kind's booking raises for this one answer's action and works for the others."""
    refund = kind_for(broken.action.kind)
    book = refund.book_success

    def book_fails_for_one(action: Action) -> None:
        if action.pk == broken.action.pk:
            raise RuntimeError("the order row could not be booked")
        book(action)

    monkeypatch.setattr(type(refund), "book_success", staticmethod(book_fails_for_one))


def recorded_successfully(sent: Sent) -> bool:
    action = Action.objects.get(pk=sent.action.pk)
    order = Order.objects.get(pk=action.order_id)
    attempt = Attempt.objects.get(pk=sent.attempt_pk)
    successes = ActionEvent.objects.filter(action=action, transition="record_success").count()
    return (
        action.status == S.SUCCEEDED
        and (order.refunded_amount, order.reserved_amount) == (AMOUNT, 0)
        and attempt.held_lease is True
        and successes == 1
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_answers_recorded_together_share_one_commit_each_under_its_own_lease(
    agent_actor: Actor, dispatched: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant 3 inside a group: the middle answer's lease was swept meanwhile, so it goes on its
    attempt only and leaves the action and its money alone; the two others are recorded."""
    lost = sent_success(agent_actor)
    expire_lease(Action.objects.get(pk=lost.action.pk))  # before the others hold a lease to sweep
    first, last = sent_success(agent_actor), sent_success(agent_actor)
    before = Snapshot.of(lost.action.pk)

    with CaptureQueriesContext(connection) as queries:
        results = submission_record_group(sent=[first, lost, last])

    assert results == [S.SUCCEEDED, "lease_lost", S.SUCCEEDED]
    assert recorded_successfully(first) and recorded_successfully(last)
    assert Snapshot.of(lost.action.pk) == before
    assert Attempt.objects.get(pk=lost.attempt_pk).held_lease is False
    # One transaction: the group was not rolled back to records of their own, and the agent's
    # webhook was read once for the group (once per record otherwise).
    assert not any("rolled back" in message for message in caplog.messages)
    sql = [query["sql"] for query in queries.captured_queries]
    hook_reads = [s for s in sql if 'FROM "actions_agentwebhook"' in s]
    assert len(hook_reads) == 1, "the agent's webhook was read once per record, not once per group"
    # ... and in the statement that locks the group's actions, not in one of its own.
    assert hook_reads[0].startswith("SELECT") and hook_reads[0].endswith("FOR UPDATE"), hook_reads[0]
    # Both records' audit events in one INSERT, inside the group's transaction.
    event_inserts = [s for s in sql if s.startswith('INSERT INTO "actions_actionevent"')]
    assert len(event_inserts) == 1
    # Both transitions in one UPDATE, fenced on each lease; all three answers on their attempts
    # in one UPDATE (the lost one's too).
    assert len([s for s in sql if s.startswith('UPDATE "actions_action"')]) == 1
    assert len([s for s in sql if s.startswith('UPDATE "actions_attempt"')]) == 1
    assert ActionEvent.objects.filter(action__in=[first.action, last.action], transition="record_success").count() == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_group_of_two_agents_writes_outbox_rows_only_for_the_one_whose_webhook_is_active(
    agent_actor: Actor, agent_owner: Any, dispatched: list[int]
) -> None:
    """The group learns each agent's webhook from the statement that locks its actions: the
    agent whose webhook is active hears of each success, the one whose webhook is switched off
    of none, in the same group."""
    assert agent_actor.agent is not None
    quiet = make_agent(agent_owner, name="quiet-bot")
    AgentWebhook.objects.create(agent=agent_actor.agent, url="https://hooks.example.test/on", secret="s" * 32)
    AgentWebhook.objects.create(agent=quiet, url="https://hooks.example.test/off", secret="s" * 32, is_active=False)
    heard, unheard = sent_success(agent_actor), sent_success(Actor.for_agent(quiet))
    AgentWebhookDelivery.objects.all().delete()  # the claims' rows: only the records' matter here

    assert submission_record_group(sent=[heard, unheard]) == [S.SUCCEEDED, S.SUCCEEDED]

    succeeded = AgentWebhookDelivery.objects.filter(event_type="action.succeeded")
    assert list(succeeded.values_list("action_id", "agent_id")) == [(heard.action.pk, agent_actor.agent.pk)]
    assert not AgentWebhookDelivery.objects.filter(action_id=unheard.action.pk).exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_record_that_fails_rolls_back_its_group_and_the_others_are_recorded_alone(
    agent_actor: Actor, dispatched: list[int], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    first, broken, last = (sent_success(agent_actor) for _ in range(3))
    booking_fails_for(broken, monkeypatch)

    results = submission_record_group(sent=[first, broken, last])

    assert results[0] == S.SUCCEEDED and results[2] == S.SUCCEEDED
    assert isinstance(results[1], RuntimeError)
    # Each good answer is recorded once: nothing of the rolled-back group survived beside it.
    assert recorded_successfully(first) and recorded_successfully(last)
    # The bad one keeps its lease, to expire to UNKNOWN and reconciliation as after a crash.
    stored = Action.objects.get(pk=broken.action.pk)
    assert (stored.status, stored.lease_token) == (S.SUBMITTING, broken.lease_token)
    assert Attempt.objects.get(pk=broken.attempt_pk).finished_at is None
    assert any("a group of 3 records failed and was rolled back" in m for m in caplog.messages)
    assert any(f"action_id={broken.action.action_id}: its record failed" in m for m in caplog.messages)


# --- who records which answers (no database) ------------------------------------------------------


def fake_sent(name: str) -> Any:
    return SimpleNamespace(name=name, action=SimpleNamespace(pk=name), lease_token=uuid.uuid4())


def test_answers_that_arrive_while_a_group_is_recorded_make_the_next_group_together() -> None:
    release_first = threading.Event()
    groups: list[list[str]] = []

    def record(sent: Any) -> list[str | Exception]:
        names = [one.name for one in sent]
        groups.append(names)
        if names == ["a"]:
            assert release_first.wait(10)
        return [f"recorded {name}" for name in names]

    records = RecordGroups(record=record)
    results: dict[str, str] = {}

    def answer(name: str) -> None:
        results[name] = records.record(fake_sent(name))

    a = threading.Thread(target=answer, args=("a",))
    a.start()
    wait_until(lambda: groups == [["a"]], timeout=10, what="the first answer being recorded")
    others = [threading.Thread(target=answer, args=(name,)) for name in ("b", "c")]
    for thread in others:
        thread.start()
    wait_until(lambda: len(records._waiting) == 2, timeout=10, what="two answers waiting for the recorder")
    assert results == {}, "an answer returned before it was recorded"
    release_first.set()
    for thread in (a, *others):
        thread.join(timeout=10)

    assert groups[0] == ["a"] and sorted(groups[1]) == ["b", "c"] and len(groups) == 2
    assert results == {"a": "recorded a", "b": "recorded b", "c": "recorded c"}


def test_an_answer_whose_record_failed_raises_in_its_own_thread_and_the_next_group_still_runs() -> None:
    sizes: list[int] = []

    def record(sent: Any) -> list[str | Exception]:
        return [RuntimeError(f"{one.name} failed") if one.name == "bad" else "SUCCEEDED" for one in sent]

    records = RecordGroups(record=record, on_group=sizes.append)
    with pytest.raises(RuntimeError, match="bad failed"):
        records.record(fake_sent("bad"))
    assert records.record(fake_sent("good")) == "SUCCEEDED"
    assert sizes == [1, 1]


def test_a_recorder_that_raises_hands_the_error_to_every_answer_of_its_group() -> None:
    def record(sent: Any) -> list[str | Exception]:
        raise RuntimeError("the recorder itself broke")

    records = RecordGroups(record=record)
    with pytest.raises(RuntimeError, match="the recorder itself broke"):
        records.record(fake_sent("a"))
    assert records._recording is False, "the next answer would wait for ever"


# --- handing an answer over to the recorder at work (P-d) -------------------------------


def name_of(sent: Any) -> str:
    """The name ``fake_sent`` gave an answer."""
    return str(sent.name)


class HeldRecorder:
    """A record function whose first group is held until ``release``; every group is listed."""

    def __init__(self, fail: str | None = None) -> None:
        self.groups: list[list[str]] = []
        self.release = threading.Event()
        self.fail = fail

    def __call__(self, sent: Any) -> list[str | Exception]:
        names = [one.name for one in sent]
        self.groups.append(names)
        if len(self.groups) == 1:
            assert self.release.wait(10)
        return [RuntimeError(f"{name} failed") if name == self.fail else f"recorded {name}" for name in names]


class Answers:
    """Pool threads handing answers named "a", "b"... to ``enter`` (``RecordGroups.hand_over`` or
    ``record``); what each got back, by name."""

    def __init__(self, enter: Any) -> None:
        self.enter = enter
        self.results: dict[str, str | None] = {}

    def give(self, name: str) -> None:
        self.results[name] = self.enter(fake_sent(name))

    def in_thread(self, name: str) -> threading.Thread:
        thread = threading.Thread(target=self.give, args=(name,))
        thread.start()
        return thread

    def first_held(self, recorder: HeldRecorder) -> threading.Thread:
        """Answer "a" in a thread of its own, which becomes the recorder and is held in its first
        group (until ``recorder.release``)."""
        thread = self.in_thread("a")
        wait_until(lambda: recorder.groups == [["a"]], timeout=10, what="the first answer being recorded")
        return thread


def test_an_answer_left_with_the_recorder_at_work_frees_its_thread_and_is_reported_once_committed() -> None:
    """A thread whose call returned while another records goes on to its next call instead of
    waiting for the commit (in-flight calls stay at the concurrency); the recorder records its
    answer in the next group, reports it after that commit, and returns only when none waits."""
    recorder = HeldRecorder()
    reported: list[tuple[str, str | Exception, list[list[str]]]] = []
    records = RecordGroups(
        record=recorder,
        on_recorded=lambda sent, result: reported.append((name_of(sent), result, list(recorder.groups))),
        backlog=2,
    )
    answers = Answers(records.hand_over)
    results = answers.results
    a = answers.first_held(recorder)
    answers.give("b")
    answers.give("c")
    # Both left at once, not recorded yet, and nobody reported yet.
    assert results == {"b": None, "c": None}
    assert reported == [] and len(records._waiting) == 2
    recorder.release.set()
    a.join(timeout=10)

    assert results == {"a": "recorded a", "b": None, "c": None}
    assert recorder.groups == [["a"], ["b", "c"]]
    # Reported after their own group was recorded, never the recorder's own answer.
    assert reported == [
        ("b", "recorded b", [["a"], ["b", "c"]]),
        ("c", "recorded c", [["a"], ["b", "c"]]),
    ]
    assert records._recording is False and records._waiting == []


def test_with_the_backlog_full_an_answer_waits_for_its_own_commit() -> None:
    """Backpressure: a slow database slows the calls down instead of piling answers up."""
    recorder = HeldRecorder()
    reported: list[str] = []
    records = RecordGroups(record=recorder, on_recorded=lambda sent, result: reported.append(name_of(sent)), backlog=1)
    answers = Answers(records.hand_over)
    results = answers.results
    a = answers.first_held(recorder)
    answers.give("b")  # the backlog's one place
    c = answers.in_thread("c")
    wait_until(lambda: len(records._waiting) == 2, timeout=10, what="the answer over the backlog waiting")
    assert "c" not in results, "an answer over the backlog left before its commit"
    recorder.release.set()
    for thread in (a, c):
        thread.join(timeout=10)

    assert results == {"a": "recorded a", "b": None, "c": "recorded c"}
    assert recorder.groups == [["a"], ["b", "c"]]
    assert reported == ["b"], "only the answer whose thread left is reported"


def test_a_record_that_failed_after_its_thread_left_is_reported_as_its_error() -> None:
    recorder = HeldRecorder(fail="b")
    reported: list[tuple[str, str | Exception]] = []
    records = RecordGroups(
        record=recorder, on_recorded=lambda sent, result: reported.append((name_of(sent), result)), backlog=4
    )
    a = Answers(records.hand_over).first_held(recorder)
    assert records.hand_over(fake_sent("b")) is None
    recorder.release.set()
    a.join(timeout=10)

    [(name, result)] = reported
    assert name == "b" and isinstance(result, RuntimeError) and str(result) == "b failed"


def test_a_report_that_raises_stops_neither_the_recorder_nor_the_next_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = HeldRecorder()

    def report(sent: Any, result: str | Exception) -> None:
        raise RuntimeError("the stats broke")

    records = RecordGroups(record=recorder, on_recorded=report, backlog=4)
    a = Answers(records.hand_over).first_held(recorder)
    records.hand_over(fake_sent("b"))
    records.hand_over(fake_sent("c"))
    recorder.release.set()
    a.join(timeout=10)

    assert recorder.groups == [["a"], ["b", "c"]]
    assert records._recording is False, "the next answer would wait for ever"
    assert caplog.messages.count("dispatcher: reporting a recorded answer failed") == 2
    assert records.hand_over(fake_sent("d")) == "recorded d"


def test_without_anyone_to_report_to_an_answer_always_waits_for_its_commit() -> None:
    """``record`` (and ``hand_over`` with no ``on_recorded``) never leave an answer behind: with
    nobody told of its result, a thread that left would lose it."""
    recorder = HeldRecorder()
    records = RecordGroups(record=recorder, backlog=4)
    a = Answers(records.record).first_held(recorder)
    answers = Answers(records.hand_over)
    results = answers.results
    b = answers.in_thread("b")
    wait_until(lambda: len(records._waiting) == 1, timeout=10, what="the second answer waiting")
    assert results == {}
    recorder.release.set()
    for thread in (a, b):
        thread.join(timeout=10)
    assert results == {"b": "recorded b"}


def test_an_answer_handed_over_as_the_recorder_leaves_is_recorded_not_stranded() -> None:
    """The recorder's last look (nothing waits) and its giving up the role are one hold of the
    lock. Were they two, an answer handed over in between would find a recorder still "at work",
    leave, and wait unrecorded until some later answer came along (for ever, at a shutdown)."""
    recorder = HeldRecorder()
    recorder.release.set()
    records = RecordGroups(record=recorder, on_recorded=lambda sent, result: None, backlog=4)
    between: list[str | None] = []

    class HandsOverAfterTheLastLook(type(records._changed)):  # type: ignore[misc]
        def __exit__(self, *exc: Any) -> None:
            super().__exit__(*exc)
            last_look = sys._getframe(1).f_code.co_name == "_record_until_none_waits"
            if last_look and recorder.groups == [["a"]] and not between:
                between.append(None)  # once
                between[0] = records.hand_over(fake_sent("b"))

    records._changed = HandsOverAfterTheLastLook()
    assert records.record(fake_sent("a")) == "recorded a"

    assert between == ["recorded b"], "the answer was left with a recorder that was leaving"
    assert recorder.groups == [["a"], ["b"]]
    assert records._waiting == [] and records._recording is False


# --- a recorder thread of its own (P-d) -------------------------------------------------


class NamedRecorder(HeldRecorder):
    """A ``HeldRecorder`` that also notes which thread recorded each group."""

    def __init__(self, fail: str | None = None) -> None:
        super().__init__(fail)
        self.threads: list[str] = []

    def __call__(self, sent: Any) -> list[str | Exception]:
        self.threads.append(threading.current_thread().name)
        return super().__call__(sent)


def test_with_a_recorder_thread_every_answer_is_left_at_once_and_recorded_there() -> None:
    """No calling thread records: even the first answer, with nobody recording, is left (its
    thread goes back to calling), recorded by the recorder thread and reported after its commit."""
    recorder = NamedRecorder()
    reported: list[tuple[str, str | Exception, int]] = []
    records = RecordGroups(
        record=recorder,
        on_recorded=lambda sent, result: reported.append((name_of(sent), result, len(recorder.groups))),
        backlog=3,
    )
    records.start_recorder()
    try:
        assert records.hand_over(fake_sent("a")) is None, "the first answer waited for its commit"
        wait_until(lambda: recorder.groups == [["a"]], timeout=10, what="the recorder thread taking it")
        assert records.hand_over(fake_sent("b")) is None
        assert records.hand_over(fake_sent("c")) is None
        assert reported == [], "reported before its commit"
        recorder.release.set()
        wait_until(lambda: len(reported) == 3, timeout=10, what="the three reports")
    finally:
        records.stop_recorder(timeout=10)

    assert recorder.groups == [["a"], ["b", "c"]]
    assert set(recorder.threads) == {"dispatch-recorder"}
    assert reported == [("a", "recorded a", 1), ("b", "recorded b", 2), ("c", "recorded c", 2)]


def test_with_a_recorder_thread_record_and_a_full_backlog_still_wait_for_their_commit() -> None:
    recorder = NamedRecorder()
    reported: list[str] = []
    records = RecordGroups(record=recorder, on_recorded=lambda sent, result: reported.append(name_of(sent)), backlog=1)
    records.start_recorder()
    try:
        assert records.hand_over(fake_sent("a")) is None
        wait_until(lambda: recorder.groups == [["a"]], timeout=10, what="the recorder thread taking it")
        answers = Answers(records.hand_over)
        answers.give("b")  # the backlog's one place
        c = answers.in_thread("c")
        waits = Answers(records.record)
        d = waits.in_thread("d")
        wait_until(lambda: len(records._waiting) == 3, timeout=10, what="c and d waiting")
        assert "c" not in answers.results and waits.results == {}
        recorder.release.set()
        for thread in (c, d):
            thread.join(timeout=10)
    finally:
        records.stop_recorder(timeout=10)

    assert answers.results == {"b": None, "c": "recorded c"} and waits.results == {"d": "recorded d"}
    assert reported == ["a", "b"], "only the answers whose threads left are reported"
    assert set(recorder.threads) == {"dispatch-recorder"}


def test_stopping_the_recorder_thread_records_what_waits_and_later_answers_record_themselves() -> None:
    recorder = NamedRecorder()
    reported: list[str] = []
    records = RecordGroups(record=recorder, on_recorded=lambda sent, result: reported.append(name_of(sent)), backlog=4)
    records.start_recorder()
    thread = records._recorder
    assert thread is not None
    records.hand_over(fake_sent("a"))
    wait_until(lambda: recorder.groups == [["a"]], timeout=10, what="the recorder thread taking it")
    records.hand_over(fake_sent("b"))
    stopping = threading.Thread(target=records.stop_recorder)
    stopping.start()
    recorder.release.set()
    stopping.join(timeout=10)

    assert not thread.is_alive() and not stopping.is_alive()
    assert recorder.groups == [["a"], ["b"]] and reported == ["a", "b"]
    assert records._recorder is None and records._waiting == []
    # Nobody records for the next answer any more: its own thread does, and waits for it.
    assert records.hand_over(fake_sent("e")) == "recorded e"
    assert recorder.threads[-1] == threading.current_thread().name


def test_a_recorder_thread_that_dies_leaves_its_role_to_the_next_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Were the role kept by a dead thread, every later answer would wait for ever. The group it
    had taken is lost, as at a crash: those leases expire to reconciliation."""
    recorder = NamedRecorder()
    recorder.release.set()
    records = RecordGroups(record=recorder, on_recorded=lambda sent, result: None, backlog=4)

    def dies(group: Any) -> None:
        raise SystemExit("the recorder thread ended")

    monkeypatch.setattr(records, "_record_group", dies)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the thread's end, unprinted
    records.start_recorder()
    thread = records._recorder
    assert thread is not None
    assert records.hand_over(fake_sent("a")) is None
    thread.join(timeout=10)
    assert records._recorder is None and records._recording is False
    monkeypatch.undo()

    assert records.hand_over(fake_sent("b")) == "recorded b"
    assert recorder.groups == [["b"]], "the answer the dead thread took is lost, as at a crash"
