"""The sandbox's webhooks: events stored with the change that caused them, then delivered,
signed as Stripe signs them, to the configured endpoint, with retries.

An event row is written in the same SQLite transaction as the refund it describes (an outbox),
so a crash cannot lose an event for a stored refund or send one for a refund that was rolled
back. One sender thread delivers pending events oldest first. A delivery that does not get a
2xx is retried with exponential backoff (capped), for ever, as long as the sandbox runs: the
console answers 200 to a replay, so retrying too often is harmless.

The signature is Stripe's scheme: ``Stripe-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of
"<t>.<body>" under the endpoint's secret>``, which ``stripe.Webhook.construct_event`` checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL,
    payload TEXT NOT NULL,
    created REAL NOT NULL,
    delivered_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error TEXT
);
CREATE INDEX IF NOT EXISTS events_pending ON events (delivered_at, next_attempt_at, seq);
"""

EVENT_TYPES = frozenset({"charge.refunded", "refund.created", "refund.updated", "refund.failed"})


def sign(payload: bytes, secret: str, timestamp: int) -> str:
    signed = f"{timestamp}.".encode() + payload
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


@dataclass
class WebhookEndpoint:
    """Where events go. No URL: no events are recorded (as with no endpoint at Stripe)."""

    url: str = ""
    secret: str = "whsec_sandbox"  # noqa: S105 - the sandbox's well-known test secret
    enabled_events: set[str] = field(default_factory=lambda: set(EVENT_TYPES))
    retry_base_seconds: float = 0.5
    retry_max_seconds: float = 10.0
    timeout_seconds: float = 10.0

    def update(self, values: dict[str, Any]) -> None:
        known = {"url", "secret", "enabled_events", "retry_base_seconds", "retry_max_seconds", "timeout_seconds"}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown webhook keys: {sorted(unknown)}; known: {sorted(known)}")
        for name in ("url", "secret"):
            if name in values:
                if not isinstance(values[name], str):
                    raise ValueError(f"{name} must be a string")
                setattr(self, name, values[name])
        if "enabled_events" in values:
            events = values["enabled_events"]
            if not isinstance(events, list) or not set(events) <= EVENT_TYPES:
                raise ValueError(f"enabled_events must be a list of {sorted(EVENT_TYPES)}")
            self.enabled_events = set(events)
        for name in ("retry_base_seconds", "retry_max_seconds", "timeout_seconds"):
            if name in values:
                value = values[name]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise ValueError(f"{name} must be a positive number")
                setattr(self, name, float(value))

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "enabled_events": sorted(self.enabled_events),
            "retry_base_seconds": self.retry_base_seconds,
            "retry_max_seconds": self.retry_max_seconds,
            "timeout_seconds": self.timeout_seconds,
        }


def record(db: sqlite3.Connection, endpoint: WebhookEndpoint, event_type: str, obj: dict[str, Any], now: float) -> None:
    """Store an event in the caller's transaction, if an endpoint wants it."""
    if not endpoint.url or event_type not in endpoint.enabled_events:
        return
    event_id = "evt_" + secrets.token_hex(12)
    payload = {
        "id": event_id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": int(now),
        "data": {"object": obj},
        "livemode": False,
        "pending_webhooks": 1,
        "type": event_type,
    }
    db.execute(
        "INSERT INTO events (id, type, payload, created, next_attempt_at) VALUES (?, ?, ?, ?, ?)",
        (event_id, event_type, json.dumps(payload), now, now),
    )


class WebhookSender:
    """One thread that delivers pending events, oldest first."""

    def __init__(self, *, connect: Any, endpoint: WebhookEndpoint, lock: threading.RLock) -> None:
        self._connect = connect  # a function returning the sandbox's shared connection
        self.endpoint = endpoint
        self._lock = lock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sandbox-webhooks", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.is_set():
            delivered_any = False
            # The database closes under the thread at shutdown; the loop then ends with _stop.
            with contextlib.suppress(sqlite3.Error):
                delivered_any = self._deliver_due()
            if not delivered_any:
                self._wake.wait(0.2)
                self._wake.clear()

    def _deliver_due(self) -> bool:
        if not self.endpoint.url:
            return False
        with self._lock:
            rows = (
                self._connect()
                .execute(
                    "SELECT id, payload, attempts FROM events WHERE delivered_at IS NULL AND next_attempt_at <= ? "
                    "ORDER BY seq LIMIT 20",
                    (time.time(),),
                )
                .fetchall()
            )
        for event_id, payload, attempts in rows:
            if self._stop.is_set():
                return False
            error = self._post(payload.encode())
            with self._lock:
                db = self._connect()
                if error is None:
                    db.execute(
                        "UPDATE events SET delivered_at = ?, attempts = attempts + 1 WHERE id = ?",
                        (time.time(), event_id),
                    )
                else:
                    backoff = self.endpoint.retry_base_seconds * (2 ** min(attempts, 16))
                    delay = min(backoff, self.endpoint.retry_max_seconds)
                    db.execute(
                        "UPDATE events SET attempts = attempts + 1, next_attempt_at = ?, last_error = ? WHERE id = ?",
                        (time.time() + delay, error[:500], event_id),
                    )
        return bool(rows)

    def _post(self, payload: bytes) -> str | None:
        """None on a 2xx; the error otherwise."""
        request = urllib.request.Request(  # noqa: S310 - the endpoint the test or operator configured
            self.endpoint.url,
            data=payload,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Stripe-Signature": sign(payload, self.endpoint.secret, int(time.time())),
                "User-Agent": "effect-sandbox-webhooks/1",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.endpoint.timeout_seconds) as response:  # noqa: S310
                response.read()
                return None if 200 <= response.status < 300 else f"HTTP {response.status}"
        except urllib.error.HTTPError as error:
            return f"HTTP {error.code}"
        except (urllib.error.URLError, OSError) as error:
            return f"{type(error).__name__}: {error}"


def status(db: sqlite3.Connection) -> dict[str, Any]:
    (total, delivered, pending, attempts) = db.execute(
        "SELECT COUNT(*), COUNT(delivered_at), COUNT(*) - COUNT(delivered_at), COALESCE(SUM(attempts), 0) FROM events"
    ).fetchone()
    return {"events": total, "delivered": delivered, "pending": pending, "delivery_attempts": attempts}
