from __future__ import annotations

from django.db import models


class SchedulePeriod(models.Model):
    """The last period in which one periodic task ran, as a compare-and-set slot.

    Every host runs Celery beat, so every host sends every periodic task. Whoever moves
    ``period_start`` forward first runs the task for that period; the others find the period
    taken and do nothing (actions.foundation.schedule). One row per task, whatever the number of
    hosts: nothing grows. ``finished_at`` is what the liveness checks read.
    """

    task = models.CharField(max_length=100, unique=True)
    period_start = models.DateTimeField()
    runs = models.PositiveBigIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    host = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["task"]

    def __str__(self) -> str:
        return f"{self.task} (period from {self.period_start:%Y-%m-%d %H:%M:%S})"
