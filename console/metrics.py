"""Prometheus metrics: how many actions wait in each unresolved state, and for how long.

Exposed at /metrics in Prometheus's text exposition format (prometheus_client renders it, so
the format is the ecosystem's own, not an imitation). Collected at scrape time from the
database with one grouped query, so the numbers are never stale.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.registry import Collector

from actions.foundation.schedule import liveness
from actions.models import Action, ActionStatus, Discrepancy, Remedy

WATCHED = (ActionStatus.SUBMITTING, ActionStatus.UNKNOWN, ActionStatus.SETTLING, ActionStatus.NEEDS_REVIEW)


class ConsoleCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = timezone.now()
        rows = {
            row["status"]: row
            for row in Action.objects.filter(status__in=WATCHED)
            .values("status")
            .annotate(count=Count("pk"), oldest=Min("status_changed_at"))
        }
        count = GaugeMetricFamily("console_actions", "Actions in each unresolved state.", labels=["state"])
        age = GaugeMetricFamily(
            "console_actions_oldest_age_seconds",
            "Age of the oldest action in each unresolved state, since it entered that state.",
            labels=["state"],
        )
        for state in WATCHED:
            row = rows.get(state)
            count.add_metric([state], row["count"] if row else 0)
            oldest = row["oldest"] if row else None
            age.add_metric([state], (now - oldest).total_seconds() if oldest else 0)
        yield count
        yield age
        open_items = GaugeMetricFamily("console_open_follow_ups", "Open remedies and discrepancies.", labels=["kind"])
        open_items.add_metric(["remedy"], Remedy.objects.exclude(status="done").count())
        open_items.add_metric(["discrepancy"], Discrepancy.objects.filter(status__in=["open", "in_progress"]).count())
        yield open_items
        ages = GaugeMetricFamily(
            "console_schedule_last_finished_age_seconds",
            "Seconds since each periodic task (sweeps, audit, housekeeping) last finished, on the database's clock; "
            "-1 if it never did.",
            labels=["task"],
        )
        stale = GaugeMetricFamily(
            "console_schedule_stale",
            "1 when a periodic task has not finished for SCHEDULE_STALE_PERIODS of its intervals: no beat runs it.",
            labels=["task"],
        )
        for row in liveness():
            ages.add_metric([row.entry], row.age_seconds if row.age_seconds is not None else -1)
            stale.add_metric([row.entry], 1 if row.stale else 0)
        yield ages
        yield stale


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Scrape endpoint. With METRICS_TOKEN set, a scraper must send it as a bearer token. In
    production mode an empty METRICS_TOKEN closes the endpoint rather than opening it."""
    token = settings.METRICS_TOKEN
    if not token and settings.PRODUCTION_MODE:
        return HttpResponse(
            "metrics are closed: set METRICS_TOKEN (production mode never serves them without one)\n",
            status=401,
            content_type="text/plain",
        )
    if token:
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(sent.encode(), token.encode()):
            return HttpResponse(
                "metrics need the bearer token from METRICS_TOKEN\n", status=401, content_type="text/plain"
            )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ConsoleCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
