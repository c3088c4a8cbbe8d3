"""Storage tidying: old attempts of finished actions lose their request and response bodies.

Attempts keep the receiver's full request and answer, which is what a person needs while an
action's outcome is open. Once an action is final and has been for the retention period, the
bodies are replaced by a stub that says when they were pruned, how large they were and their
SHA-256 (so a copy kept elsewhere can still be matched). The attempt row itself stays, with
its key, outcome, error and timings: the timeline of what was sent and concluded is kept.

What is never touched, whatever its age:
- anything of an action that is not final (its attempts are the evidence reconciliation and
  finance work from);
- anything of a final action that still has an open remedy or an unresolved discrepancy;
- audit events (``ActionEvent``), of any action: they are the append-only record, and a
  database trigger refuses any change to them anyway.

Each batch leaves a signed tombstone of what it emptied (actions.foundation.tombstones).

This is tidying, not correctness: a run that dies halfway leaves some attempts pruned and the
rest for the next run.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from actions.foundation.tombstones import Pruned, tombstone_write
from actions.models import Action, Attempt, DiscrepancyStatus, FollowUpStatus
from actions.models.actions import TERMINAL_STATUSES

logger = logging.getLogger(__name__)

# The key of the stub that replaces a pruned body.
PRUNED_MARKER = "pruned_at"
BATCH_SIZE = 500


@dataclass(frozen=True)
class PruneReport:
    pruned: int
    batches: int


def body_pruned(body: Any) -> bool:
    return isinstance(body, dict) and PRUNED_MARKER in body


def _stub(body: Any, now: datetime) -> dict[str, Any]:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return {
        PRUNED_MARKER: now.isoformat(timespec="seconds"),
        "bytes": len(canonical.encode()),
        "sha256": hashlib.sha256(canonical.encode()).hexdigest(),
    }


def actions_closed_before(cutoff: datetime) -> Q:
    """Final actions, final since before the cutoff, with nothing open that needs their evidence."""
    open_remedy = Q(remedies__status__in=[FollowUpStatus.OPEN, FollowUpStatus.IN_PROGRESS])
    open_discrepancy = Q(discrepancies__status__in=[DiscrepancyStatus.OPEN, DiscrepancyStatus.IN_PROGRESS])
    return (
        Q(status__in=list(TERMINAL_STATUSES))
        & Q(status_changed_at__lt=cutoff)
        & ~Q(pk__in=Action.objects.filter(open_remedy | open_discrepancy).values("pk"))
    )


def attempts_prune_bodies(
    *, now: datetime | None = None, retention_days: int | None = None, max_batches: int = 20
) -> PruneReport:
    """Replace the bodies of attempts older than the retention of actions final for as long.

    At most ``max_batches`` batches of ``BATCH_SIZE`` per run, so that one run stays short;
    beat runs it again at the next interval. ``retention_days`` of 0 or less switches it off.
    """
    now = now or timezone.now()
    days = settings.ATTEMPT_BODY_RETENTION_DAYS if retention_days is None else retention_days
    if days <= 0:
        return PruneReport(pruned=0, batches=0)
    cutoff = now - timedelta(days=days)
    pruned = batches = 0
    last_pk = 0
    while batches < max_batches:
        candidates = list(
            Attempt.objects.filter(pk__gt=last_pk, started_at__lt=cutoff, finished_at__isnull=False)
            .filter(action__in=Action.objects.filter(actions_closed_before(cutoff)))
            .exclude(request__has_key=PRUNED_MARKER)
            .order_by("pk")
            .values_list("pk", "action_id")[:BATCH_SIZE]
        )
        if not candidates:
            break
        batches += 1
        last_pk = candidates[-1][0]
        with transaction.atomic():
            # The actions are locked and checked again in this transaction: no status that was
            # final when the candidates were read can have changed (final means final), but the
            # check is what this function promises, so it is made where the write happens.
            still_final = set(
                Action.objects.select_for_update()
                .filter(actions_closed_before(cutoff), pk__in={action_pk for _, action_pk in candidates})
                .values_list("pk", flat=True)
            )
            attempts = list(
                Attempt.objects.filter(pk__in=[pk for pk, action_pk in candidates if action_pk in still_final])
            )
            for attempt in attempts:
                attempt.request = _stub(attempt.request, now)
                if attempt.response is not None:
                    attempt.response = _stub(attempt.response, now)
            Attempt.objects.bulk_update(attempts, ["request", "response"])
            if attempts:
                tombstone_write(
                    record_type="attempt bodies",
                    rule="ATTEMPT_BODY_RETENTION_DAYS",
                    retention_days=days,
                    cutoff=cutoff,
                    records=[
                        Pruned(
                            pk=attempt.pk,
                            at=attempt.started_at,
                            digest=f"{attempt.request['sha256']} {(attempt.response or {}).get('sha256', '')}",
                        )
                        for attempt in attempts
                    ],
                    now=now,
                )
        pruned += len(attempts)
    if pruned:
        logger.info("housekeeping: pruned the bodies of %s attempts older than %s days", pruned, days)
    return PruneReport(pruned=pruned, batches=batches)
