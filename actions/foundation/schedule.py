"""Periodic work that runs once per period, however many hosts run Celery beat.

Every host runs beat, so that none is the single one whose loss stops the sweeps. Each beat
sends every periodic task; the task first claims its period (``period_claim``): a
compare-and-set on its ``SchedulePeriod`` row that moves ``period_start`` to the period that
the database's clock is in. Exactly one claim per period succeeds; the other hosts' copies
return at once. If the host that claimed a period dies mid-run, the next period's claim goes to
a survivor: recovery waits at most one interval, and the sweeps' own locks (SKIP LOCKED, the
lease fence) keep even an overlapping run harmless.

Why not celery-redbeat's lock: it elects one beat through Redis, which the console otherwise
treats as holding nothing the database lacks; a lost lock key or a failover of Redis would
then decide who sweeps. The database is already the record, and a row per task costs one
UPDATE per period. See docs/architecture.md section 2 (the processes).

Periods are counted on the database's clock (``database_now``), not a host's: two hosts whose
clocks disagree still agree on which period it is.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import Any, TypeVar

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F

from actions.foundation.sql import database_now
from actions.models import SchedulePeriod

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The keyword a beat entry passes (settings.CELERY_BEAT_SCHEDULE) so that its task claims its
# period first; a direct call (a test, a person, another task) runs without one.
SCHEDULED = "scheduled"

Result = TypeVar("Result")


def period_start(now: datetime, interval: float) -> datetime:
    """The start of the period of length ``interval`` seconds that ``now`` falls in."""
    seconds = math.floor((now - EPOCH).total_seconds() / interval) * interval
    return EPOCH + timedelta(seconds=seconds)


def period_claim(task: str, interval: float, *, host: str | None = None) -> bool:
    """Claim this period's run of ``task``: True for exactly one caller per period."""
    now = database_now()
    start = period_start(now, interval)
    values: dict[str, Any] = {"period_start": start, "runs": F("runs") + 1, "started_at": now}
    values["host"] = (host or this_host())[:255]
    if SchedulePeriod.objects.filter(task=task, period_start__lt=start).update(**values):
        return True
    if SchedulePeriod.objects.filter(task=task).exists():
        return False
    # The task's first period ever: whoever inserts the row has claimed it.
    try:
        with transaction.atomic():
            SchedulePeriod.objects.create(task=task, period_start=start, runs=1, started_at=now, host=values["host"])
    except IntegrityError:
        return False
    schedule_known_since(now)
    return True


def schedule_known_since(now: datetime) -> None:
    """A row for every beat entry that has none yet, as of ``now``: "known to the schedule since,
    never run". An hourly task on a fresh deployment is then waiting for its first period, not
    stale, until it has been known for its stale threshold. Once per task's first period ever.
    The row's period is the epoch, so the task's first claim still moves it forward."""
    SchedulePeriod.objects.bulk_create(
        [
            SchedulePeriod(task=entry, period_start=EPOCH, runs=0, started_at=now)
            for entry in settings.CELERY_BEAT_SCHEDULE
        ],
        ignore_conflicts=True,
    )


def this_host() -> str:
    """The host name and process: which beat's copy ran a period, as /readyz and tests read it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def period_finish(task: str) -> None:
    SchedulePeriod.objects.filter(task=task).update(finished_at=database_now())


def interval_of(entry: str) -> float:
    schedule: dict[str, dict[str, Any]] = settings.CELERY_BEAT_SCHEDULE
    return float(schedule[entry]["schedule"])


def once_per_period(entry: str) -> Callable[[Callable[..., Result]], Callable[..., Result | None]]:
    """Make a periodic task claim its period when beat sends it (``scheduled=True``): only the
    claim's winner runs the body; the others return None. ``entry`` names the beat entry, whose
    interval is the period."""

    def decorate(function: Callable[..., Result]) -> Callable[..., Result | None]:
        @wraps(function)
        def run(*args: Any, **kwargs: Any) -> Result | None:
            if not kwargs.pop(SCHEDULED, False):
                return function(*args, **kwargs)
            if not period_claim(entry, interval_of(entry)):
                return None
            result = function(*args, **kwargs)
            period_finish(entry)
            return result

        return run

    return decorate


@dataclass(frozen=True)
class Liveness:
    """When one periodic task last finished, against the threshold past which it is stale."""

    entry: str
    age_seconds: float | None  # None: it never finished
    threshold_seconds: float
    # Before its first finished run: how long since the schedule last heard of it (its latest
    # claim, or another task's first period on this database), and how many periods it has
    # claimed; None: never heard of, no beat ever ran it.
    waiting_seconds: float | None = None
    claims: int = 0

    @property
    def stale(self) -> bool:
        if self.age_seconds is None:
            # A run that fails every time claims a period each interval and never finishes.
            return (
                self.waiting_seconds is None
                or self.waiting_seconds > self.threshold_seconds
                or self.claims >= settings.SCHEDULE_STALE_PERIODS
            )
        return self.age_seconds > self.threshold_seconds


def liveness() -> list[Liveness]:
    """Every beat entry's age since its last finished run, read against the database's clock.

    A task is stale past ``SCHEDULE_STALE_PERIODS`` of its own intervals: one missed period is
    a host lost and taken over; several in a row mean that no beat runs at all. One that never
    finished is stale once the schedule has known of it that long (a fresh deployment's hourly
    audit waits for its first period), and at once if no beat ever ran anything.
    """
    now = database_now()
    known = {
        task: (finished, started, runs)
        for task, finished, started, runs in SchedulePeriod.objects.values_list(
            "task", "finished_at", "started_at", "runs"
        )
    }
    rows = []
    for entry in sorted(settings.CELERY_BEAT_SCHEDULE):
        last, since, claims = known.get(entry, (None, None, 0))
        threshold = interval_of(entry) * settings.SCHEDULE_STALE_PERIODS
        rows.append(
            Liveness(
                entry=entry,
                age_seconds=_seconds_since(now, last),
                threshold_seconds=threshold,
                waiting_seconds=_seconds_since(now, since) if last is None else None,
                claims=claims if last is None else 0,
            )
        )
    return rows


def _seconds_since(now: datetime, moment: datetime | None) -> float | None:
    return max((now - moment).total_seconds(), 0.0) if moment is not None else None
