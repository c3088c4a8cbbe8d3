"""/metrics: how many actions wait in each unresolved state, and for how long (Prometheus text).

The actions are put into their states through the services, each at an explicit time: a
submission begun in the past and swept to UNKNOWN when its lease expired, as the beat sweep does.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from actions.engine import throttle
from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.sweeps import sweep_expired_leases
from actions.engine.throttle import throttle_pause, throttle_wait
from actions.models import Action, ActionStatus, LedgerAuditRun
from actions.services import Actor
from tests.actions.test_reconciliation import authorized_refund

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus
TOKEN = "scrape-me-please"


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


def submitting_since(proposer: Actor, started_at: datetime) -> Action:
    action = authorized_refund(proposer)
    claim = submission_begin(action_pk=action.pk, now=started_at)
    assert claim.outcome == ClaimOutcome.CLAIMED
    return Action.objects.get(pk=action.pk)


def unknown_since(proposer: Actor, unknown_at: datetime, settings: Any) -> Action:
    """Begun one lease before ``unknown_at``; the lease sweep moves it to UNKNOWN at ``unknown_at``."""
    action = submitting_since(proposer, unknown_at - timedelta(seconds=settings.LEASE_SECONDS + 1))
    assert sweep_expired_leases(now=unknown_at) == 1
    action.refresh_from_db()
    assert action.status == S.UNKNOWN and action.status_changed_at == unknown_at
    return action


def scrape(client: Client, **headers: str) -> dict[tuple[str, str], float]:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {
        (sample.name, sample.labels.get("state", sample.labels.get("kind", ""))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def test_metrics_count_the_unknown_actions_and_the_age_of_the_oldest(
    client: Client, agent_actor: Actor, settings: Any
) -> None:
    """Invariant 8, made visible: an operator sees how many actions are UNKNOWN and how long the
    oldest has waited, so none can sit there unnoticed."""
    settings.METRICS_TOKEN = ""
    settings.PRODUCTION_MODE = False  # open without a token only outside production mode
    now = timezone.now()
    oldest = now - timedelta(hours=2)
    for unknown_at in (oldest, now - timedelta(hours=1), now - timedelta(minutes=5)):
        unknown_since(agent_actor, unknown_at, settings)
    submitting_since(agent_actor, now)

    metrics = scrape(client)

    assert metrics[("console_actions", "UNKNOWN")] == 3
    assert metrics[("console_actions", "SUBMITTING")] == 1
    assert metrics[("console_actions", "SETTLING")] == 0
    assert metrics[("console_actions", "NEEDS_REVIEW")] == 0
    age = metrics[("console_actions_oldest_age_seconds", "UNKNOWN")]
    expected = (timezone.now() - oldest).total_seconds()
    assert expected - 60 <= age <= expected
    assert metrics[("console_actions_oldest_age_seconds", "SUBMITTING")] < 60
    assert metrics[("console_actions_oldest_age_seconds", "NEEDS_REVIEW")] == 0


def test_with_a_metrics_token_a_scraper_must_send_it(client: Client, agent_actor: Actor, settings: Any) -> None:
    """Invariant 8's dashboard is not public once a token is configured."""
    settings.METRICS_TOKEN = TOKEN
    unknown_since(agent_actor, timezone.now() - timedelta(minutes=1), settings)

    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer not-the-token"}).status_code == 401
    assert scrape(client, Authorization=f"Bearer {TOKEN}")[("console_actions", "UNKNOWN")] == 1


def samples(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an open scrape, by name and all its labels."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


@pytest.fixture
def open_metrics(settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    settings.PRODUCTION_MODE = False


def test_metrics_count_the_approved_actions_waiting_to_be_sent_and_the_final_ones(
    client: Client, agent_actor: Actor, settings: Any, open_metrics: None
) -> None:
    authorized_refund(agent_actor)
    authorized_refund(agent_actor)
    done = authorized_refund(agent_actor)
    Action.objects.filter(pk=done.pk).update(status=S.SUCCEEDED)

    metrics = scrape(client)

    assert metrics[("console_actions", "AUTHORIZED")] == 2
    assert metrics[("console_actions_oldest_age_seconds", "AUTHORIZED")] < 60
    assert metrics[("console_actions_finished_total", "SUCCEEDED")] == 1
    assert metrics[("console_actions_finished_total", "FAILED_FINAL")] == 0


def test_metrics_give_each_periodic_tasks_stale_threshold(client: Client, settings: Any, open_metrics: None) -> None:
    settings.SCHEDULE_STALE_PERIODS = 3
    metrics = samples(client)

    for entry, beat in settings.CELERY_BEAT_SCHEDULE.items():
        threshold = metrics[("console_schedule_stale_threshold_seconds", (("task", entry),))]
        assert threshold == 3 * float(beat["schedule"]), entry


def test_metrics_report_the_latest_ledger_audit(client: Client, open_metrics: None) -> None:
    assert samples(client)[("console_ledger_audit_last_run_age_seconds", ())] == -1
    now = timezone.now()
    LedgerAuditRun.objects.create(
        started_at=now - timedelta(hours=2), finished_at=now - timedelta(hours=2), discrepancies_found=9
    )
    LedgerAuditRun.objects.create(
        started_at=now - timedelta(minutes=11),
        finished_at=now - timedelta(minutes=10),
        discrepancies_found=3,
        discrepancies_new=1,
        error="Could not read the receiver's ledger: timeout",
    )

    metrics = samples(client)

    assert 600 <= metrics[("console_ledger_audit_last_run_age_seconds", ())] < 660
    assert metrics[("console_ledger_audit_discrepancies", (("which", "found"),))] == 3
    assert metrics[("console_ledger_audit_discrepancies", (("which", "new"),))] == 1
    assert metrics[("console_ledger_audit_failed", ())] == 1


def test_metrics_show_each_limited_receivers_bucket(
    client: Client, settings: Any, open_metrics: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = f"receiver-{uuid.uuid4().hex[:8]}"  # the in-memory buckets outlive a test
    settings.RECEIVER_RATE_LIMIT_STORAGE = "memory://"
    settings.RECEIVER_RATE_LIMITS = {receiver: "5/minute"}
    monkeypatch.setattr(throttle, "_store_down_until", 0.0)
    labels = (("receiver", receiver),)
    assert samples(client)[("console_receiver_rate_remaining", labels)] == 5

    throttle_wait(receiver)
    throttle_wait(receiver)
    throttle_pause(receiver, 30)  # outside a transaction: at once

    metrics = samples(client)
    assert metrics[("console_receiver_rate_limit", labels)] == 5
    assert metrics[("console_receiver_rate_remaining", labels)] == 3
    assert 25 <= metrics[("console_receiver_paused_seconds", labels)] <= 30
