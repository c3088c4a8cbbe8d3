"""The sandbox's behaviour: Stripe-shaped refunds, idempotency, faults, stored in SQLite.

``Sandbox.handle`` takes a parsed HTTP request and returns a ``Response``; ``server.py`` does the
HTTP. The two are apart so the rules can be read without the plumbing.

Every read and write of the database happens inside ``Sandbox._tx``, which holds one lock and one
``BEGIN IMMEDIATE`` transaction: concurrent requests are serialised, so two refunds racing for
the last euro of a charge cannot both pass the total check. Sleeps (slow answers, timeouts)
happen outside the lock, so one slow request never blocks the others.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from typing import Any
from urllib.parse import parse_qsl

from harness.sandboxes.payment import webhooks
from harness.sandboxes.payment.faults import Fault, FaultError, FaultPlan
from harness.sandboxes.payment.webhooks import WebhookEndpoint, WebhookSender

__all__ = ["Request", "Response", "Sandbox", "SandboxConfig"]

IDEMPOTENCY_KEY_MAX_LENGTH = 255
REFUND_REASONS = frozenset({"duplicate", "fraudulent", "requested_by_customer"})
# Refunds that hold part of the charge. A failed or canceled refund gives its amount back.
COUNTING_STATUSES = ("succeeded", "pending", "requires_action")  # one "?" each below
REFUND_PARAMS = frozenset({"charge", "amount", "reason", "metadata", "currency", "expand"})
_COUNTED_TOTAL_SQL = "SELECT COALESCE(SUM(amount), 0) FROM refunds WHERE charge = ? AND status IN (?, ?, ?)"
LIST_PARAMS = frozenset({"charge", "created", "limit", "starting_after", "ending_before", "expand"})
# Stripe's range filter on a list's ``created``: created[gte]=..., or created=<seconds> for one second.
CREATED_OPERATORS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
CHARGE_LIST_PARAMS = frozenset({"limit", "starting_after", "ending_before", "expand"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
    id TEXT PRIMARY KEY,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    created INTEGER NOT NULL,
    metadata TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS refunds (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    charge TEXT NOT NULL REFERENCES charges(id),
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    metadata TEXT NOT NULL,
    created INTEGER NOT NULL,
    created_at REAL NOT NULL,
    visible_at REAL NOT NULL,
    settle_at REAL,
    settle_outcome TEXT,
    failure_reason TEXT,
    idempotency_key TEXT,
    planted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS refunds_charge ON refunds (charge, seq);
-- The ledger audit lists one span of creation times at a time (created[gte], created[lt]).
CREATE INDEX IF NOT EXISTS refunds_created ON refunds (created, seq);
-- Every transaction settles what is due first (_settle_due): without this index that was a scan
-- of every refund ever made, under the sandbox's one lock, so the sandbox slowed as its ledger grew
-- (the dispatch benchmark's later repetitions, a long chaos run).
CREATE INDEX IF NOT EXISTS refunds_pending_settle ON refunds (settle_at) WHERE status = 'pending';
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    -- Names this use of the key, so a request that outlived a reset cannot touch a newer row.
    token TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('in_flight', 'done')),
    created_at REAL NOT NULL,
    status_code INTEGER,
    body TEXT
);
"""


@dataclass
class SandboxConfig:
    """Settings that tests change at run time through POST /_sandbox/config."""

    key_retention_seconds: float = 24 * 3600.0
    lookup_visibility_delay_seconds: float = 0.0
    pending_settle_after_seconds: float = 5.0
    pending_outcome: str = "succeeded"

    def update(self, values: Mapping[str, Any]) -> None:
        known = {f.name for f in fields(self)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown config keys: {sorted(unknown)}; known: {sorted(known)}")
        for name, value in values.items():
            if name == "pending_outcome":
                if value not in ("succeeded", "failed"):
                    raise ValueError("pending_outcome must be 'succeeded' or 'failed'")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a non-negative number")
            else:
                value = float(value)
            setattr(self, name, value)


@dataclass
class Request:
    method: str
    path: str
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


@dataclass
class Response:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    # Close the connection without sending anything (the commit_then_drop fault).
    drop: bool = False


class ApiError(Exception):
    """A Stripe-shaped error answer, raised inside the handlers and turned into a Response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error: dict[str, Any] = {"type": type, "message": message}
        if code is not None:
            self.error["code"] = code
        if param is not None:
            self.error["param"] = param

    def response(self) -> Response:
        return Response(self.status, {"error": self.error})


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _json_body(request: Request) -> dict[str, Any]:
    if not request.body.strip():
        return {}
    try:
        data = json.loads(request.body)
    except ValueError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    return data


def decode_form(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Decode Stripe's bracket form encoding: ``metadata[action_id]=x`` -> {"metadata": {...}}."""
    params: dict[str, Any] = {}
    for key, value in pairs:
        if "[" in key and key.endswith("]"):
            outer, inner = key[:-1].split("[", 1)
            if inner == "":  # expand[]=a
                params.setdefault(outer, [])
                if not isinstance(params[outer], list):
                    raise ApiError(400, f"Invalid array: {outer}", param=outer)
                params[outer].append(value)
            else:
                nested = params.setdefault(outer, {})
                if not isinstance(nested, dict):
                    raise ApiError(400, f"Invalid hash: {outer}", param=outer)
                nested[inner] = value
        else:
            params[key] = value
    return params


def _positive_int(value: Any, param: str) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
        if number > 0:
            return number
    raise ApiError(400, f"Invalid positive integer: {param}", code="parameter_invalid_integer", param=param)


def _created_conditions(created: Any) -> list[tuple[str, int]]:
    """The ``created`` filter of a list request, as (SQL comparison, seconds) pairs."""
    if created is None:
        return []
    if isinstance(created, str):
        return [("=", _whole_seconds(created))]
    if not isinstance(created, dict):
        raise ApiError(400, "Invalid created: must be an integer or a hash", param="created")
    conditions = []
    for operator, value in created.items():
        if operator not in CREATED_OPERATORS:
            raise ApiError(400, f"Received unknown parameter: created[{operator}]", code="parameter_unknown")
        conditions.append((CREATED_OPERATORS[operator], _whole_seconds(value)))
    return conditions


def _whole_seconds(value: Any) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    raise ApiError(400, "Invalid integer: created", code="parameter_invalid_integer", param="created")


def _list_limit(params: Mapping[str, Any], allowed: frozenset[str]) -> int:
    """Refuse unknown list parameters and read ``limit`` (1 to 100, default 10) as Stripe does."""
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ApiError(
            400,
            f"Received unknown parameter: {unknown[0]}",
            code="parameter_unknown",
            param=unknown[0],
        )
    limit = 10
    if "limit" in params:
        limit = _positive_int(params["limit"], "limit")
        if limit > 100:
            raise ApiError(
                400,
                "Invalid limit: must be between 1 and 100",
                code="parameter_invalid_integer",
                param="limit",
            )
    return limit


class Sandbox:
    """A Stripe-compatible payment provider for refunds, backed by one SQLite file."""

    def __init__(
        self,
        db_path: str,
        config: SandboxConfig | None = None,
        *,
        fault_seed: int | None = None,
        webhook: WebhookEndpoint | None = None,
    ) -> None:
        self.db_path = db_path
        self._defaults = config or SandboxConfig()
        self.config = SandboxConfig(**asdict(self._defaults))
        self._fault_seed = fault_seed
        self.faults = FaultPlan(seed=fault_seed)
        self._clock_offset = 0.0
        # Bumped by reset, so a request that was sleeping through a reset stores nothing.
        self._generation = 0
        # One connection shared by the handler threads, always used under this lock.
        self._lock = threading.RLock()
        self._db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL survives a killed process (the failure the sandbox exists to show);
        # only a power cut could lose the last commits, and it saves an fsync per request.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)
        self._db.executescript(webhooks.SCHEMA)
        self._recover_in_flight_keys()
        self._webhook_default = webhook or WebhookEndpoint()
        self.webhook = WebhookEndpoint(**vars(self._webhook_default))
        self._webhook_sender = WebhookSender(connect=lambda: self._db, endpoint=self.webhook, lock=self._lock)

    def close(self) -> None:
        self._webhook_sender.stop()
        with self._lock:
            self._db.close()

    # -- time and transactions --------------------------------------------------------------

    def now(self) -> float:
        """Wall-clock time plus the offset set by POST /_sandbox/clock (for retention tests)."""
        return time.time() + self._clock_offset

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _recover_in_flight_keys(self) -> None:
        # After a crash, a key still in flight either has its answer stored (the refund was
        # committed in the same transaction) or never reached the commit, in which case nothing
        # happened and the key is released, as Stripe does for requests that did not execute.
        with self._tx() as db:
            db.execute("DELETE FROM idempotency_keys WHERE state = 'in_flight' AND body IS NULL")
            db.execute("UPDATE idempotency_keys SET state = 'done' WHERE state = 'in_flight'")

    def _settle_due(self, db: sqlite3.Connection, now: float) -> None:
        # Settling lazily at the start of every transaction means nobody can observe a refund
        # that should have settled already, without a background thread.
        due = []
        if self.webhook.url:
            due = [
                row["id"]
                for row in db.execute(
                    "SELECT id FROM refunds WHERE status = 'pending' AND settle_at IS NOT NULL AND settle_at <= ?",
                    (now,),
                ).fetchall()
            ]
        db.execute(
            """
            UPDATE refunds
               SET status = settle_outcome,
                   failure_reason = CASE WHEN settle_outcome = 'failed' THEN 'declined' END,
                   settle_at = NULL
             WHERE status = 'pending' AND settle_at IS NOT NULL AND settle_at <= ?
            """,
            (now,),
        )
        for refund_id in due:
            self._emit_settled(db, refund_id, now)

    # -- webhook events (stored with the change, delivered by the sender thread) -------------

    def _emit(self, db: sqlite3.Connection, event_type: str, refund_id: str, now: float) -> None:
        row = self._refund_row(db, refund_id)
        if row is None or not self.webhook.url:
            return
        if event_type == "charge.refunded":
            charge = self._charge_row(db, row["charge"])
            assert charge is not None
            obj = self._charge_json(db, charge)
            refunds = db.execute("SELECT * FROM refunds WHERE charge = ? ORDER BY seq", (row["charge"],)).fetchall()
            obj["refunds"] = {"object": "list", "data": [self._refund_json(r) for r in refunds], "has_more": False}
        else:
            obj = self._refund_json(row)
        webhooks.record(db, self.webhook, event_type, obj, now)

    def _emit_created(self, db: sqlite3.Connection, refund_id: str, status: str, now: float) -> None:
        self._emit(db, "refund.created", refund_id, now)
        if status == "succeeded":
            self._emit(db, "charge.refunded", refund_id, now)
        elif status == "failed":
            self._emit(db, "refund.failed", refund_id, now)

    def _emit_settled(self, db: sqlite3.Connection, refund_id: str, now: float) -> None:
        row = self._refund_row(db, refund_id)
        if row is None:
            return
        self._emit(db, "refund.updated", refund_id, now)
        if row["status"] == "succeeded":
            self._emit(db, "charge.refunded", refund_id, now)
        elif row["status"] == "failed":
            self._emit(db, "refund.failed", refund_id, now)

    # -- dispatch ---------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        try:
            response = self._route(request)
        except ApiError as exc:
            response = exc.response()
        response.headers.setdefault("Request-Id", _new_id("req"))
        return response

    def _route(self, request: Request) -> Response:
        method, path = request.method.upper(), request.path.rstrip("/") or "/"
        if path.startswith("/_sandbox/"):
            return self._route_control(method, path, request)
        if path.startswith("/v1/"):
            self._authenticate(request.headers)
            parts = path.split("/")[2:]
            if parts == ["refunds"] and method == "POST":
                return self.create_refund(request)
            if parts == ["refunds"] and method == "GET":
                return self._lookup(lambda: self.list_refunds(request.query))
            if len(parts) == 2 and parts[0] == "refunds" and method == "GET":
                return self._lookup(lambda: self.get_refund(parts[1]))
            if parts == ["charges"] and method == "GET":
                return self._lookup(lambda: self.list_charges(request.query))
            if len(parts) == 2 and parts[0] == "charges" and method == "GET":
                return self._lookup(lambda: self.get_charge(parts[1]))
        raise ApiError(404, f"Unrecognized request URL ({method}: {path}).")

    def _authenticate(self, headers: Mapping[str, str]) -> None:
        header = _header(headers, "Authorization") or ""
        key = ""
        if header.startswith("Bearer "):
            key = header[len("Bearer ") :].strip()
        elif header.startswith("Basic "):
            try:
                key = base64.b64decode(header[len("Basic ") :]).decode().split(":", 1)[0]
            except ValueError:
                key = ""
        if not key:
            raise ApiError(401, "You did not provide an API key. Provide it as a Bearer token.")
        if not key.startswith("sk_test_") or len(key) <= len("sk_test_"):
            raise ApiError(401, f"Invalid API Key provided: {key[:12]}***")

    # -- POST /v1/refunds -------------------------------------------------------------------

    def create_refund(self, request: Request) -> Response:
        key = _header(request.headers, "Idempotency-Key")
        if key is not None and not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX_LENGTH:
            raise ApiError(
                400,
                f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX_LENGTH} characters.",
                param="Idempotency-Key",
            )
        pairs = parse_qsl(request.body.decode("utf-8", "replace"), keep_blank_values=True)
        fingerprint = hashlib.sha256(json.dumps(["POST", "/v1/refunds", sorted(pairs)]).encode()).hexdigest()

        with self._tx() as db:
            now = self.now()
            self._settle_due(db, now)
            if key is not None:
                stored = self._idempotent_answer(db, key, fingerprint, now)
                if stored is not None:
                    return stored
            # Parameter validation comes after the idempotency check but stores nothing, like
            # Stripe: a request that failed validation never executed, so its key stays free.
            params = self._validate_refund_params(decode_form(pairs))
            fault = self.faults.pick("create", action_id=params["metadata"].get("action_id"))
            refused = _refusal(fault)
            if refused is not None:
                return refused
            generation = self._generation
            token = secrets.token_hex(8)
            if key is not None:
                db.execute(
                    "INSERT INTO idempotency_keys (key, token, fingerprint, state, created_at) "
                    "VALUES (?, ?, ?, 'in_flight', ?)",
                    (key, token, fingerprint, now),
                )

        try:
            if fault is not None and fault.mode == "slow":
                # The key is in flight while this sleeps: a concurrent resend gets a 409.
                time.sleep(fault.sleep_seconds)
            with self._tx() as db:
                if self._generation != generation:
                    # A reset happened while this request slept; its charge and key are gone.
                    return _server_error("reset while the request was running")
                now = self.now()
                self._settle_due(db, now)
                try:
                    response = self._execute_refund(db, params, key, fault, now)
                except ApiError as exc:
                    # The endpoint started executing, so its error is the key's stored answer.
                    response = exc.response()
                if key is not None:
                    still_running = fault is not None and fault.mode == "commit_then_timeout"
                    db.execute(
                        "UPDATE idempotency_keys SET state = ?, status_code = ?, body = ? WHERE key = ? AND token = ?",
                        (
                            "in_flight" if still_running else "done",
                            response.status,
                            json.dumps(response.body),
                            key,
                            token,
                        ),
                    )
        except BaseException:
            if key is not None:
                self._release_key(key, token)
            raise

        if key is not None:
            response.headers["Idempotency-Key"] = key
        if fault is None:
            return response
        if fault.mode == "commit_then_timeout":
            time.sleep(fault.sleep_seconds)
            if key is not None:
                with self._tx() as db:
                    db.execute(
                        "UPDATE idempotency_keys SET state = 'done' WHERE key = ? AND token = ?",
                        (key, token),
                    )
            return response
        if fault.mode == "commit_then_500":
            return _server_error("commit_then_500")
        if fault.mode == "commit_then_drop":
            return Response(0, None, drop=True)
        return response

    def _release_key(self, key: str, token: str) -> None:
        with self._tx() as db:
            db.execute(
                "DELETE FROM idempotency_keys WHERE key = ? AND token = ? AND body IS NULL",
                (key, token),
            )

    def _idempotent_answer(self, db: sqlite3.Connection, key: str, fingerprint: str, now: float) -> Response | None:
        row = db.execute("SELECT * FROM idempotency_keys WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if now - row["created_at"] >= self.config.key_retention_seconds:
            # Past retention the key is forgotten: a resend executes again. This is the danger
            # the console's reconciliation exists to avoid.
            db.execute("DELETE FROM idempotency_keys WHERE key = ?", (key,))
            return None
        if row["fingerprint"] != fingerprint:
            raise ApiError(
                400,
                "Keys for idempotent requests can only be used with the same parameters they "
                f"were first used with. Try using a key other than '{key}' if you meant to "
                "execute a different request.",
                type="idempotency_error",
            )
        if row["state"] == "in_flight":
            raise ApiError(
                409,
                "There is currently another in-progress request using this Idempotent Key "
                "(that probably means you submitted twice, and the other request is still "
                "going through). Please try again later.",
                code="idempotency_key_in_use",
            )
        return Response(
            row["status_code"],
            json.loads(row["body"]),
            {"Idempotent-Replayed": "true", "Idempotency-Key": key},
        )

    def _validate_refund_params(self, params: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(params) - REFUND_PARAMS)
        if unknown:
            raise ApiError(
                400,
                f"Received unknown parameter: {unknown[0]}",
                code="parameter_unknown",
                param=unknown[0],
            )
        charge = params.get("charge")
        if not isinstance(charge, str) or not charge:
            raise ApiError(
                400,
                "Missing required param: charge.",
                code="parameter_missing",
                param="charge",
            )
        amount = params.get("amount")
        if amount is not None:
            amount = _positive_int(amount, "amount")
        reason = params.get("reason") or None
        if reason is not None and reason not in REFUND_REASONS:
            raise ApiError(
                400,
                "Invalid reason: must be one of duplicate, fraudulent, or requested_by_customer",
                param="reason",
            )
        metadata = params.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ApiError(400, "Invalid hash: metadata", param="metadata")
        for meta_key, value in metadata.items():
            if len(meta_key) > 40 or len(value) > 500:
                raise ApiError(
                    400,
                    "Metadata keys are limited to 40 characters and values to 500.",
                    param=f"metadata[{meta_key}]",
                )
        currency = params.get("currency") or None
        return {
            "charge": charge,
            "amount": amount,
            "reason": reason,
            # An empty value unsets a key in Stripe's metadata; on create it means "absent".
            "metadata": {k: v for k, v in metadata.items() if v != ""},
            "currency": currency.lower() if isinstance(currency, str) else None,
        }

    def _execute_refund(
        self,
        db: sqlite3.Connection,
        params: dict[str, Any],
        key: str | None,
        fault: Fault | None,
        now: float,
    ) -> Response:
        charge = self._charge_row(db, params["charge"])
        if charge is None:
            raise ApiError(
                400,
                f"No such charge: '{params['charge']}'",
                code="resource_missing",
                param="charge",
            )
        if params["currency"] is not None and params["currency"] != charge["currency"]:
            raise ApiError(
                400,
                f"Refund currency {params['currency']} does not match the currency of charge "
                f"{charge['id']} ({charge['currency']}).",
                code="currency_mismatch",
                param="currency",
            )
        remaining = charge["amount"] - self._counted_total(db, charge["id"])
        if remaining <= 0:
            raise ApiError(
                400,
                f"Charge {charge['id']} has already been refunded.",
                code="charge_already_refunded",
            )
        amount = params["amount"] if params["amount"] is not None else remaining
        if amount > remaining:
            raise ApiError(
                400,
                f"Refund amount ({amount} {charge['currency']} minor units) is greater than "
                f"unrefunded amount on charge ({remaining}).",
                code="amount_too_large",
                param="amount",
            )
        status, settle_at, outcome = "succeeded", None, None
        if fault is not None and fault.mode == "pending":
            status = "pending"
            delay = fault.settle_after_seconds
            if delay is None:
                delay = self.config.pending_settle_after_seconds
            settle_at = now + delay
            outcome = fault.outcome or self.config.pending_outcome
        elif fault is not None and fault.mode == "created_with_status":
            assert fault.status is not None
            status = fault.status
            if status == "pending":
                delay = fault.settle_after_seconds
                if delay is None:
                    delay = self.config.pending_settle_after_seconds
                settle_at = now + delay
                outcome = fault.outcome or self.config.pending_outcome
        refund_id = self._insert_refund(
            db,
            charge=charge,
            amount=amount,
            status=status,
            reason=params["reason"],
            metadata=params["metadata"],
            now=now,
            visible_at=now + self.config.lookup_visibility_delay_seconds,
            settle_at=settle_at,
            settle_outcome=outcome,
            idempotency_key=key,
            planted=False,
        )
        self._emit_created(db, refund_id, status, now)
        row = self._refund_row(db, refund_id)
        assert row is not None  # inserted just above, in this transaction
        return Response(200, self._refund_json(row))

    def _insert_refund(
        self,
        db: sqlite3.Connection,
        *,
        charge: sqlite3.Row,
        amount: int,
        status: str,
        reason: str | None,
        metadata: dict[str, str],
        now: float,
        visible_at: float,
        settle_at: float | None,
        settle_outcome: str | None,
        idempotency_key: str | None,
        planted: bool,
    ) -> str:
        refund_id = _new_id("re")
        db.execute(
            """
            INSERT INTO refunds (id, charge, amount, currency, status, reason, metadata,
                                 created, created_at, visible_at, settle_at, settle_outcome,
                                 failure_reason, idempotency_key, planted)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            (
                refund_id,
                charge["id"],
                amount,
                charge["currency"],
                status,
                reason,
                json.dumps(metadata),
                int(now),
                now,
                visible_at,
                settle_at,
                settle_outcome,
                "declined" if status == "failed" else None,
                idempotency_key,
                int(planted),
            ),
        )
        return refund_id

    # -- reads ------------------------------------------------------------------------------

    def _lookup(self, compute: Any) -> Response:
        """Run a read, applying any lookup fault around it."""
        with self._lock:
            fault = self.faults.pick("lookup")
        refused = _refusal(fault)
        if refused is not None:
            return refused
        if fault is not None and fault.mode in ("slow", "commit_then_timeout"):
            time.sleep(fault.sleep_seconds)
        response: Response = compute()
        if fault is not None and fault.mode == "commit_then_500":
            return _server_error("commit_then_500")
        if fault is not None and fault.mode == "commit_then_drop":
            return Response(0, None, drop=True)
        return response

    def get_refund(self, refund_id: str) -> Response:
        with self._tx() as db:
            self._settle_due(db, self.now())
            row = self._refund_row(db, refund_id)
            if row is None:
                raise ApiError(404, f"No such refund: '{refund_id}'", code="resource_missing", param="id")
            return Response(200, self._refund_json(row))

    def get_charge(self, charge_id: str) -> Response:
        with self._tx() as db:
            self._settle_due(db, self.now())
            row = self._charge_row(db, charge_id)
            if row is None:
                raise ApiError(404, f"No such charge: '{charge_id}'", code="resource_missing", param="id")
            return Response(200, self._charge_json(db, row))

    def list_charges(self, query: str) -> Response:
        """GET /v1/charges: newest first, paged by ``starting_after``/``ending_before`` like
        Stripe's list API, so that an importer can be tested on more than one page."""
        params = decode_form(parse_qsl(query, keep_blank_values=True))
        limit = _list_limit(params, CHARGE_LIST_PARAMS)
        if params.get("starting_after") and params.get("ending_before"):
            raise ApiError(400, "You may only specify one of starting_after and ending_before.")
        with self._tx() as db:
            self._settle_due(db, self.now())
            # The rowid is the insertion order: newest first is rowid descending.
            where, args, order = ["1 = 1"], [], "DESC"
            for cursor_param, comparison in (("starting_after", "<"), ("ending_before", ">")):
                cursor_id = params.get(cursor_param)
                if not cursor_id:
                    continue
                cursor = db.execute("SELECT rowid FROM charges WHERE id = ?", (cursor_id,)).fetchone()
                if cursor is None:
                    raise ApiError(
                        400,
                        f"No such charge: '{cursor_id}'",
                        code="resource_missing",
                        param=cursor_param,
                    )
                where.append(f"rowid {comparison} ?")
                args.append(cursor[0])
                if cursor_param == "ending_before":
                    order = "ASC"
            # Only fixed fragments are interpolated; every value is a bound parameter.
            sql = f"SELECT * FROM charges WHERE {' AND '.join(where)}"  # noqa: S608
            sql += f" ORDER BY rowid {order} LIMIT ?"
            rows = db.execute(sql, (*args, limit + 1)).fetchall()
            has_more = len(rows) > limit
            rows = rows[:limit]
            if order == "ASC":
                rows.reverse()
            return Response(
                200,
                {
                    "object": "list",
                    "data": [self._charge_json(db, row) for row in rows],
                    "has_more": has_more,
                    "url": "/v1/charges",
                },
            )

    def list_refunds(self, query: str) -> Response:
        params = decode_form(parse_qsl(query, keep_blank_values=True))
        limit = _list_limit(params, LIST_PARAMS)
        if params.get("starting_after") and params.get("ending_before"):
            raise ApiError(400, "You may only specify one of starting_after and ending_before.")
        with self._tx() as db:
            now = self.now()
            self._settle_due(db, now)
            where, args = ["visible_at <= ?"], [now]
            charge = params.get("charge")
            if charge:
                if self._charge_row(db, charge) is None:
                    raise ApiError(404, f"No such charge: '{charge}'", code="resource_missing", param="charge")
                where.append("charge = ?")
                args.append(charge)
            for comparison, seconds in _created_conditions(params.get("created")):
                where.append(f"created {comparison} ?")
                args.append(seconds)
            order = "DESC"  # newest first, like Stripe
            for cursor_param, comparison in (("starting_after", "<"), ("ending_before", ">")):
                cursor_id = params.get(cursor_param)
                if not cursor_id:
                    continue
                cursor = self._refund_row(db, cursor_id)
                if cursor is None:
                    raise ApiError(
                        400,
                        f"No such refund: '{cursor_id}'",
                        code="resource_missing",
                        param=cursor_param,
                    )
                where.append(f"seq {comparison} ?")
                args.append(cursor["seq"])
                if cursor_param == "ending_before":
                    order = "ASC"
            # Only fixed fragments are interpolated; every value is a bound parameter.
            conditions = " AND ".join(where)
            sql = f"SELECT * FROM refunds WHERE {conditions}"  # noqa: S608
            sql += f" ORDER BY seq {order} LIMIT ?"
            rows = db.execute(sql, (*args, limit + 1)).fetchall()
            has_more = len(rows) > limit
            rows = rows[:limit]
            if order == "ASC":
                rows.reverse()
            return Response(
                200,
                {
                    "object": "list",
                    "data": [self._refund_json(row) for row in rows],
                    "has_more": has_more,
                    "url": "/v1/refunds",
                },
            )

    # -- rows and JSON ----------------------------------------------------------------------

    def _charge_row(self, db: sqlite3.Connection, charge_id: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = db.execute("SELECT * FROM charges WHERE id = ?", (charge_id,)).fetchone()
        return row

    def _refund_row(self, db: sqlite3.Connection, refund_id: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = db.execute("SELECT * FROM refunds WHERE id = ?", (refund_id,)).fetchone()
        return row

    def _counted_total(self, db: sqlite3.Connection, charge_id: str) -> int:
        (total,) = db.execute(_COUNTED_TOTAL_SQL, (charge_id, *COUNTING_STATUSES)).fetchone()
        return int(total)

    def _charge_json(self, db: sqlite3.Connection, row: sqlite3.Row) -> dict[str, Any]:
        refunded = self._counted_total(db, row["id"])
        return {
            "id": row["id"],
            "object": "charge",
            "amount": row["amount"],
            "amount_captured": row["amount"],
            "amount_refunded": refunded,
            "captured": True,
            "created": row["created"],
            "currency": row["currency"],
            "livemode": False,
            "metadata": json.loads(row["metadata"]),
            "paid": True,
            "refunded": refunded >= row["amount"],
            "status": "succeeded",
        }

    def _refund_json(self, row: sqlite3.Row) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": row["id"],
            "object": "refund",
            "amount": row["amount"],
            "balance_transaction": "txn_" + row["id"][3:],
            "charge": row["charge"],
            "created": row["created"],
            "currency": row["currency"],
            "metadata": json.loads(row["metadata"]),
            "payment_intent": None,
            "reason": row["reason"],
            "receipt_number": None,
            "source_transfer_reversal": None,
            "status": row["status"],
            "transfer_reversal": None,
        }
        if row["failure_reason"]:
            data["failure_reason"] = row["failure_reason"]
        return data

    # -- control endpoints (/_sandbox/...) --------------------------------------------------

    def _route_control(self, method: str, path: str, request: Request) -> Response:
        name = path[len("/_sandbox/") :]
        routes: dict[tuple[str, str], Any] = {
            ("GET", "health"): lambda: self.health(),
            ("POST", "reset"): lambda: self.reset(),
            ("POST", "charges"): lambda: self.seed_charge(_json_body(request)),
            ("POST", "refunds"): lambda: self.plant_refund(_json_body(request)),
            ("GET", "ledger"): lambda: self.ledger(),
            ("GET", "faults"): lambda: self.get_faults(),
            ("POST", "faults"): lambda: self.add_faults(_json_body(request)),
            ("DELETE", "faults"): lambda: self.clear_faults(),
            ("POST", "settle"): lambda: self.settle(_json_body(request)),
            ("GET", "config"): lambda: self.get_config(),
            ("POST", "config"): lambda: self.set_config(_json_body(request)),
            ("GET", "clock"): lambda: self.get_clock(),
            ("POST", "clock"): lambda: self.advance_clock(_json_body(request)),
            ("GET", "webhooks"): lambda: self.get_webhooks(),
            ("POST", "webhooks"): lambda: self.set_webhooks(_json_body(request)),
            ("POST", "outside_refunds"): lambda: self.outside_refund(_json_body(request)),
        }
        route = routes.get((method, name))
        if route is None:
            raise ApiError(404, f"Unrecognized request URL ({method}: {path}).")
        response: Response = route()
        return response

    def health(self) -> Response:
        with self._tx() as db:
            db.execute("SELECT 1").fetchone()
        return Response(200, {"status": "ok", "pid": os.getpid(), "now": self.now()})

    def reset(self) -> Response:
        with self._tx() as db:
            db.execute("DELETE FROM idempotency_keys")
            db.execute("DELETE FROM refunds")
            db.execute("DELETE FROM charges")
            db.execute("DELETE FROM events")
            self.webhook.__dict__.update(vars(WebhookEndpoint(**vars(self._webhook_default))))
            self._generation += 1
            self.faults.clear()
            self.faults.reseed(self._fault_seed)
            self.config = SandboxConfig(**asdict(self._defaults))
            self._clock_offset = 0.0
        return Response(200, {"status": "reset"})

    def seed_charge(self, body: dict[str, Any]) -> Response:
        charge_id = body.get("id") or _new_id("ch")
        amount = body.get("amount")
        currency = body.get("currency")
        metadata = body.get("metadata") or {}
        if not isinstance(charge_id, str):
            raise ApiError(400, "id must be a string", param="id")
        if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
            raise ApiError(400, "amount must be a positive integer (minor units)", param="amount")
        if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
            raise ApiError(400, "currency must be a three-letter ISO code", param="currency")
        if not isinstance(metadata, dict):
            raise ApiError(400, "metadata must be an object", param="metadata")
        with self._tx() as db:
            if self._charge_row(db, charge_id) is not None:
                raise ApiError(
                    400,
                    f"Charge {charge_id} already exists.",
                    code="resource_already_exists",
                    param="id",
                )
            db.execute(
                "INSERT INTO charges (id, amount, currency, created, metadata) VALUES (?, ?, ?, ?, ?)",
                (
                    charge_id,
                    amount,
                    currency.lower(),
                    int(self.now()),
                    json.dumps({str(k): str(v) for k, v in metadata.items()}),
                ),
            )
            row = self._charge_row(db, charge_id)
            assert row is not None
            return Response(200, self._charge_json(db, row))

    def plant_refund(self, body: dict[str, Any]) -> Response:
        """Store a refund directly, bypassing idempotency, faults and the total check.

        For audit tests: it can create exactly the duplicates and overshoots that the real API
        would refuse, so the audit's detection of them can be tested.
        """
        charge_id = body.get("charge")
        amount = body.get("amount")
        status = body.get("status", "succeeded")
        metadata = body.get("metadata") or {}
        reason = body.get("reason")
        key = body.get("idempotency_key")
        delay = body.get("visibility_delay_seconds", 0)
        if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
            raise ApiError(400, "amount must be a positive integer (minor units)", param="amount")
        if status not in ("succeeded", "pending", "failed", "canceled", "requires_action"):
            raise ApiError(400, f"unknown status {status!r}", param="status")
        if not isinstance(metadata, dict):
            raise ApiError(400, "metadata must be an object", param="metadata")
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
            raise ApiError(400, "visibility_delay_seconds must be >= 0", param="visibility_delay_seconds")
        with self._tx() as db:
            now = self.now()
            charge = self._charge_row(db, str(charge_id))
            if charge is None:
                raise ApiError(404, f"No such charge: '{charge_id}'", code="resource_missing", param="charge")
            refund_id = self._insert_refund(
                db,
                charge=charge,
                amount=amount,
                status=status,
                reason=reason,
                metadata={str(k): str(v) for k, v in metadata.items()},
                now=now,
                visible_at=now + delay,
                settle_at=None,
                settle_outcome=None,
                idempotency_key=key,
                planted=True,
            )
            row = self._refund_row(db, refund_id)
            assert row is not None
            return Response(200, self._refund_json(row))

    def ledger(self) -> Response:
        """Every refund ever stored, oldest first, visible or not, with the sandbox's notes."""
        with self._tx() as db:
            now = self.now()
            self._settle_due(db, now)
            refunds = []
            for row in db.execute("SELECT * FROM refunds ORDER BY seq").fetchall():
                data = self._refund_json(row)
                data["sandbox"] = {
                    "visible": row["visible_at"] <= now,
                    "visible_at": row["visible_at"],
                    "idempotency_key": row["idempotency_key"],
                    "planted": bool(row["planted"]),
                    "settle_at": row["settle_at"],
                    "settle_outcome": row["settle_outcome"],
                }
                refunds.append(data)
            charges = [
                self._charge_json(db, row)
                for row in db.execute("SELECT * FROM charges ORDER BY created, id").fetchall()
            ]
        return Response(200, {"object": "list", "data": refunds, "charges": charges})

    def get_webhooks(self) -> Response:
        with self._lock:
            return Response(200, {**self.webhook.to_json(), **webhooks.status(self._db)})

    def set_webhooks(self, body: dict[str, Any]) -> Response:
        """Configure the endpoint events go to (``url``, ``secret``, ``enabled_events``...)."""
        with self._lock:
            try:
                self.webhook.update(body)
            except ValueError as exc:
                raise ApiError(400, str(exc)) from exc
        self._webhook_sender.wake()
        return self.get_webhooks()

    def outside_refund(self, body: dict[str, Any]) -> Response:
        """A refund made outside the console (another system, a person in the dashboard).

        It follows the provider's rules (the charge must exist and cover it) but carries no
        idempotency key and no action id, and its events go to the webhook endpoint like any
        other. ``status`` "pending" makes it settle later as configured.
        """
        charge_id = body.get("charge")
        amount = body.get("amount")
        status = body.get("status", "succeeded")
        reason = body.get("reason", "requested_by_customer")
        if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
            raise ApiError(400, "amount must be a positive integer (minor units)", param="amount")
        if status not in ("succeeded", "pending"):
            raise ApiError(400, "status must be 'succeeded' or 'pending'", param="status")
        with self._tx() as db:
            now = self.now()
            self._settle_due(db, now)
            charge = self._charge_row(db, str(charge_id))
            if charge is None:
                raise ApiError(404, f"No such charge: '{charge_id}'", code="resource_missing", param="charge")
            remaining = charge["amount"] - self._counted_total(db, charge["id"])
            if amount > remaining:
                raise ApiError(
                    400,
                    f"Refund amount ({amount}) is greater than unrefunded amount on charge ({remaining}).",
                    code="amount_too_large",
                    param="amount",
                )
            pending = status == "pending"
            refund_id = self._insert_refund(
                db,
                charge=charge,
                amount=amount,
                status=status,
                reason=reason if reason in REFUND_REASONS else None,
                metadata={},
                now=now,
                visible_at=now + self.config.lookup_visibility_delay_seconds,
                settle_at=now + self.config.pending_settle_after_seconds if pending else None,
                settle_outcome=self.config.pending_outcome if pending else None,
                idempotency_key=None,
                planted=False,
            )
            self._emit_created(db, refund_id, status, now)
            row = self._refund_row(db, refund_id)
            assert row is not None
        self._webhook_sender.wake()
        return Response(200, self._refund_json(row))

    def get_faults(self) -> Response:
        with self._lock:
            return Response(200, self.faults.to_json())

    def add_faults(self, body: dict[str, Any]) -> Response:
        with self._lock:
            try:
                queued = self.faults.configure(body)
            except FaultError as exc:
                raise ApiError(400, str(exc)) from exc
            return Response(200, {"queued": [fault.to_json() for fault in queued], **self.faults.to_json()})

    def clear_faults(self) -> Response:
        with self._lock:
            self.faults.clear()
            return Response(200, self.faults.to_json())

    def settle(self, body: dict[str, Any]) -> Response:
        outcome = body.get("outcome")
        refund_id = body.get("refund")
        if outcome is not None and outcome not in ("succeeded", "failed"):
            raise ApiError(400, "outcome must be 'succeeded' or 'failed'", param="outcome")
        with self._tx() as db:
            query = "SELECT id, settle_outcome FROM refunds WHERE status = 'pending'"
            args: tuple[Any, ...] = ()
            if refund_id is not None:
                query += " AND id = ?"
                args = (refund_id,)
            settled = []
            for row in db.execute(query, args).fetchall():
                final = outcome or row["settle_outcome"] or self.config.pending_outcome
                db.execute(
                    "UPDATE refunds SET status = ?, settle_at = NULL, failure_reason = ? WHERE id = ?",
                    (final, "declined" if final == "failed" else None, row["id"]),
                )
                settled.append({"id": row["id"], "status": final})
                self._emit_settled(db, row["id"], self.now())
        return Response(200, {"settled": settled})

    def get_config(self) -> Response:
        with self._lock:
            return Response(200, asdict(self.config))

    def set_config(self, body: dict[str, Any]) -> Response:
        with self._lock:
            try:
                self.config.update(body)
            except ValueError as exc:
                raise ApiError(400, str(exc)) from exc
            return Response(200, asdict(self.config))

    def get_clock(self) -> Response:
        with self._lock:
            return Response(200, {"now": self.now(), "offset_seconds": self._clock_offset})

    def advance_clock(self, body: dict[str, Any]) -> Response:
        seconds = body.get("advance_seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise ApiError(400, "advance_seconds must be a non-negative number")
        with self._lock:
            # Only forward: time going backwards would un-expire keys and un-settle refunds.
            self._clock_offset += float(seconds)
            return Response(200, {"now": self.now(), "offset_seconds": self._clock_offset})


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return None


def _server_error(mode: str) -> Response:
    return Response(
        500,
        {
            "error": {
                "type": "api_error",
                "message": f"An unknown error occurred (sandbox fault {mode}).",
            }
        },
    )


def _refusal(fault: Fault | None) -> Response | None:
    """The answer for faults that refuse a request before anything is executed."""
    if fault is None:
        return None
    if fault.mode == "rate_limit":
        refusal = ApiError(
            429,
            "Too many requests hit the API too quickly (sandbox fault rate_limit).",
            code="rate_limit",
        ).response()
        refusal.headers["Retry-After"] = "1"
        return refusal
    if fault.mode == "reject_invalid":
        return ApiError(
            400,
            "Invalid request (sandbox fault reject_invalid).",
            code="parameter_invalid",
            param="amount",
        ).response()
    if fault.mode == "fail_before_commit":
        return _server_error("fail_before_commit")
    return None
