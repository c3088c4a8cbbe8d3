"""Two hosts, each with its worker and its beat: every periodic task runs once per period, and
when one host is SIGKILLed the other carries on within one period (actions.foundation.schedule).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from actions.foundation.sql import database_now
from actions.models import SchedulePeriod
from tests.processes import Worker, WorkerPool, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

ENTRY = "sweep-authorized"
TASK = "actions.tasks.sweep_authorized"
INTERVAL = 2  # seconds: short enough for a quick test, long enough for a period to hold both copies
RESULT = re.compile(rf"Task {re.escape(TASK)}\[[^\]]+\] succeeded in [0-9.e-]+s: (\S+)")


@pytest.fixture(autouse=True)
def short_timings(settings: Any) -> Iterator[None]:
    settings.SWEEP_INTERVAL_SECONDS = INTERVAL
    settings.LEASE_SECONDS = 4
    yield


@pytest.fixture(autouse=True)
def beat_stopped_with_its_worker(workers: WorkerPool) -> Iterator[None]:
    yield
    for worker in workers.workers:
        worker.stop()


def results(worker: Worker) -> tuple[int, int]:
    """How many of this host's copies of the sweep ran, and how many found their period taken."""
    found = RESULT.findall(worker.log())
    skipped = sum(1 for value in found if value == "None")
    return len(found) - skipped, skipped


def slot() -> SchedulePeriod | None:
    return SchedulePeriod.objects.filter(task=ENTRY).first()


def test_two_beats_run_each_period_once_and_a_survivor_takes_over(workers: WorkerPool) -> None:
    hosts = [workers.start(beat=True), workers.start(beat=True)]
    started = database_now()

    # Both beats send the sweep every period; wait until each host has seen copies refused.
    wait_until(
        lambda: all(sum(results(host)) >= 4 for host in hosts) and sum(results(h)[1] for h in hosts) >= 3,
        timeout=60,
        what="both beats to send several periods' sweeps",
    )
    row = slot()
    assert row is not None
    ran = sum(results(host)[0] for host in hosts)
    skipped = sum(results(host)[1] for host in hosts)
    elapsed_periods = (database_now() - started).total_seconds() / INTERVAL
    # Every copy that ran claimed a period of its own, and no period was claimed twice: the
    # claims counted by the database equal the runs that the two logs show, and there were no
    # more of them than periods elapsed (+1 for the period the hosts started in).
    assert ran == row.runs, (ran, row.runs)
    assert ran <= elapsed_periods + 1, (ran, elapsed_periods)
    assert skipped >= 3, "the second beat's copies were refused"

    # SIGKILL the host that ran the latest period, beat included (its whole process group).
    victim = next(host for host in hosts if row.host.endswith(f":{host.process.pid}"))
    survivor = next(host for host in hosts if host is not victim)
    victim.kill()
    killed_at = database_now()
    killed_wall = time.monotonic()

    def survivor_ran() -> SchedulePeriod | None:
        current = slot()
        if (
            current
            and current.started_at
            and current.host.endswith(f":{survivor.process.pid}")
            and current.started_at > killed_at
        ):
            return current
        return None

    taken_over = wait_until(survivor_ran, timeout=6 * INTERVAL, what="the surviving host to run the sweep")
    assert taken_over.started_at is not None
    took = (taken_over.started_at - killed_at).total_seconds()
    sys.stderr.write(
        f"\ntimeline: two beats, period {INTERVAL}s; {ran} runs and {skipped} refused copies before the kill;"
        f" host pid {victim.process.pid} killed; pid {survivor.process.pid} ran the next period"
        f" {took:.2f}s later ({time.monotonic() - killed_wall:.2f}s by the test's clock)\n"
    )
    # Within one period (plus the beat's own tick and a worker's pick-up).
    assert took <= 2 * INTERVAL, took
    # And it keeps running every period after.
    runs_after_takeover = taken_over.runs
    wait_until(
        lambda: (slot() or taken_over).runs >= runs_after_takeover + 2, timeout=6 * INTERVAL, what="more periods"
    )
