"""/metrics: how many actions wait in each unresolved state, and for how long (Prometheus text).

The actions are put into their states through the services, each at an explicit time: a
submission begun in the past and swept to UNKNOWN when its lease expired, as the beat sweep does.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.sweeps import sweep_expired_leases
from actions.models import Action, ActionStatus
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
