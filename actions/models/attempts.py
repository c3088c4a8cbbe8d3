from __future__ import annotations

from django.db import models


class AttemptKind(models.TextChoices):
    SUBMIT = "submit", "Submission"
    LOOKUP = "lookup", "Lookup"


class Attempt(models.Model):
    """One call to the receiver, so a person can connect decision -> operation -> response.

    The row is written before the call (with the request) and completed after it (with the
    response or error). A worker that lost its lease still completes its row: what the
    receiver said is evidence whoever holds the lease now.
    """

    action = models.ForeignKey("actions.Action", on_delete=models.PROTECT, related_name="attempts")
    kind = models.CharField(max_length=16, choices=AttemptKind.choices)
    lease_token = models.UUIDField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, blank=True)
    request = models.JSONField(default=dict, blank=True)
    response = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    outcome = models.CharField(max_length=32, blank=True, help_text="What the console concluded from the answer.")
    held_lease = models.BooleanField(null=True, help_text="Whether the worker still held the lease when it recorded.")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["started_at", "id"]
        indexes = [models.Index(fields=["action", "started_at"], name="attempt_action_started_idx")]

    def __str__(self) -> str:
        return f"{self.action_id} {self.kind} at {self.started_at:%Y-%m-%d %H:%M:%S}"

    @property
    def duration_ms(self) -> int | None:
        if self.finished_at is None:
            return None
        return int((self.finished_at - self.started_at).total_seconds() * 1000)
