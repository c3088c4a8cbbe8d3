"""The check of the audit trail: every action's hash chain and every checkpoint (docs/evidence.md).

Each action's events are read in their sequence and recomputed: the content hash from the
fields, the chain hash from the previous event's. The first link that does not hold is named,
with what kind of break it is:

- **edited**: the event's fields no longer hash to its content hash;
- **reordered**: two events' contents traded places (each hashes to the other's content hash
  under the other's sequence), or the sequences run against the order the events were written
  in (their keys);
- **removed**: a sequence number is missing before the event;
- **inserted**: two events claim one sequence number, or an event's chain hash does not follow
  from the one before it (a forged event with hashes of its own making).

An event appended at the end of a trail by someone who can also compute the chain is caught by
the first checkpoint that covers its period, not by the chain: each checkpoint's Merkle root,
its link to the previous checkpoint, its signature and its line in the file are checked too.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.urls import reverse

from actions.evidence.checkpoints import (
    checkpoint_document,
    checkpoint_events,
    checkpoint_hash_of,
    checkpoint_leaves,
    checkpoint_log_read,
)
from actions.foundation.chain import (
    EVENT_ROW_FIELDS,
    GENESIS,
    chain_link,
    content_hash,
    key_id,
    merkle_root,
    row_event_content,
)
from actions.foundation.chain import signature_valid as hmac_valid
from actions.foundation.sql.trail_events import trail_snapshot
from actions.foundation.tombstones import AUDIT_EVENTS, tombstone_valid
from actions.models import Action, ActionEvent, ArchivedActionEvent, Checkpoint, RetentionTombstone
from actions.notifications import trail_break_notify
from actions.plain import action_words

EDITED, REMOVED, INSERTED, REORDERED, CHECKPOINT = "edited", "removed", "inserted", "reordered", "checkpoint"
TOMBSTONE = "tombstone"

_FIELDS = ("id", "action_id", *EVENT_ROW_FIELDS, "content_hash", "chain_hash")


@dataclass(frozen=True)
class Break:
    """One broken link: what kind, where, and what was found."""

    kind: str
    detail: str
    event_id: int | None = None
    action: str | None = None
    sequence: int | None = None
    checkpoint: int | None = None
    tombstone: int | None = None

    def line(self) -> str:
        if self.tombstone is not None:
            where = f"retention tombstone {self.tombstone}"
        elif self.checkpoint is not None:
            where = f"checkpoint {self.checkpoint}"
        else:
            where = f"event {self.event_id} (action {self.action}, sequence {self.sequence})"
        return f"{self.kind}: {where}: {self.detail}"


@dataclass
class TrailReport:
    actions: int = 0
    events: int = 0
    checkpoints: int = 0
    breaks: list[Break] = field(default_factory=list)
    tombstones: int = 0  # retention tombstones checked

    @property
    def first(self) -> Break | None:
        return self.breaks[0] if self.breaks else None


def row_content_hash(row: dict[str, Any], *, sequence: int | None = None) -> str:
    return content_hash(row_event_content(row, sequence=sequence))


def _event_named(row: dict[str, Any]) -> str:
    """An event as a break's words name it: by its key and its place in the chain."""
    return f"event {row['id']} (sequence {row['sequence']})"


def _break(kind: str, row: dict[str, Any], detail: str) -> Break:
    return Break(kind, detail, event_id=row["id"], action=row["action__action_id"], sequence=row["sequence"])


def _swapped(row: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether the two events' contents traded places, their sequences and hashes staying."""
    return (
        row["sequence"] is not None
        and other["sequence"] is not None
        and row_content_hash(row, sequence=other["sequence"]) == other["content_hash"]
        and row_content_hash(other, sequence=row["sequence"]) == row["content_hash"]
    )


def chain_first_break(rows: list[dict[str, Any]]) -> Break | None:
    """The first broken link of one action's trail (its events in any order), or None."""
    rows = sorted(rows, key=lambda row: (row["sequence"] is None, row["sequence"] or 0, row["id"]))
    previous_chain, expected = GENESIS, 1
    previous: dict[str, Any] | None = None
    for index, row in enumerate(rows):
        sequence = row["sequence"]
        if sequence is None or not row["chain_hash"]:
            return _break(INSERTED, row, "the event has no place in the chain (no sequence or chain hash)")
        following = rows[index + 1] if index + 1 < len(rows) else None
        if following is not None and following["sequence"] == sequence:
            # Two events claim one place: the genuine one is the one the next event's chain
            # follows (keys prove nothing: the database's owner may choose them).
            after = rows[index + 2] if index + 2 < len(rows) else None
            forged = following
            if after is not None and chain_link(following["chain_hash"], after["content_hash"]) == after["chain_hash"]:
                forged = row
            return _break(INSERTED, forged, f"a second event claims sequence {sequence}")
        if row_content_hash(row) != row["content_hash"]:
            if following is not None and _swapped(row, following):
                return _break(REORDERED, row, f"its content and that of {_event_named(following)} traded places")
            if chain_link(previous_chain, row["content_hash"]) != row["chain_hash"]:
                return _break(INSERTED, row, "its hashes match neither its fields nor the chain before it")
            return _break(EDITED, row, "its fields no longer match its content hash")
        if sequence > expected:
            missing = f"sequence {expected}" if sequence == expected + 1 else f"sequences {expected} to {sequence - 1}"
            return _break(REMOVED, row, f"{missing} missing before it")
        if previous is not None and row["id"] < previous["id"]:
            return _break(REORDERED, row, f"written before {_event_named(previous)} yet sequenced after it")
        if chain_link(previous_chain, row["content_hash"]) != row["chain_hash"]:
            return _break(INSERTED, row, "its chain hash does not follow from the previous event's")
        previous_chain, expected, previous = row["chain_hash"], sequence + 1, row
    return None


def _actions_events() -> Iterator[list[dict[str, Any]]]:
    """Each action's events, one action at a time, read in one pass in key order."""
    # The live trail and its archive, each in (action, key) order, merged as they stream: an
    # action's events may lie in both (one written after its archiving, on a late follow-up).
    rows = heapq.merge(
        *(
            model.objects.order_by("action_id", "id").values(*_FIELDS).iterator(chunk_size=5000)
            for model in (ActionEvent, ArchivedActionEvent)
        ),
        key=lambda row: (row["action_id"], row["id"]),
    )
    group: list[dict[str, Any]] = []
    for row in rows:
        if group and group[0]["action_id"] != row["action_id"]:
            yield group
            group = []
        group.append(row)
    if group:
        yield group


def checkpoints_first_break(
    *, key: bytes, pruned: dict[str, int] | None = None, file_lines: list[dict[str, Any]] | None = None
) -> tuple[int, Break | None]:
    """Check every checkpoint in order: its link to the one before, its hash, its signature, its
    root over the events of its period, and its line in the file. (count, first break).
    ``pruned``: how many of each checkpoint's events valid tombstones account for, by number.
    ``file_lines``: the checkpoint file as read before the checkpoints' rows (read now if None)."""
    pruned = pruned or {}
    previous: Checkpoint | None = None
    lines = {line.get("number"): line for line in (checkpoint_log_read() if file_lines is None else file_lines)}
    count = 0
    for checkpoint in Checkpoint.objects.order_by("number"):
        count += 1

        def broken(detail: str, checkpoint: Checkpoint = checkpoint) -> Break:
            return Break(CHECKPOINT, detail, checkpoint=checkpoint.number)

        expected_number = previous.number + 1 if previous else 1
        if checkpoint.number != expected_number:
            return count, broken(f"checkpoint {expected_number} is missing before it")
        if checkpoint.previous_hash != (previous.checkpoint_hash if previous else GENESIS):
            return count, broken("its link to the previous checkpoint does not hold")
        if checkpoint_hash_of(checkpoint) != checkpoint.checkpoint_hash:
            return count, broken("its fields no longer match its hash")
        if checkpoint.key_id != key_id(key) or not hmac_valid(key, checkpoint.checkpoint_hash, checkpoint.signature):
            return count, broken(f"its signature does not verify under the key {key_id(key)}")
        leaves = checkpoint_leaves(checkpoint_events(checkpoint, previous))
        found = [pk for pk, _ in leaves]
        gone = pruned.get(str(checkpoint.number), 0)
        if gone:
            # Part of its period was pruned past retention, under signed tombstones: what is left
            # must be exactly the rest. Its root can no longer be recomputed.
            if len(found) + gone != checkpoint.event_count:
                return count, broken(_period_difference(checkpoint, found, pruned=gone))
        elif len(found) != checkpoint.event_count or merkle_root([leaf for _, leaf in leaves]) != checkpoint.root:
            return count, broken(_period_difference(checkpoint, found))
        line = lines.pop(checkpoint.number, None)
        if line is not None and line != checkpoint_document(checkpoint):
            return count, broken("its line in the checkpoint file differs from its row")
        previous = checkpoint
    if lines:
        number = min(n for n in lines if isinstance(n, int)) if any(isinstance(n, int) for n in lines) else 0
        return count, Break(CHECKPOINT, "it is in the checkpoint file but not in the database", checkpoint=number)
    return count, None


def _period_difference(checkpoint: Checkpoint, found: list[int], *, pruned: int = 0) -> str:
    if pruned:
        return (
            f"its period now holds {len(found)} events and tombstones account for {pruned} pruned,"
            f" {checkpoint.event_count} when signed"
        )
    if len(found) > checkpoint.event_count:
        low, high = checkpoint.first_event, checkpoint.last_event
        strays = [pk for pk in found if low is None or high is None or not low <= pk <= high]
        named = f" (events {', '.join(map(str, strays[:5]))} lie outside its range)" if strays else ""
        return f"its period now holds {len(found)} events, {checkpoint.event_count} when signed: inserted{named}"
    if len(found) < checkpoint.event_count:
        return f"its period now holds {len(found)} events, {checkpoint.event_count} when signed: removed"
    return "the Merkle root over its period's events differs from the one signed: an event's chain hash changed"


def trail_verify(*, key: bytes) -> TrailReport:
    """Recompute every action's chain and every checkpoint. Breaks in event key order, the
    first broken link of each action (the links after it follow from it), then the first broken
    checkpoint.

    The file first: a line is appended only after its checkpoint's row commits, so every line
    read before the snapshot has its row in it. Then everything else in one snapshot, so that an
    archive batch or a pruning committing meanwhile shows nowhere as a break."""
    file_lines = checkpoint_log_read()
    with trail_snapshot():
        return _trail_verify_in_snapshot(key=key, file_lines=file_lines)


def _trail_verify_in_snapshot(*, key: bytes, file_lines: list[dict[str, Any]]) -> TrailReport:
    report = TrailReport()
    for rows in _actions_events():
        report.actions += 1
        report.events += len(rows)
        found = chain_first_break(rows)
        if found is not None:
            report.breaks.append(found)
    report.breaks.sort(key=lambda b: b.event_id or 0)
    report.tombstones, tombstone_breaks, pruned = tombstones_check(key=key)
    report.checkpoints, checkpoint_break = checkpoints_first_break(key=key, pruned=pruned, file_lines=file_lines)
    if checkpoint_break is not None:
        report.breaks.append(checkpoint_break)
    report.breaks.extend(tombstone_breaks)
    return report


def tombstones_check(*, key: bytes) -> tuple[int, list[Break], dict[str, int]]:
    """Check every retention tombstone's signature. (count, breaks, and how many pruned audit
    events the valid ones account for in each checkpoint's period, by its number). A tombstone
    that does not verify accounts for nothing, so its checkpoints then show the events missing."""
    breaks: list[Break] = []
    pruned: dict[str, int] = {}
    count = 0
    for tombstone in RetentionTombstone.objects.order_by("id"):
        count += 1
        if not tombstone_valid(tombstone, key=key):
            breaks.append(
                Break(
                    TOMBSTONE,
                    f"its fields no longer match its signature under the key {key_id(key)}",
                    tombstone=tombstone.pk,
                )
            )
            continue
        if tombstone.record_type == AUDIT_EVENTS:
            for number, events in tombstone.checkpoint_counts.items():
                pruned[str(number)] = pruned.get(str(number), 0) + int(events)
    return count, breaks, pruned


# What each kind of break means, for the members of finance who are told of it.
_BREAK_WORDS = {
    EDITED: "one of its events was changed after it was written",
    REMOVED: "one of its events was removed",
    INSERTED: "an event was added to it that the console did not write",
    REORDERED: "its events were put in another order",
}


def _told_line(found: Break, action: Action | None) -> str:
    """A break as finance is told of it: the action as a clerk knows it and what happened to
    its trail, then where (the event or checkpoint, for the administrator)."""
    if found.tombstone is not None:
        return (
            f"A signed retention tombstone no longer matches what it says was pruned "
            f"(tombstone {found.tombstone}: {found.detail})."
        )
    if found.checkpoint is not None:
        return (
            f"A signed checkpoint of the audit trail no longer matches the events it covers "
            f"(checkpoint {found.checkpoint}: {found.detail})."
        )
    whose = action_words(action) if action is not None else found.action
    what = _BREAK_WORDS.get(found.kind, "it no longer matches its hashes")
    return f"The audit trail of {whose}: {what} (event {found.event_id}, sequence {found.sequence})."


def trail_check(*, key: bytes) -> TrailReport:
    """The periodic check: verify, and tell finance of what broke (each break once)."""
    report = trail_verify(key=key)
    if report.breaks:
        named = [b.action for b in report.breaks if b.action]
        actions = {a.action_id: a for a in Action.objects.filter(action_id__in=named).select_related("order", "bill")}
        breaks = []
        for found in report.breaks:
            action = actions.get(found.action) if found.action else None
            # The action's page; a checkpoint's break has no action, and finance starts at the queue.
            link = reverse("review-action", args=[action.pk]) if action is not None else reverse("review-queue")
            where = found.tombstone or (found.checkpoint if found.checkpoint is not None else found.event_id)
            subject = f"trail:{found.kind}:{where}"
            breaks.append((subject, _told_line(found, action), link))
        trail_break_notify(breaks=breaks)
    return report
