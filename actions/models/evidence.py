"""Checkpoints of the audit trail: a signed Merkle root over the events of a period, each
linked to the one before (actions.evidence.checkpoints, docs/evidence.md)."""

from __future__ import annotations

from typing import Any

from django.db import models


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
