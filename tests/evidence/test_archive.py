"""Retention and archive: closed actions' events move to the archive and the trail still
verifies, pages and bundles still show them, the append-only guard still refuses any other
delete, and pruning past retention leaves a signed tombstone (docs/operators/retention.md)."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, connections, transaction
from django.test import Client
from django.utils import timezone

from actions import tasks
from actions.engine import retention
from actions.engine.retention import archive_closed_actions, archive_prune
from actions.evidence.bundle import evidence_bundle
from actions.evidence.checkpoints import checkpoint_make
from actions.foundation import sql
from actions.foundation.security import security_event_record
from actions.foundation.sql import trail_events
from actions.foundation.tombstones import AUDIT_EVENTS, Pruned, tombstone_valid, tombstone_write
from actions.foundation.trail import trail_events as trail_events_of
from actions.models import (
    Action,
    ActionEvent,
    ArchivedActionEvent,
    Checkpoint,
    Notification,
    NotificationKind,
    RetentionTombstone,
    SecurityEventKind,
)
from actions.models.actions import TERMINAL_STATUSES
from actions.review.services import action_owner_record
from actions.services import Actor
from tests.evidence.test_trail_chain import cancelled_refund, proposed_refund
from tests.factories import PASSWORD
from tools import verify_evidence

pytestmark = pytest.mark.postgres
KEY = "a-test-key-of-enough-length-0123456789"


@pytest.fixture(autouse=True)
def trail_settings(settings: Any, tmp_path: Path) -> None:
    settings.TRAIL_SIGNING_KEY = KEY
    settings.TRAIL_CHECKPOINT_LOG = tmp_path / "checkpoints.jsonl"
    settings.NOTIFICATION_EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"




def closed_long_ago(*actions: Action, days: int = 100) -> None:
    """As if they had closed ``days`` ago (the status time is not a material field)."""
    Action.objects.filter(pk__in=[a.pk for a in actions]).update(
        status_changed_at=timezone.now() - timedelta(days=days)
    )


def checkpoint_after_commits() -> None:
    """A checkpoint over every event so far, once every transaction that wrote one has ended
    (the cluster is shared: another session's open transaction holds the cut back)."""
    newest = ActionEvent.objects.order_by("-txid").values_list("txid", flat=True).first() or 0
    deadline = time.monotonic() + 60
    while (sql.transactions_ended_below() or 0) <= newest:
        assert time.monotonic() < deadline, "a transaction of another session stayed open for a minute"
        time.sleep(0.2)
    assert checkpoint_make().checkpoint is not None


def verify() -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("verify_trail", stdout=out, stderr=err)
    except SystemExit as exit_:
        return int(exit_.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def archive(*args: str) -> str:
    out = io.StringIO()
    call_command("archive_closed_actions", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_archiving_a_month_of_closed_actions_keeps_the_trail_verified(agent_actor: Actor, finance: Any) -> None:
    closed = [cancelled_refund(agent_actor) for _ in range(3)]
    still_open = proposed_refund(agent_actor)
    assert still_open.status not in TERMINAL_STATUSES
    closed_long_ago(*closed, still_open)
    checkpoint_after_commits()

    assert "would move 9 events of 3 actions" in archive("--dry-run")
    assert ArchivedActionEvent.objects.count() == 0
    assert "moved 9 events of 3 actions" in archive()

    assert ArchivedActionEvent.objects.filter(action__in=closed).count() == 9
    assert not ActionEvent.objects.filter(action__in=closed).exists()
    # The open action is never archived, however old its last change.
    assert ActionEvent.objects.filter(action=still_open).count() == 2
    assert not ArchivedActionEvent.objects.filter(action=still_open).exists()
    code, out, err = verify()
    assert (code, err) == (0, ""), err
    assert "4 actions, 11 events, 1 checkpoints" in out

    # A later event on an archived action (finance takes it) continues its chain from the archive.
    with transaction.atomic():
        locked = Action.objects.select_for_update().get(pk=closed[0].pk)
        action_owner_record(action=locked, owner=finance, user=finance, reason="audit query", now=timezone.now())
    assert ActionEvent.objects.get(action=closed[0]).sequence == 4
    checkpoint_after_commits()
    assert "moved 1 events of 1 actions" in archive()
    code, out, err = verify()
    assert (code, err) == (0, ""), err
    assert "4 actions, 12 events, 2 checkpoints" in out


@pytest.mark.django_db(transaction=True)
def test_an_archived_actions_page_and_bundle_still_show_its_events(
    agent_actor: Actor, finance: Any, manager: Any, tmp_path: Path
) -> None:
    action = cancelled_refund(agent_actor)
    closed_long_ago(action)
    checkpoint_after_commits()
    assert archive_closed_actions().events == 3
    assert not ActionEvent.objects.filter(action=action).exists()

    client = Client()
    client.login(username=finance.get_username(), password=PASSWORD)
    page = client.get(f"/review/actions/{action.pk}/")
    assert page.status_code == 200
    assert page.content.decode().count("not needed") >= 1  # the cancel event's reason
    # The manager's page of the proposal shows its trail, and its live outcome part still answers.
    client.force_login(manager)
    detail = client.get(f"/approvals/{action.pk}/")
    assert detail.status_code == 200
    assert detail.content.decode().count('<li class="trail__item">') == 3
    assert client.get(f"/approvals/{action.pk}/outcome").status_code == 200

    bundle = evidence_bundle(action_pk=action.pk)
    assert [event["content"]["sequence"] for event in bundle["events"]] == [1, 2, 3]
    assert all(event["merkle"] and event["merkle"]["checkpoint"] == 1 for event in bundle["events"])
    out = tmp_path / "out"
    call_command("export_evidence", "--action", action.action_id, "--out", str(out), stdout=io.StringIO())
    path = out / (action.action_id.replace(":", "_") + ".json")
    assert len(json.loads(path.read_bytes())["events"]) == 3
    assert verify_evidence.main([str(path), "--key", KEY, "--require-checkpoint"]) == 0


def test_a_delete_of_an_event_outside_the_archive_path_is_refused(agent_actor: Actor) -> None:
    action = cancelled_refund(agent_actor)
    event = ActionEvent.objects.filter(action=action).first()
    assert event is not None
    for switch in ("SELECT 1", trail_events.ARCHIVING_ON, trail_events.PRUNING_ON):
        # Even with the archive's switch on, a live event with no copy in the archive stays.
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(switch)
            cursor.execute("DELETE FROM actions_actionevent WHERE id = %s", [event.pk])
    assert ActionEvent.objects.filter(pk=event.pk).exists()


def test_the_other_trails_still_refuse_a_delete_with_the_archives_switches_on(db: Any) -> None:
    """The trigger function is shared by every append-only trail: its archive and pruning paths
    read columns only the audit trail's tables have, and must not stand in another's way."""
    row = security_event_record(kind=SecurityEventKind.TOKEN_ISSUED, user=None, subject="agent a")
    for switch in (trail_events.ARCHIVING_ON, trail_events.PRUNING_ON):
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(switch)
            cursor.execute("DELETE FROM actions_securityevent WHERE id = %s", [row.pk])


def archived_event_of_a_closed_action(agent_actor: Actor) -> ArchivedActionEvent:
    """The first event of a refund cancelled long ago, once archived."""
    action = cancelled_refund(agent_actor)
    closed_long_ago(action)
    archive_closed_actions()
    archived = ArchivedActionEvent.objects.filter(action=action).select_related("action").first()
    assert archived is not None
    return archived


def pruning_is_refused(archived: ArchivedActionEvent) -> None:
    """A delete of the archived event with the pruning switch on, and no tombstone of this
    transaction's, is refused by the append-only guard."""
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(trail_events.PRUNING_ON)
        cursor.execute("DELETE FROM actions_archivedactionevent WHERE id = %s", [archived.pk])


def test_an_archived_event_is_pruned_only_under_its_tombstone(agent_actor: Actor) -> None:
    archived = archived_event_of_a_closed_action(agent_actor)
    action = archived.action
    pruning_is_refused(archived)
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE actions_archivedactionevent SET reason = 'edited' WHERE id = %s", [archived.pk])
    assert ArchivedActionEvent.objects.filter(action=action).count() == 3


@pytest.mark.django_db(transaction=True)
def test_pruning_past_retention_leaves_a_signed_tombstone_and_a_tampered_one_is_caught(
    agent_actor: Actor, settings: Any
) -> None:
    old, kept = cancelled_refund(agent_actor), cancelled_refund(agent_actor)
    closed_long_ago(old, kept)
    checkpoint_after_commits()
    archive_closed_actions()
    # Only the first action's trail is past retention.
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE actions_archivedactionevent DISABLE TRIGGER USER")
        cursor.execute(
            "UPDATE actions_archivedactionevent SET created_at = created_at - interval '3000 days'"
            " WHERE action_id = %s",
            [old.pk],
        )
        cursor.execute("ALTER TABLE actions_archivedactionevent ENABLE TRIGGER USER")
    # The events' times are hashed: re-chain nothing, but the check would name the edit. So the
    # check runs on what retention leaves, which no longer holds the edited rows.
    run = archive_prune()
    assert (run.pruned, run.tombstones) == (3, 1)
    assert not ArchivedActionEvent.objects.filter(action=old).exists()
    assert ArchivedActionEvent.objects.filter(action=kept).count() == 3

    tombstone = RetentionTombstone.objects.get()
    assert tombstone.record_type == AUDIT_EVENTS and tombstone.rule == "TRAIL_RETENTION_DAYS"
    assert tombstone.count == 3 and tombstone.retention_days == settings.TRAIL_RETENTION_DAYS
    assert tombstone.checkpoint_counts == {"1": 3}
    code, out, err = verify()
    assert (code, err) == (0, ""), err
    assert "2 actions" not in out and "1 actions, 3 events, 1 checkpoints" in out

    # One digit of its count changed: the signature no longer covers it, and the checkpoint's
    # missing events are no longer accounted for.
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE actions_retentiontombstone SET count = 2 WHERE id = %s", [tombstone.pk])
    # The database's owner lifts the guard and edits it.
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE actions_retentiontombstone DISABLE TRIGGER USER")
        cursor.execute("UPDATE actions_retentiontombstone SET count = 2 WHERE id = %s", [tombstone.pk])
        cursor.execute("ALTER TABLE actions_retentiontombstone ENABLE TRIGGER USER")
    code, _, err = verify()
    assert code == 1
    assert f"tombstone: retention tombstone {tombstone.pk}: its fields no longer match its signature" in err
    assert "checkpoint 1: its period now holds 3 events" in err


def test_archive_refuses_a_bad_or_future_date_by_name(db: Any) -> None:
    with pytest.raises(CommandError, match="YYYY-MM-DD"):
        archive("--before", "last month")
    with pytest.raises(CommandError, match="future"):
        archive("--before", (timezone.now() + timedelta(days=2)).date().isoformat())


def test_the_archive_has_the_live_trails_columns() -> None:
    live = [str(field.column) for field in ActionEvent._meta.concrete_fields]
    archived = [str(field.column) for field in ArchivedActionEvent._meta.concrete_fields]
    assert sorted(live) == sorted(archived) == sorted(trail_events.TRAIL_EVENT_COLUMNS)


def test_beat_runs_the_archive_daily(settings: Any) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["retention-archive"]
    assert entry["task"] == "actions.tasks.retention_archive"
    assert entry["schedule"] == 24 * 3600.0


def test_the_periodic_run_archives_and_prunes_old_notifications_under_a_tombstone(
    agent_actor: Actor, finance: Any, settings: Any
) -> None:
    action = cancelled_refund(agent_actor)
    closed_long_ago(action)
    now = timezone.now()
    told = {"recipient": finance, "kind": NotificationKind.ESCALATED, "link": "/review/"}
    old = Notification.objects.create(
        **told, title="old", created_at=now - timedelta(days=settings.NOTIFICATION_RETENTION_DAYS + 1)
    )
    recent = Notification.objects.create(**told, title="new", created_at=now)

    assert tasks.retention_archive() == 3  # the events archived
    assert ArchivedActionEvent.objects.filter(action=action).count() == 3
    assert list(Notification.objects.values_list("pk", flat=True)) == [recent.pk]
    tombstone = RetentionTombstone.objects.get(record_type="notifications")
    assert (tombstone.count, tombstone.first_id, tombstone.rule) == (1, old.pk, "NOTIFICATION_RETENTION_DAYS")
    assert tombstone_valid(tombstone, key=KEY.encode())


def test_old_notifications_are_pruned_a_batch_at_a_time_each_under_its_own_tombstone(
    finance: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "NOTIFICATIONS_PER_TOMBSTONE", 2)
    now = timezone.now()
    told = {"recipient": finance, "kind": NotificationKind.ESCALATED, "link": "/review/"}
    long_ago = now - timedelta(days=settings.NOTIFICATION_RETENTION_DAYS + 1)
    old = [Notification.objects.create(**told, title=f"old {n}", created_at=long_ago) for n in range(5)]

    run = retention.notifications_prune(now=now)

    assert (run.pruned, run.tombstones) == (5, 3)
    assert not Notification.objects.exists()
    tombstones = RetentionTombstone.objects.filter(record_type="notifications").order_by("first_id")
    assert [(t.count, t.first_id) for t in tombstones] == [(2, old[0].pk), (2, old[2].pk), (1, old[4].pk)]
    assert all(tombstone_valid(t, key=KEY.encode()) for t in tombstones)


@contextmanager
def archive_commits_before_the_archive_table_is_read() -> Iterator[list[int]]:
    """The moment this thread's connection first reads the archive table, another connection
    archives every closed action and commits; then the read goes on. (The list fills with the
    events that archive moved.)"""
    moved: list[int] = []

    def archive_elsewhere() -> None:
        try:
            moved.append(archive_closed_actions().events)
        finally:
            connections.close_all()

    def wrapper(execute: Any, sql_text: str, params: Any, many: bool, context: Any) -> Any:
        if not moved and "actions_archivedactionevent" in sql_text and sql_text.lstrip().upper().startswith(
            ("SELECT", "DECLARE")
        ):
            other = threading.Thread(target=archive_elsewhere)
            other.start()
            other.join(timeout=60)
            assert moved, "the archive in the other connection did not finish"
        return execute(sql_text, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield moved


@pytest.mark.django_db(transaction=True)
def test_an_archive_committing_between_the_two_tables_reads_is_neither_signed_nor_reported_as_a_break(
    agent_actor: Actor,
) -> None:
    # A checkpoint made while the archive moves its period's events counts each of them once.
    first = [cancelled_refund(agent_actor) for _ in range(2)]
    closed_long_ago(*first)
    with archive_commits_before_the_archive_table_is_read() as moved:
        checkpoint_after_commits()
    assert moved == [6]
    assert not ActionEvent.objects.filter(action__in=first).exists()
    assert Checkpoint.objects.get().event_count == 6

    # The check, while the archive moves events it has begun to read from the live trail.
    second = [cancelled_refund(agent_actor) for _ in range(2)]
    closed_long_ago(*second)
    checkpoint_after_commits()
    with archive_commits_before_the_archive_table_is_read() as moved:
        code, out, err = verify()
    assert moved == [6]
    assert not ActionEvent.objects.filter(action__in=second).exists()
    assert (code, err) == (0, ""), err
    assert "4 actions, 12 events, 2 checkpoints" in out

    # An action's page reads its trail once, whichever table the events are in meanwhile.
    third = cancelled_refund(agent_actor)
    closed_long_ago(third)
    with archive_commits_before_the_archive_table_is_read() as moved:
        events = trail_events_of(action=third)
    assert moved == [3]
    assert [event.sequence for event in events] == [1, 2, 3]


@pytest.mark.django_db(transaction=True)
def test_an_older_tombstone_lets_no_archived_event_go_even_inside_its_key_range(agent_actor: Actor) -> None:
    archived = archived_event_of_a_closed_action(agent_actor)
    # A tombstone of audit events naming exactly that event, written and committed before.
    tombstone_write(
        record_type=AUDIT_EVENTS,
        rule="TRAIL_RETENTION_DAYS",
        retention_days=1,
        cutoff=timezone.now(),
        records=[Pruned(pk=archived.pk, digest=archived.chain_hash, at=archived.created_at)],
    )
    pruning_is_refused(archived)
    assert ArchivedActionEvent.objects.filter(pk=archived.pk).exists()
