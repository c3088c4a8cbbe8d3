"""Periodic work runs once per period however many hosts run beat (actions.foundation.schedule)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from actions.foundation import schedule
from actions.foundation.schedule import liveness, once_per_period, period_claim, period_finish, period_start
from actions.foundation.sql import database_now
from actions.models import SchedulePeriod

pytestmark = pytest.mark.django_db

ENTRY = "sweep-authorized"


def test_one_claim_per_period_whatever_the_number_of_hosts() -> None:
    interval = 3600.0  # long enough that the test cannot cross a period's end
    assert period_claim(ENTRY, interval, host="a") is True
    assert period_claim(ENTRY, interval, host="b") is False
    assert period_claim(ENTRY, interval, host="a") is False
    row = SchedulePeriod.objects.get(task=ENTRY)
    assert (row.runs, row.host) == (1, "a")
    assert row.period_start == period_start(database_now(), interval)

    # The next period: the row's period is moved back as if an hour had passed.
    SchedulePeriod.objects.filter(task=ENTRY).update(period_start=row.period_start - timedelta(seconds=interval))
    assert period_claim(ENTRY, interval, host="b") is True
    assert period_claim(ENTRY, interval, host="a") is False
    row.refresh_from_db()
    assert (row.runs, row.host) == (2, "b")


@pytest.mark.parametrize("skew", [-120, 120])
def test_hosts_whose_clocks_disagree_still_agree_on_the_period(monkeypatch: pytest.MonkeyPatch, skew: int) -> None:
    """The period is counted on the database's clock: a host whose own clock is two minutes off
    neither claims a period that another host already ran nor misses one."""
    interval = 3600.0
    assert period_claim(ENTRY, interval, host="right") is True
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + timedelta(seconds=skew))
    assert period_claim(ENTRY, interval, host="skewed") is False
    assert SchedulePeriod.objects.get(task=ENTRY).runs == 1


def test_a_beat_copy_runs_the_task_once_per_period_and_a_direct_call_always_runs() -> None:
    calls: list[str] = []

    @once_per_period(ENTRY)
    def sweep() -> int:
        calls.append("ran")
        return 7

    assert sweep(scheduled=True) == 7
    assert sweep(scheduled=True) is None  # another host's copy, in the same period
    assert sweep() == 7  # a person or a test calling it: no period to claim
    assert calls == ["ran", "ran"]
    assert SchedulePeriod.objects.get(task=ENTRY).finished_at is not None


def test_every_beat_entry_claims_its_own_period(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each entry's task, sent as beat sends it, claims the period of that same entry."""
    from actions import tasks

    claimed: list[str] = []

    def taken(entry: str, interval: float) -> bool:
        claimed.append(entry)
        return False

    monkeypatch.setattr(schedule, "period_claim", taken)
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        assert entry["kwargs"] == {"scheduled": True}, name
        task = getattr(tasks, entry["task"].rsplit(".", 1)[1])
        assert task(**entry["kwargs"]) is None, name  # the period was taken: the body did not run
        assert claimed[-1] == name


def test_a_task_is_stale_after_missing_its_periods(settings: Any) -> None:
    settings.SCHEDULE_STALE_PERIODS = 3
    interval = float(settings.CELERY_BEAT_SCHEDULE[ENTRY]["schedule"])
    assert {row.entry: row.stale for row in liveness()}[ENTRY] is True  # never ran

    assert period_claim(ENTRY, interval)
    period_finish(ENTRY)
    row = {row.entry: row for row in liveness()}[ENTRY]
    assert not row.stale
    assert row.age_seconds is not None and row.age_seconds < interval

    SchedulePeriod.objects.filter(task=ENTRY).update(finished_at=database_now() - timedelta(seconds=4 * interval))
    assert {row.entry: row.stale for row in liveness()}[ENTRY] is True


def test_readyz_and_the_metrics_say_when_the_sweeps_last_ran(settings: Any, client: Client) -> None:
    settings.METRICS_TOKEN = "a-scraper-token-long-enough-for-the-check"
    interval = float(settings.CELERY_BEAT_SCHEDULE[ENTRY]["schedule"])
    assert period_claim(ENTRY, interval)
    period_finish(ENTRY)

    body = client.get("/readyz").json()
    report = body["schedule"]
    # The other entries never ran in this test: known to the schedule since the first period,
    # they wait for their first, and are not stale before their threshold.
    assert report["status"] == "ok", report
    assert report["last_finished_seconds_ago"][ENTRY] < interval
    assert report["last_finished_seconds_ago"]["ledger-audit"] is None

    text = client.get("/metrics", headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"}).content.decode()
    assert f'console_schedule_stale{{task="{ENTRY}"}} 0.0' in text
    assert 'console_schedule_stale{task="ledger-audit"} 0.0' in text
    assert f'console_schedule_last_finished_age_seconds{{task="{ENTRY}"}}' in text

    # Known for longer than its threshold and never finished: stale.
    threshold = float(settings.CELERY_BEAT_SCHEDULE["ledger-audit"]["schedule"]) * settings.SCHEDULE_STALE_PERIODS
    SchedulePeriod.objects.filter(task="ledger-audit").update(
        started_at=database_now() - timedelta(seconds=threshold + 1)
    )
    assert "ledger-audit" in client.get("/readyz").json()["schedule"]["stale"]

    # One that claims its period every interval and never finishes (it fails every time) is
    # stale once it has claimed as many periods as its threshold counts.
    SchedulePeriod.objects.filter(task="ledger-audit").update(
        started_at=database_now(), runs=settings.SCHEDULE_STALE_PERIODS - 1
    )
    assert "ledger-audit" not in client.get("/readyz").json()["schedule"]["stale"]
    SchedulePeriod.objects.filter(task="ledger-audit").update(runs=settings.SCHEDULE_STALE_PERIODS)
    assert "ledger-audit" in client.get("/readyz").json()["schedule"]["stale"]


def test_the_database_clock_is_an_aware_utc_time_close_to_ours() -> None:
    now = database_now()
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    assert abs((now - timezone.now()).total_seconds()) < 5


def test_period_start_is_a_grid_on_the_epoch() -> None:
    moment = schedule.EPOCH + timedelta(seconds=3 * 3600 + 125.5)
    assert period_start(moment, 60) == schedule.EPOCH + timedelta(seconds=3 * 3600 + 120)
    assert period_start(moment, 3600) == schedule.EPOCH + timedelta(seconds=3 * 3600)
