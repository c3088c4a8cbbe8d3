"""Checkpoints of the audit trail: a signed Merkle root over the events of a period, each
linked to the one before (actions.evidence.checkpoints, docs/evidence.md)."""

from __future__ import annotations

from typing import Any

from django.db import models

from actions.models.actions import CurrentTransactionId
from actions.models.append_only import AppendOnly, AppendOnlyQuerySet


class Checkpoint(models.Model):
    """A signed statement: "these events, and nothing else, were in the trail's period".

    The period is the events of the transactions that had all ended when the checkpoint was made
    and were not covered before: on PostgreSQL those whose ``txid`` lies in
    [previous ``txid_below``, ``txid_below``); on SQLite (one writer, commits in key order) those
    whose key lies in (previous ``id_upto``, ``id_upto``].
    """

    number = models.PositiveIntegerField(unique=True)
    created_at = models.DateTimeField()
    txid_below = models.BigIntegerField(null=True, blank=True)
    id_upto = models.BigIntegerField(null=True, blank=True)
    event_count = models.PositiveIntegerField()
    first_event = models.BigIntegerField(null=True, blank=True)
    last_event = models.BigIntegerField(null=True, blank=True)
    root = models.CharField(max_length=64, help_text="Merkle root over the period's events, in key order.")
    previous_hash = models.CharField(max_length=64, help_text="The previous checkpoint's hash (zeros for the first).")
    checkpoint_hash = models.CharField(max_length=64, help_text="SHA-256 of this checkpoint's canonical JSON.")
    algorithm = models.CharField(max_length=16, default="hmac-sha256")
    key_id = models.CharField(max_length=32)
    signature = models.CharField(max_length=128)

    class Meta:
        ordering = ["number"]

    def __str__(self) -> str:
        return f"checkpoint {self.number} ({self.event_count} events)"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ValueError("checkpoints are written once")
        super().save(*args, **kwargs)


class RetentionTombstone(AppendOnly):
    """A signed statement: "these records were deleted (or emptied) by this retention rule".

    Written in the transaction that prunes, one per batch (actions.engine.retention). It names
    what went (the record type, how many, their key and time ranges, a SHA-256 over their
    hashes) and under which rule (the setting and its days, the cutoff), so that a gap in the
    records is an explained gap; its signature (HMAC with the trail's signing key, as a
    checkpoint's) shows that the console wrote it. ``checkpoint_counts`` says how many of the
    pruned audit events each checkpoint had covered: the trail's check accounts for them.
    """

    record_type = models.CharField(max_length=64)
    rule = models.CharField(max_length=64, help_text="The setting whose retention ran out.")
    retention_days = models.PositiveIntegerField()
    cutoff = models.DateTimeField()
    count = models.PositiveIntegerField()
    first_id = models.BigIntegerField(null=True, blank=True)
    last_id = models.BigIntegerField(null=True, blank=True)
    first_at = models.DateTimeField(null=True, blank=True)
    last_at = models.DateTimeField(null=True, blank=True)
    digest = models.CharField(max_length=64, help_text="SHA-256 over the pruned records' hashes, in key order.")
    checkpoint_counts = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    algorithm = models.CharField(max_length=16, default="hmac-sha256")
    key_id = models.CharField(max_length=32)
    signature = models.CharField(max_length=128)
    # The writing transaction's id (PostgreSQL): the append-only guard lets an archived event be
    # pruned only under a tombstone of the same transaction, never under an older one whose key
    # range happens to cover it. Not signed: it says nothing of what went.
    txid = models.BigIntegerField(null=True, blank=True, editable=False, db_default=CurrentTransactionId())

    objects = AppendOnlyQuerySet["RetentionTombstone"].as_manager()
    trail_name = "retention tombstones"

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.count} {self.record_type} pruned by {self.rule} at {self.created_at:%Y-%m-%d}"
