"""Prometheus metrics: how many actions wait in each unresolved state, and for how long; how
many reached each final state; the periodic tasks' liveness; the ledger audit's latest run; the
receivers' rate-limit buckets.

Exposed at /metrics in Prometheus's text exposition format (prometheus_client renders it, so
the format is the ecosystem's own, not an imitation). Collected at scrape time from the
database (grouped queries) and the rate limits' store, so the numbers are never stale.
console/deploy/prometheus-rules.yml alerts on them and console/deploy/grafana-dashboard.json
shows them (tests/console/test_dashboard.py keeps both to the names exported here).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from datetime import datetime

from django.conf import settings
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from actions.engine.throttle import throttle_states
from actions.foundation.schedule import liveness
from actions.models import Action, ActionStatus, Discrepancy, LedgerAuditRun, Remedy
from actions.models.actions import TERMINAL_STATUSES

# AUTHORIZED: approved and waiting to be sent (for a worker, or held by a receiver's rate limit).
WATCHED = (
    ActionStatus.AUTHORIZED,
    ActionStatus.SUBMITTING,
    ActionStatus.UNKNOWN,
    ActionStatus.SETTLING,
    ActionStatus.NEEDS_REVIEW,
)


class ConsoleCollector(Collector):
    def collect(self) -> Iterator[Metric]:
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
        thresholds = GaugeMetricFamily(
            "console_schedule_stale_threshold_seconds",
            "The age past which console_schedule_stale turns 1: SCHEDULE_STALE_PERIODS of the task's intervals.",
            labels=["task"],
        )
        for row in liveness():
            ages.add_metric([row.entry], row.age_seconds if row.age_seconds is not None else -1)
            stale.add_metric([row.entry], 1 if row.stale else 0)
            thresholds.add_metric([row.entry], row.threshold_seconds)
        yield ages
        yield stale
        yield thresholds
        yield from self.finished()
        yield from self.ledger_audit(now)
        yield from self.throttle()

    @staticmethod
    def finished() -> Iterator[Metric]:
        """Actions in each final state: a counter (final states are never left), whose rate is
        the rate at which outcomes are recorded."""
        counts = dict(
            Action.objects.filter(status__in=TERMINAL_STATUSES).values_list("status").annotate(count=Count("pk"))
        )
        finished = CounterMetricFamily(
            "console_actions_finished", "Actions that reached each final state.", labels=["state"]
        )
        for state in sorted(TERMINAL_STATUSES):
            finished.add_metric([state], counts.get(state, 0))
        yield finished

    @staticmethod
    def ledger_audit(now: datetime) -> Iterator[Metric]:
        """The latest finished run of the ledger audit: when, what it found, whether it could
        read every ledger."""
        run = LedgerAuditRun.objects.filter(finished_at__isnull=False).order_by("-finished_at").first()
        age = GaugeMetricFamily(
            "console_ledger_audit_last_run_age_seconds",
            "Seconds since the latest ledger audit finished; -1 if none ever did.",
        )
        found = GaugeMetricFamily(
            "console_ledger_audit_discrepancies",
            "Discrepancies the latest ledger audit found: all of them, and those new in that run.",
            labels=["which"],
        )
        failed = GaugeMetricFamily(
            "console_ledger_audit_failed", "1 when the latest ledger audit could not read a receiver's ledger."
        )
        age.add_metric([], (now - run.finished_at).total_seconds() if run and run.finished_at else -1)
        found.add_metric(["found"], run.discrepancies_found if run else 0)
        found.add_metric(["new"], run.discrepancies_new if run else 0)
        failed.add_metric([], 1 if run and run.error else 0)
        yield age
        yield found
        yield failed

    @staticmethod
    def throttle() -> Iterator[Metric]:
        """Each rate-limited receiver's bucket (RECEIVER_RATE_LIMITS); none without limits."""
        limit = GaugeMetricFamily(
            "console_receiver_rate_limit", "Calls a receiver allows per window.", labels=["receiver"]
        )
        remaining = GaugeMetricFamily(
            "console_receiver_rate_remaining", "Calls left in the receiver's current window.", labels=["receiver"]
        )
        paused = GaugeMetricFamily(
            "console_receiver_paused_seconds",
            "Seconds left of the pause a receiver's Retry-After asked for (0: none).",
            labels=["receiver"],
        )
        for state in throttle_states():
            limit.add_metric([state.receiver], state.limit)
            remaining.add_metric([state.receiver], state.remaining)
            paused.add_metric([state.receiver], state.paused_seconds)
        yield limit
        yield remaining
        yield paused


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
