"""Checkpoints of the audit trail: a signed Merkle root over each period's events, chained to the
checkpoint before, in the database and in a JSON-lines file beside it (docs/evidence.md).

Which events a checkpoint covers. Keys are handed out when a row is inserted, not when its
transaction commits: a transaction that inserted event 100 may commit after the one that
inserted event 101. A checkpoint cut at "the highest key committed" would leave 100 out of its
period and the next one's for ever. So on PostgreSQL each event carries the id of the
transaction that inserted it (``ActionEvent.txid``), and a checkpoint covers the events of the
transactions with ids below ``pg_snapshot_xmin`` as the checkpoint starts: every one of those
has ended, so that set can no longer grow. A transaction still open is covered by a later
checkpoint, however long it stays open; nothing waits for it. On SQLite a single writer commits
in key order, and the period ends at the highest key.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError
from django.db.models import QuerySet
from django.utils import timezone

from actions.foundation import sql
from actions.foundation.chain import (
    ALGORITHM,
    GENESIS,
    canonical_json,
    checkpoint_content,
    key_id,
    merkle_leaf,
    merkle_root,
    sha256_hex,
    sign,
)
from actions.foundation.signing import signing_key
from actions.foundation.sql.trail_events import trail_snapshot
from actions.models import ActionEvent, ArchivedActionEvent, Checkpoint

__all__ = ["signing_key"]  # read here by the checkpoints' callers

log = logging.getLogger(__name__)


def checkpoint_events(checkpoint: Checkpoint, previous: Checkpoint | None) -> list[QuerySet[Any]]:
    """The events ``checkpoint`` covers, live and archived: one query per table, each in key
    order (an archived event keeps its key and txid, so it stays in its period)."""
    found: list[QuerySet[Any]] = []
    for model in (ActionEvent, ArchivedActionEvent):
        events: QuerySet[Any] = model.objects.order_by("id")
        if checkpoint.txid_below is not None:
            if previous is not None and previous.txid_below is not None:
                events = events.filter(txid__gte=previous.txid_below)
            found.append(events.filter(txid__lt=checkpoint.txid_below))
            continue
        if previous is not None and previous.id_upto is not None:
            events = events.filter(id__gt=previous.id_upto)
        found.append(events.filter(id__lte=checkpoint.id_upto or 0))
    return found


def checkpoint_leaves(tables: list[QuerySet[Any]]) -> list[tuple[int, str]]:
    """(event key, Merkle leaf) for each event of these queries, merged in key order."""
    rows = [
        row
        for events in tables
        for row in events.values_list("id", "action__action_id", "sequence", "chain_hash").iterator(chunk_size=5000)
    ]
    rows.sort(key=lambda row: row[0])
    return [
        (pk, merkle_leaf(event_id=pk, action=action, sequence=sequence or 0, chain_hash=chain))
        for pk, action, sequence, chain in rows
    ]


def checkpoint_document(checkpoint: Checkpoint) -> dict[str, Any]:
    """The checkpoint as its hash and signature read it, with them: one line of the file."""
    return {
        **_content(checkpoint),
        "checkpoint_hash": checkpoint.checkpoint_hash,
        "algorithm": checkpoint.algorithm,
        "key_id": checkpoint.key_id,
        "signature": checkpoint.signature,
    }


def _content(checkpoint: Checkpoint) -> dict[str, Any]:
    return checkpoint_content(
        number=checkpoint.number,
        created_at=checkpoint.created_at,
        txid_below=checkpoint.txid_below,
        id_upto=checkpoint.id_upto,
        event_count=checkpoint.event_count,
        first_event=checkpoint.first_event,
        last_event=checkpoint.last_event,
        root=checkpoint.root,
        previous_hash=checkpoint.previous_hash,
    )


def checkpoint_hash_of(checkpoint: Checkpoint) -> str:
    return sha256_hex(canonical_json(_content(checkpoint)))


@dataclass(frozen=True)
class CheckpointRun:
    checkpoint: Checkpoint | None  # None: another run made this one first
    appended: int  # lines added to the file


def checkpoint_make(*, now: datetime | None = None) -> CheckpointRun:
    """Make the next checkpoint (even of an empty period: it still says "nothing happened"),
    then bring the file up to date with the table."""
    now = now or timezone.now()
    key = signing_key()
    made: Checkpoint | None = None
    try:
        # One snapshot for the live trail and its archive: an archive batch committing between
        # the two tables' reads would otherwise be counted twice, or not at all, and signed so.
        with trail_snapshot(durable=True):
            # First, before this transaction has an id of its own.
            txid_below = sql.transactions_ended_below()
            previous = Checkpoint.objects.order_by("-number").first()
            if txid_below is not None and previous is not None and previous.txid_below is not None:
                # Never behind the previous one (an empty period rather than an overlap).
                txid_below = max(txid_below, previous.txid_below)
            checkpoint = Checkpoint(
                number=(previous.number + 1) if previous else 1,
                created_at=now,
                txid_below=txid_below,
                previous_hash=previous.checkpoint_hash if previous else GENESIS,
                algorithm=ALGORITHM,
                key_id=key_id(key),
            )
            if txid_below is None:
                last = max(
                    (
                        found
                        for model in (ActionEvent, ArchivedActionEvent)
                        if (found := model.objects.order_by("-id").values_list("id", flat=True).first()) is not None
                    ),
                    default=None,
                )
                checkpoint.id_upto = last if last is not None else (previous.id_upto if previous else 0)
            leaves = checkpoint_leaves(checkpoint_events(checkpoint, previous))
            checkpoint.event_count = len(leaves)
            checkpoint.first_event = leaves[0][0] if leaves else None
            checkpoint.last_event = leaves[-1][0] if leaves else None
            checkpoint.root = merkle_root([leaf for _, leaf in leaves])
            checkpoint.checkpoint_hash = checkpoint_hash_of(checkpoint)
            checkpoint.signature = sign(key, checkpoint.checkpoint_hash)
            # The unique number: two runs at once make one checkpoint; the second fails here.
            checkpoint.save(force_insert=True)
            made = checkpoint
    except IntegrityError:
        log.info("another run made the next checkpoint first")
    return CheckpointRun(checkpoint=made, appended=checkpoint_log_catch_up())


def checkpoint_log_read(path: Path | None = None) -> list[dict[str, Any]]:
    path = path or Path(settings.TRAIL_CHECKPOINT_LOG)
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def checkpoint_log_catch_up(path: Path | None = None) -> int:
    """Append the checkpoints the file lacks, in order. After the table's commit, so that a
    crash between the two leaves a line missing (added by the next run), never a line without
    its row."""
    path = path or Path(settings.TRAIL_CHECKPOINT_LOG)
    written = checkpoint_log_read(path)
    last = written[-1]["number"] if written else 0
    missing = list(Checkpoint.objects.filter(number__gt=last).order_by("number"))
    if not missing:
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        for checkpoint in missing:
            out.write(canonical_json(checkpoint_document(checkpoint)).decode("ascii") + "\n")
        out.flush()
    return len(missing)
