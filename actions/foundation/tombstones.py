"""Retention tombstones: the signed statement each pruning leaves of what it removed
(actions.models.RetentionTombstone, docs/operators/retention.md).

A tombstone's hash is SHA-256 over the canonical JSON of its fields; its signature is the
same HMAC-SHA256 as a checkpoint's (actions.foundation.chain.sign), with the same key. So a
tombstone cannot be written, edited or moved to cover other records without the key, and the
trail's check (actions.evidence.verify) verifies every one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from actions.foundation.chain import ALGORITHM, canonical_json, key_id, sha256_hex, sign, signature_valid, timestamp
from actions.foundation.signing import signing_key
from actions.models import RetentionTombstone

# The record type of pruned audit events: the database's guard looks for it before it lets an
# archived event go (actions.foundation.db_guards).
AUDIT_EVENTS = "audit events"


@dataclass(frozen=True)
class Pruned:
    """One record about to be pruned: its key, its time and a hash of what it held."""

    pk: int
    at: datetime
    digest: str


def _time(value: datetime | None) -> str | None:
    return timestamp(value) if value is not None else None


def tombstone_content(tombstone: RetentionTombstone) -> dict[str, Any]:
    return {
        "record_type": tombstone.record_type,
        "rule": tombstone.rule,
        "retention_days": tombstone.retention_days,
        "cutoff": timestamp(tombstone.cutoff),
        "count": tombstone.count,
        "first_id": tombstone.first_id,
        "last_id": tombstone.last_id,
        "first_at": _time(tombstone.first_at),
        "last_at": _time(tombstone.last_at),
        "digest": tombstone.digest,
        "checkpoint_counts": {str(k): v for k, v in sorted(tombstone.checkpoint_counts.items())},
        "created_at": timestamp(tombstone.created_at),
    }


def tombstone_hash(tombstone: RetentionTombstone) -> str:
    return sha256_hex(canonical_json(tombstone_content(tombstone)))


def tombstone_write(
    *,
    record_type: str,
    rule: str,
    retention_days: int,
    cutoff: datetime,
    records: Iterable[Pruned],
    checkpoint_counts: dict[str, int] | None = None,
    now: datetime | None = None,
) -> RetentionTombstone:
    """Write the signed tombstone of ``records``, in the transaction that prunes them (before
    the delete: the database's guard on archived events looks for it)."""
    key = signing_key()
    rows = sorted(records, key=lambda record: record.pk)
    first, last = (rows[0], rows[-1]) if rows else (None, None)
    tombstone = RetentionTombstone(record_type=record_type, rule=rule, retention_days=retention_days, cutoff=cutoff)
    tombstone.count, tombstone.checkpoint_counts = len(rows), checkpoint_counts or {}
    tombstone.first_id, tombstone.last_id = (first.pk, last.pk) if first and last else (None, None)
    tombstone.first_at = min((row.at for row in rows), default=None)
    tombstone.last_at = max((row.at for row in rows), default=None)
    tombstone.digest = sha256_hex(canonical_json([[row.pk, row.digest] for row in rows]))
    tombstone.created_at, tombstone.algorithm, tombstone.key_id = now or timezone.now(), ALGORITHM, key_id(key)
    tombstone.signature = sign(key, tombstone_hash(tombstone))
    tombstone.save(force_insert=True)
    return tombstone


def tombstone_valid(tombstone: RetentionTombstone, *, key: bytes) -> bool:
    """Whether the tombstone's fields are the ones signed, under ``key``."""
    return tombstone.key_id == key_id(key) and signature_valid(key, tombstone_hash(tombstone), tombstone.signature)
