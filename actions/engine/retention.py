"""Retention: closed actions' audit events move to the archive after the hot window, and what
outlives its retention is pruned, each pruning leaving a signed tombstone
(docs/operators/retention.md).

- **Archive** (``archive_closed_actions``): the events of actions closed (a final status) before
  the cutoff, with no open remedy or discrepancy, move from ``ActionEvent`` to
  ``ArchivedActionEvent``: the same rows with the same keys and hashes, so every chain and every
  checkpoint verifies as before, and the action's page, bundle and exports read both tables
  (``actions.foundation.trail.trail_events``). One transaction per batch, holding the actions'
  row locks (every writer of an action's trail holds its lock): INSERT ... SELECT, then DELETE,
  the delete let past the append-only trigger by the archive's own switch, and only for rows
  whose copy is in the archive (actions.foundation.db_guards). Attempts stay where they are:
  they are not a chained trail, their bodies are pruned anyway, and the review pages read them
  by action with an index.
- **Pruning the archive** (``archive_prune``): an action whose archived events are all older
  than TRAIL_RETENTION_DAYS loses them, whole (a chain is never cut in the middle), under a
  tombstone written first in the same transaction; the tombstone counts the events per
  checkpoint so that the trail's check still accounts for each checkpoint's period.
- **Notifications** (``notifications_prune``): the bell's rows older than
  NOTIFICATION_RETENTION_DAYS, under a tombstone.

Actions, approvals and money (orders, refunds) are not deleted by the console.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, Max, OuterRef
from django.utils import timezone

from actions.engine.housekeeping import actions_closed_before
from actions.foundation.sql.trail_events import archived_events_delete, events_archive
from actions.foundation.tombstones import AUDIT_EVENTS, Pruned, tombstone_write
from actions.models import (
    Action,
    ActionEvent,
    AgentWebhookDelivery,
    ArchivedActionEvent,
    Checkpoint,
    Notification,
)

logger = logging.getLogger(__name__)

BATCH_SIZE = 200
NOTIFICATIONS_PER_TOMBSTONE = 5000


class ArchiveMoveFailed(Exception):
    """The archive copied a different number of events than it deleted: the batch rolls back."""


@dataclass(frozen=True)
class ArchiveReport:
    before: datetime
    actions: int
    events: int
    batches: int
    dry_run: bool = False


def archive_candidates(*, before: datetime, after_pk: int = 0) -> list[int]:
    """Keys of closed actions (closed before ``before``, nothing open on them) that still have
    events in the live trail, in key order, from ``after_pk``."""
    live = ActionEvent.objects.filter(action_id=OuterRef("pk"))
    return list(
        Action.objects.filter(actions_closed_before(before), Exists(live), pk__gt=after_pk)
        .order_by("pk")
        .values_list("pk", flat=True)[:BATCH_SIZE]
    )


def archive_closed_actions(
    *, before: datetime | None = None, now: datetime | None = None, dry_run: bool = False, max_batches: int = 1000
) -> ArchiveReport:
    """Move the live events of actions closed before ``before`` (by default the hot window,
    ARCHIVE_AFTER_DAYS, ago) to the archive. ``dry_run``: count, move nothing."""
    now = now or timezone.now()
    before = before or now - timedelta(days=settings.ARCHIVE_AFTER_DAYS)
    actions = events = batches = 0
    last_pk = 0
    while batches < max_batches:
        candidates = archive_candidates(before=before, after_pk=last_pk)
        if not candidates:
            break
        last_pk = candidates[-1]
        batches += 1
        if dry_run:
            actions += len(candidates)
            events += ActionEvent.objects.filter(action_id__in=candidates).count()
            continue
        with transaction.atomic():
            # Locked and checked again: the lock keeps every trail writer out until the commit.
            locked = list(
                Action.objects.select_for_update()
                .filter(actions_closed_before(before), pk__in=candidates)
                .order_by("pk")
                .values_list("pk", flat=True)
            )
            if not locked:
                continue
            # The agents' webhook outbox names its event; a delivery of an action closed this
            # long ago is long delivered or expired, and keeps its event id and payload.
            AgentWebhookDelivery.objects.filter(audit_event__action_id__in=locked).update(audit_event=None)
            copied, deleted = events_archive(action_pks=locked)
            if copied != deleted:
                raise ArchiveMoveFailed(f"copied {copied} events to the archive but deleted {deleted}")
        actions += len(locked)
        events += copied
    if actions and not dry_run:
        logger.info("retention: archived %s events of %s actions closed before %s", events, actions, before)
    return ArchiveReport(before=before, actions=actions, events=events, batches=batches, dry_run=dry_run)


@dataclass(frozen=True)
class PruneRun:
    pruned: int
    tombstones: int


def _checkpoint_of(checkpoints: list[Checkpoint]) -> Callable[[int, int | None], int | None]:
    """A function from an event (key, txid) to the number of the checkpoint that covers it."""
    by_txid = [(c.txid_below, c.number) for c in checkpoints if c.txid_below is not None]
    by_id = [(c.id_upto, c.number) for c in checkpoints if c.id_upto is not None]

    def covering(pk: int, txid: int | None) -> int | None:
        if txid is not None and by_txid:
            index = bisect.bisect_right([below for below, _ in by_txid], txid)
            return by_txid[index][1] if index < len(by_txid) else None
        index = bisect.bisect_left([upto for upto, _ in by_id], pk)
        return by_id[index][1] if index < len(by_id) else None

    return covering


def archive_prune(*, now: datetime | None = None, max_batches: int = 100) -> PruneRun:
    """Delete the archived events of actions whose whole archived trail is older than
    TRAIL_RETENTION_DAYS, one tombstone per batch. 0 or less keeps them for ever."""
    now = now or timezone.now()
    days = settings.TRAIL_RETENTION_DAYS
    if days <= 0:
        return PruneRun(pruned=0, tombstones=0)
    cutoff = now - timedelta(days=days)
    live = ActionEvent.objects.filter(action_id=OuterRef("pk"))
    pruned = tombstones = 0
    for _ in range(max_batches):
        candidates = list(
            Action.objects.annotate(last_event_at=Max("archived_events__created_at"))
            .filter(last_event_at__lt=cutoff)
            .exclude(Exists(live))
            .order_by("pk")
            .values_list("pk", flat=True)[:BATCH_SIZE]
        )
        if not candidates:
            break
        with transaction.atomic():
            # Locked, and checked again: an event written on one of them since it was read would
            # continue the chain from the archive, which must then stay whole.
            locked = list(
                Action.objects.select_for_update()
                .filter(pk__in=candidates)
                .exclude(Exists(live))
                .values_list("pk", flat=True)
            )
            if not locked:
                break
            rows = list(
                ArchivedActionEvent.objects.filter(action_id__in=locked)
                .order_by("id")
                .values_list("id", "created_at", "chain_hash", "txid")
            )
            covering = _checkpoint_of(list(Checkpoint.objects.order_by("number")))
            counts: dict[str, int] = {}
            for pk, _, _, txid in rows:
                number = covering(pk, txid)
                if number is not None:
                    counts[str(number)] = counts.get(str(number), 0) + 1
            tombstone_write(
                record_type=AUDIT_EVENTS,
                rule="TRAIL_RETENTION_DAYS",
                retention_days=days,
                cutoff=cutoff,
                records=[Pruned(pk=pk, at=at, digest=chain) for pk, at, chain, _ in rows],
                checkpoint_counts=counts,
                now=now,
            )
            deleted = archived_events_delete(action_pks=locked)
        pruned += deleted
        tombstones += 1
    return PruneRun(pruned=pruned, tombstones=tombstones)


def notifications_prune(*, now: datetime | None = None) -> PruneRun:
    """Delete the bell's notifications older than NOTIFICATION_RETENTION_DAYS, under one
    tombstone. 0 or less keeps them for ever."""
    now = now or timezone.now()
    days = settings.NOTIFICATION_RETENTION_DAYS
    if days <= 0:
        return PruneRun(pruned=0, tombstones=0)
    cutoff = now - timedelta(days=days)
    pruned = tombstones = 0
    # A batch at a time, each under its own tombstone and transaction: the first run after
    # retention is turned on may find years of them, more than one statement may name.
    while True:
        with transaction.atomic():
            old = Notification.objects.select_for_update().filter(created_at__lt=cutoff).order_by("id")
            rows = list(old.values_list("id", "created_at", "kind", "link")[:NOTIFICATIONS_PER_TOMBSTONE])
            if not rows:
                break
            tombstone_write(
                record_type="notifications",
                rule="NOTIFICATION_RETENTION_DAYS",
                retention_days=days,
                cutoff=cutoff,
                records=[Pruned(pk=pk, at=at, digest=f"{kind} {link}") for pk, at, kind, link in rows],
                now=now,
            )
            deleted, _ = Notification.objects.filter(pk__in=[pk for pk, *_ in rows]).delete()
        pruned += deleted
        tombstones += 1
    return PruneRun(pruned=pruned, tombstones=tombstones)


@dataclass(frozen=True)
class RetentionRun:
    archived: ArchiveReport
    trail_pruned: PruneRun
    notifications_pruned: PruneRun


def retention_run(*, now: datetime | None = None) -> RetentionRun:
    """The daily run: archive what left the hot window, then prune what outlived retention."""
    now = now or timezone.now()
    return RetentionRun(
        archived=archive_closed_actions(now=now),
        trail_pruned=archive_prune(now=now),
        notifications_pruned=notifications_prune(now=now),
    )
