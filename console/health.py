"""Health endpoints for load balancers and orchestrators, and the Celery workers' health check.

- ``/healthz``: the web process is alive and answers. It touches nothing else, so a database
  outage does not make an orchestrator restart healthy web processes in a loop.
- ``/readyz``: this process can serve: the database answers, every migration is applied, and
  the broker accepts connections. 503 otherwise, naming the failing check, so that a load
  balancer sends no traffic to a process that would fail it (or to a new release whose
  migrations have not run yet). Its body also says when each periodic task (the sweeps, the
  audit) last finished and whether that is stale; a stale schedule does not make the process
  unready, because a web process serves well without beat, and taking every web process out of
  the load balancer would turn a lost scheduler into a full outage. Alert on it instead
  (console_schedule_stale in /metrics).

Both are answered by the first middleware, before host validation and the HTTPS redirect: a
probe addresses the process by its IP over plain HTTP, and neither is a page anyone browses.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse
from kombu import Connection

from actions.foundation.schedule import liveness

logger = logging.getLogger(__name__)

HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
# Each check must answer well inside a probe's usual timeout (a few seconds).
BROKER_TIMEOUT_SECONDS = 1.0

# Migrations, once all applied, stay applied for the life of this process's code: the check is
# repeated only until it first passes (a migration graph costs tens of milliseconds to load).
_migrations_applied = False


def database_check() -> str | None:
    """None when the database answers, else why not."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return f"database unreachable: {type(exc).__name__}"
    return None


def migrations_check() -> str | None:
    global _migrations_applied
    if _migrations_applied:
        return None
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        return f"migrations unknown: {type(exc).__name__}"
    if plan:
        return f"{len(plan)} migrations not applied (run manage.py migrate)"
    _migrations_applied = True
    return None


def broker_check() -> str | None:
    try:
        with Connection(
            settings.CELERY_BROKER_URL,
            transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
            connect_timeout=BROKER_TIMEOUT_SECONDS,
        ) as broker:
            broker.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_SECONDS)
    except Exception as exc:
        # Any failure to connect is "not ready"; the probe must never itself fail with a 500.
        return f"broker unreachable: {type(exc).__name__}"
    return None


CHECKS: dict[str, Callable[[], str | None]] = {
    "database": database_check,
    "migrations": migrations_check,
    "broker": broker_check,
}


def readiness() -> tuple[bool, dict[str, Any]]:
    results: dict[str, Any] = {}
    for name, check in CHECKS.items():
        started = time.monotonic()
        problem = check()
        results[name] = {"ok": problem is None, "ms": round((time.monotonic() - started) * 1000, 1)}
        if problem is not None:
            results[name]["error"] = problem
    return all(result["ok"] for result in results.values()), results


def _json(body: dict[str, Any], status: int) -> HttpResponse:
    response = HttpResponse(json.dumps(body), status=status, content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response


def health_response(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        response = _json({"status": "method not allowed"}, 405)
        response["Allow"] = "GET, HEAD"
        return response
    if request.path == "/healthz":
        return _json({"status": "alive"}, 200)
    ready, checks = readiness()
    if not ready:
        logger.warning("not ready: %s", json.dumps(checks))
    body: dict[str, Any] = {"status": "ready" if ready else "not ready", "checks": checks}
    if checks["database"]["ok"] and checks["migrations"]["ok"]:
        body["schedule"] = schedule_report()
    return _json(body, 200 if ready else 503)


def schedule_report() -> dict[str, Any]:
    """When each periodic task last finished ("the sweeps last ran N s ago"), and which are stale."""
    try:
        rows = liveness()
    except DatabaseError as exc:
        return {"status": "unknown", "error": type(exc).__name__}
    stale = [row.entry for row in rows if row.stale]
    return {
        "status": "stale" if stale else "ok",
        "stale": stale,
        "last_finished_seconds_ago": {
            row.entry: round(row.age_seconds, 1) if row.age_seconds is not None else None for row in rows
        },
    }


class HealthCheckMiddleware:
    """Answers /healthz and /readyz before any other middleware runs (see the module's doc)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path in HEALTH_PATHS:
            return health_response(request)
        return self.get_response(request)
