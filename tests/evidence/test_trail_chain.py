"""The audit trail's hash chain and checkpoints catch a rewritten trail (docs/evidence.md).

Invariant 9 says every state change writes an append-only event; these tests play the database's
owner, who can lift the append-only triggers, and check that ``manage.py verify_trail`` names
each kind of rewrite at the event it touched, and exits 1.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import mail
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from actions import tasks
from actions.evidence.checkpoints import checkpoint_log_read, checkpoint_make
from actions.evidence.verify import trail_check
from actions.foundation import sql
from actions.foundation.chain import EVENT_ROW_FIELDS, chain_link, content_hash, row_event_content, sha256_hex
from actions.foundation.db_guards import backfill_trail_hashes
from actions.foundation.trail import event_content_of
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, Checkpoint
from actions.services import Actor, action_cancel
from tests.factories import make_order, make_request

pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True)
def trail_settings(settings: Any, tmp_path: Path) -> None:
    settings.TRAIL_SIGNING_KEY = "a-test-key-of-enough-length-0123456789"
    settings.TRAIL_CHECKPOINT_LOG = tmp_path / "checkpoints.jsonl"
    settings.NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def proposed_refund(proposer: Actor) -> Action:
    """A refund proposed and auto-approved: two events."""
    order = make_order(captured="100.00")
    request = make_request(order)
    return action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount="10.00",
        currency="EUR",
        reason_code="damaged",
        proposer=proposer,
    ).action


def cancelled_refund(proposer: Actor) -> Action:
    """A refund proposed, auto-approved and cancelled: three events, and closed."""
    action = proposed_refund(proposer)
    return action_cancel(action_pk=action.pk, actor=Actor.system("test"), reason="not needed")


def three_event_actions(proposer: Actor, count: int = 3) -> list[Action]:
    """Refunds proposed and auto-approved (two events), then cancelled (a third)."""
    return [cancelled_refund(proposer) for _ in range(count)]


def events_of(action: Action) -> list[ActionEvent]:
    return list(ActionEvent.objects.filter(action=action).order_by("sequence"))


@pytest.fixture
def as_owner() -> Iterator[Callable[[str, list[Any]], None]]:
    """Run SQL as the database's owner would, with the append-only triggers lifted (for this
    test's transaction only: its rollback restores them)."""
    with connection.cursor() as cursor:
        # The test's inserts left deferred foreign-key checks pending, which an ALTER TABLE
        # refuses to run over: run them now.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE actions_actionevent DISABLE TRIGGER USER")

    def run(statement: str, params: list[Any]) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(statement, params)

    yield run


def checkpoint_after_commits() -> Checkpoint | None:
    """The next checkpoint, once every transaction that wrote an event so far has ended: the
    PostgreSQL cluster is shared, and another session's open transaction holds the cut back
    (actions.evidence.checkpoints). Polled, with a deadline."""
    newest = ActionEvent.objects.order_by("-txid").values_list("txid", flat=True).first() or 0
    deadline = time.monotonic() + 60
    while (sql.transactions_ended_below() or 0) <= newest:
        assert time.monotonic() < deadline, "a transaction of another session stayed open for a minute"
        time.sleep(0.2)
    return checkpoint_make().checkpoint


def verify() -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_trail", stdout=out, stderr=err)
    except SystemExit as exit_:
        return int(exit_.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def test_a_clean_trail_verifies_and_each_event_follows_the_one_before(agent_actor: Actor) -> None:
    actions = three_event_actions(agent_actor)
    for action in actions:
        events = events_of(action)
        assert [e.sequence for e in events] == [1, 2, 3]
        previous = "0" * 64
        for event in events:
            assert event.chain_hash == chain_link(previous, event.content_hash)
            previous = event.chain_hash
    code, out, err = verify()
    assert (code, err) == (0, "")
    assert "3 actions, 9 events" in out


def test_an_edited_payload_is_named_at_its_event(agent_actor: Actor, as_owner: Any) -> None:
    action = three_event_actions(agent_actor)[1]
    approve = events_of(action)[1]
    as_owner("UPDATE actions_actionevent SET evidence = %s WHERE id = %s", [json.dumps({"amount": "999"}), approve.pk])
    code, _, err = verify()
    assert code == 1
    assert f"FIRST BREAK: edited: event {approve.pk} (action {action.action_id}, sequence 2)" in err


def test_a_deleted_event_is_named_at_the_event_after_the_gap(agent_actor: Actor, as_owner: Any) -> None:
    action = three_event_actions(agent_actor)[0]
    _, approve, cancel = events_of(action)
    as_owner("DELETE FROM actions_actionevent WHERE id = %s", [approve.pk])
    code, _, err = verify()
    assert code == 1
    assert f"FIRST BREAK: removed: event {cancel.pk} (action {action.action_id}, sequence 3): sequence 2 missing" in err


def test_a_forged_event_whose_chain_does_not_follow_is_named(agent_actor: Actor) -> None:
    """Appended by someone with INSERT rights only (no trigger to lift), with hashes of its own."""
    action = three_event_actions(agent_actor)[2]
    last = events_of(action)[-1]
    forged = ActionEvent(
        action=action,
        transition="resolve_succeeded",
        from_state="CANCELLED",
        to_state="SUCCEEDED",
        actor_kind="user",
        actor_label="mallory",
        created_at=last.created_at,
        sequence=4,
        content_hash=sha256_hex(b"forged"),
        chain_hash=sha256_hex(b"forged chain"),
    )
    forged.save(force_insert=True)
    code, _, err = verify()
    assert code == 1
    assert f"FIRST BREAK: inserted: event {forged.pk} (action {action.action_id}, sequence 4)" in err


def test_a_forged_event_that_claims_a_taken_sequence_is_told_from_the_genuine_one(
    agent_actor: Actor, as_owner: Any
) -> None:
    """The owner drops the unique (action, sequence) and slips a second "sequence 2" in, with a
    correct content hash, a chain hash that follows event 1 and a key lower than every event's
    (so that key order does not give it away): the genuine event 2 is the one event 3's chain
    follows, so the forged one is named."""
    action = three_event_actions(agent_actor)[0]
    first, approve, _ = events_of(action)
    as_owner("ALTER TABLE actions_actionevent DROP CONSTRAINT event_action_sequence_unique", [])
    forged = ActionEvent(
        action=action,
        transition=approve.transition,
        from_state=approve.from_state,
        to_state=approve.to_state,
        actor_kind="user",
        actor_label="mallory",
        created_at=approve.created_at,
        sequence=2,
    )
    forged.pk = ActionEvent.objects.order_by("id").values_list("id", flat=True)[0] - 1
    forged.content_hash = content_hash(event_content_of(forged))
    forged.chain_hash = chain_link(first.chain_hash, forged.content_hash)
    forged.save(force_insert=True)
    code, _, err = verify()
    assert code == 1
    assert f"FIRST BREAK: inserted: event {forged.pk} (action {action.action_id}, sequence 2)" in err


def test_two_swapped_events_are_named_as_reordered(agent_actor: Actor, as_owner: Any) -> None:
    """The contents of events 2 and 3 trade places; each row keeps its key, sequence and hashes."""
    action = three_event_actions(agent_actor)[1]
    _, approve, cancel = events_of(action)
    columns = [
        "transition",
        "from_state",
        "to_state",
        "actor_kind",
        "actor_label",
        "actor_agent_id",
        "reason",
        "evidence",
        "created_at",
    ]
    assignments = ", ".join(f"{c} = o.{c}" for c in columns)
    as_owner(
        f"UPDATE actions_actionevent AS e SET {assignments} FROM actions_actionevent AS o "  # noqa: S608 -- fixed names
        "WHERE (e.id, o.id) IN ((%s, %s), (%s, %s))",
        [approve.pk, cancel.pk, cancel.pk, approve.pk],
    )
    code, _, err = verify()
    assert code == 1
    assert f"FIRST BREAK: reordered: event {approve.pk} (action {action.action_id}, sequence 2)" in err
    assert f"event {cancel.pk}" in err


def test_a_break_is_told_to_finance_once(agent_actor: Actor, finance: Any, as_owner: Any, settings: Any) -> None:
    action = three_event_actions(agent_actor, count=1)[0]
    event = events_of(action)[0]
    as_owner("UPDATE actions_actionevent SET reason = 'rewritten' WHERE id = %s", [event.pk])
    key = settings.TRAIL_SIGNING_KEY.encode()
    assert len(trail_check(key=key).breaks) == 1
    trail_check(key=key)
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == [finance.email]
    body = mail.outbox[0].body
    # Named as finance knows the action, with where the administrator should look.
    order = action.order
    assert order is not None
    assert (
        f"The audit trail of Refund · 10.00 EUR · Order {order.number} · {order.customer_name}: one of its events "
        f"was changed after it was written (event {event.pk}, sequence 1)."
    ) in body
    assert f"/review/actions/{action.pk}/" in body


@pytest.mark.django_db(transaction=True)
def test_checkpoints_are_signed_chained_written_to_the_file_and_verified(agent_actor: Actor, settings: Any) -> None:
    three_event_actions(agent_actor, count=2)
    first = checkpoint_after_commits()
    assert first is not None and first.event_count == 6
    three_event_actions(agent_actor, count=1)
    second = checkpoint_after_commits()
    assert second is not None and second.event_count == 3
    assert second.previous_hash == first.checkpoint_hash
    lines = checkpoint_log_read()
    assert [line["number"] for line in lines] == [1, 2]
    assert lines[1]["signature"] == second.signature
    code, out, err = verify()
    assert (code, err) == (0, ""), err
    assert "2 checkpoints" in out

    # A wrong key no longer verifies them.
    settings.TRAIL_SIGNING_KEY = "another-key-of-enough-length-9876543210"
    code, _, err = verify()
    assert code == 1 and "FIRST BREAK: checkpoint: checkpoint 1: its signature does not verify" in err


@pytest.mark.django_db(transaction=True)
def test_an_event_slipped_into_a_signed_period_breaks_its_checkpoint(agent_actor: Actor) -> None:
    """A forger who computes the chain correctly and appends at the end of a trail passes the
    chain's check; the checkpoint whose period the forged row claims (its txid) catches it."""
    action = three_event_actions(agent_actor, count=1)[0]
    checkpoint = checkpoint_after_commits()
    assert checkpoint is not None
    last = events_of(action)[-1]
    forged = ActionEvent(
        action=action,
        transition="note",
        from_state="CANCELLED",
        to_state="CANCELLED",
        actor_kind="user",
        actor_label="mallory",
        created_at=last.created_at,
        sequence=4,
    )
    forged.content_hash = content_hash(event_content_of(forged))
    forged.chain_hash = chain_link(last.chain_hash, forged.content_hash)
    forged.save(force_insert=True)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE actions_actionevent DISABLE TRIGGER USER")
        cursor.execute("UPDATE actions_actionevent SET txid = %s WHERE id = %s", [last.txid, forged.pk])
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE actions_actionevent ENABLE TRIGGER USER")
    code, _, err = verify()
    assert code == 1
    assert "FIRST BREAK: checkpoint: checkpoint 1: its period now holds 4 events, 3 when signed: inserted" in err
    assert Checkpoint.objects.count() == 1


def test_beat_makes_checkpoints_and_checks_the_trail_hourly(agent_actor: Actor, settings: Any) -> None:
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert schedule["trail-checkpoint"]["task"] == "actions.tasks.trail_checkpoint"
    assert schedule["trail-verify"]["task"] == "actions.tasks.trail_verify"
    assert schedule["trail-checkpoint"]["schedule"] == schedule["trail-verify"]["schedule"] == 3600.0
    three_event_actions(agent_actor, count=1)
    assert tasks.trail_checkpoint() == 1
    assert tasks.trail_verify() == 0
    assert checkpoint_log_read()[0]["number"] == 1


# The columns of an event that are not its content: its key, the hashes, and the transaction that
# inserted it, which places it under a checkpoint (an edited txid moves the event out of the
# checkpoint whose Merkle root covers it, and that root no longer verifies).
OUTSIDE_THE_CONTENT = {"id", "content_hash", "chain_hash", "txid"}


def test_every_column_of_an_event_is_hashed_or_is_the_chain_itself() -> None:
    """A column the content hash left out could be edited by a database owner unseen."""
    columns = {field.attname for field in ActionEvent._meta.concrete_fields}
    hashed = {name.replace("action__action_id", "action_id") for name in EVENT_ROW_FIELDS}
    assert columns - OUTSIDE_THE_CONTENT == hashed


def test_the_verifier_reads_back_the_content_the_writer_hashed(agent_actor: Actor) -> None:
    [action] = three_event_actions(agent_actor, count=1)
    events = ActionEvent.objects.filter(action=action).select_related("action").order_by("sequence")
    rows = ActionEvent.objects.filter(action=action).order_by("sequence").values(*EVENT_ROW_FIELDS)
    assert len(events) == 3
    for event, row in zip(events, rows, strict=True):
        assert row_event_content(row) == event_content_of(event)
        assert content_hash(row_event_content(row)) == event.content_hash


def test_the_migration_chains_a_trail_written_before_the_chain_as_the_writer_would(
    agent_actor: Actor, as_owner: Any
) -> None:
    actions = three_event_actions(agent_actor, count=2)
    def chained() -> dict[int, tuple[int | None, str, str]]:
        return {e.pk: (e.sequence, e.content_hash, e.chain_hash) for action in actions for e in events_of(action)}

    written = chained()
    # The trail as it stood before the chain: no hashes, and no sequence (the unique sequence per
    # action, added after the migration's step, is kept apart with numbers past any real one).
    as_owner("UPDATE actions_actionevent SET sequence = id + 1000000, content_hash = '', chain_hash = ''", [])

    # The models as a migration sees them: plain managers, without the append-only queryset.
    migration_apps = MigrationLoader(connection).project_state().apps
    with connection.schema_editor(atomic=False) as editor:
        backfill_trail_hashes(migration_apps, editor)

    assert chained() == written
    assert verify()[0] == 0
