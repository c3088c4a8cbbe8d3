from __future__ import annotations

import zoneinfo

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from actions.models.agent_webhooks import NotificationKind


def validate_time_zone(value: str) -> None:
    if value not in zoneinfo.available_timezones():
        raise ValidationError(f"{value!r} is not a time zone name such as 'Europe/Berlin'.")


class UserSettings(models.Model):
    """One person's own choices: the time zone their pages are shown in, and which notifications
    they receive. Created on first use with the defaults below (``UserSettings.for_user``)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="console_settings")
    time_zone = models.CharField(max_length=64, default=settings.TIME_ZONE, validators=[validate_time_zone])
    notify_waiting_proposals = models.BooleanField(
        default=True, help_text="Managers: e-mail me when proposals have waited longer than the limit below."
    )
    waiting_minutes = models.PositiveIntegerField(
        default=30, help_text="How long a proposal may wait before a manager is told."
    )
    notify_escalations = models.BooleanField(default=True, help_text="E-mail me when an item is escalated to me.")
    notify_overdue = models.BooleanField(default=True, help_text="E-mail me when an item I own is overdue.")

    class Meta:
        verbose_name = "user settings"
        verbose_name_plural = "user settings"

    def __str__(self) -> str:
        return f"settings of {self.user}"

    @classmethod
    def for_user(cls, user: models.Model) -> UserSettings:
        found, _ = cls.objects.get_or_create(user=user)
        return found


class Notification(models.Model):
    """One thing a person was told, shown in the console under the bell (``/notifications/``).

    Written by ``actions.notifications`` in the same transaction, and from the same decision,
    as the e-mail about it: whoever is e-mailed about an item also finds it here, with its link.
    """

    recipient = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    kind = models.CharField(max_length=32, choices=NotificationKind.choices)
    title = models.CharField(max_length=300)
    link = models.CharField(max_length=300, help_text="The item's page in the console, a path: /review/actions/12/.")
    created_at = models.DateTimeField(default=timezone.now)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["recipient", "read_at"], name="notification_unread_idx")]

    def __str__(self) -> str:
        return f"{self.title} to {self.recipient_id}"
