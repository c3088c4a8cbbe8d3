"""A small chaos run in CI: real processes, kills, faults, a PostgreSQL restart, a Redis flush.

The large run (5,000+ actions) is `manage.py chaos_run --actions 5000`; see README.md.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from django.db import connection

from actions.chaos import ChaosConfig, ChaosRun

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.processes,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def test_a_small_chaos_run_ends_with_no_duplicate_and_nothing_lost(
    broker_url: str, settings: Any, tmp_path: Any
) -> None:
    """Invariants 1, 2, 5 and 8 hold after 300 actions under worker kills, provider faults, a
    PostgreSQL restart and a Redis flush, audited against the sandbox's own ledger."""
    settings.CELERY_BROKER_URL = broker_url
    config = ChaosConfig(actions=300, workers=3, kill_every_seconds=4.0, drain_deadline_seconds=300, seed=7)

    report = ChaosRun(config, workdir=tmp_path).run()
    connection.close()  # the restart left this process's connection broken; the flush needs a new one

    sys.stdout.write("\n".join(report.lines()) + "\n")
    assert report.audit is not None
    assert report.drained, "some actions were neither final nor with a person when the deadline passed"
    assert report.audit.duplicates == 0
    assert report.audit.lost == 0
    assert report.audit.ok, [str(v) for v in report.audit.violations]
    assert report.kills > 0 and report.postgres_restarts == 1 and report.redis_flushes == 1
    assert sum(report.faults_fired.values()) > 0, "the provider injected no fault"
    # Supplier emails (issue 13): every one proposed, none sent twice without a person's decision
    # (audit.ok above), and every ambiguous send held for a named person.
    assert report.emails_proposed == config.emails
    assert report.ambiguous_unowned == 0
    assert sum(report.mail_faults_fired.values()) > 0, "the mail sandbox injected no fault"
