"""The accounting sandbox: a Xero-shaped accounting API for supplier bills and credit notes.

Same conventions as the payment sandbox (``harness.sandboxes.payment``): its own SQLite storage,
control endpoints under ``/_sandbox/`` (reset, faults, config, clock, ledger, seeding), a clock
that tests can move forward, and the same fault modes, chosen by the same ``FaultPlan``.

It models what matters for invoice adjustments:
- bills (ACCPAY invoices) with an amount due and a last-updated time (their version);
- credit notes with a Reference, a status (DRAFT, AUTHORISED, VOIDED) and allocations to a bill;
- Idempotency-Key on the create, remembered for ``key_retention_seconds`` (shorter by default than
  the payment provider's 24 hours, so that the console's retention rule is really exercised);
- a search by Reference that lags creation by ``lookup_visibility_delay_seconds``;
- validation errors that prove nothing was saved (amount above the amount due, a voided bill,
  a currency that is not the bill's).

Every read and write runs under one lock in one ``BEGIN IMMEDIATE`` transaction; sleeps (slow
answers, timeouts) happen outside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import parse_qsl

from harness.sandboxes.payment.app import Request, Response
from harness.sandboxes.payment.faults import Fault, FaultError, FaultPlan

__all__ = ["API_PREFIX", "AccountingConfig", "AccountingSandbox"]

API_PREFIX = "/api.xro/2.0"
IDEMPOTENCY_KEY_MAX_LENGTH = 255
# Modes that mean nothing to an accounting system: credit notes do not settle later.
UNSUPPORTED_MODES = frozenset({"pending", "created_with_status"})
PAGE_SIZE = 100
_CREATED_BOUND = re.compile(
    r"^CreatedDateUTC(>=|<)DateTime\((\d{4}),(\d{1,2}),(\d{1,2}),(\d{1,2}),(\d{1,2}),(\d{1,2})\)$"
)


def _created_bounds(where: str) -> list[tuple[str, float]]:
    """The creation-time bounds of a ``where`` clause, as (operator, seconds since the epoch)."""
    if not where:
        return []
    bounds = []
    for clause in where.replace(" ", "").split("&&"):
        match = _CREATED_BOUND.match(clause)
        if match is None:
            raise validation_error(
                "Only CreatedDateUTC>=DateTime(y,m,d,h,m,s)&&CreatedDateUTC<DateTime(...) is supported."
            )
        try:
            year, month, day, hour, minute, second = (int(part) for part in match.groups()[1:])
            when = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
        except ValueError:
            raise validation_error(f"Not a date: {clause}") from None
        bounds.append((match.group(1), when.timestamp()))
    return bounds

_SCHEMA = """
CREATE TABLE IF NOT EXISTS invoices (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    number TEXT NOT NULL,
    contact TEXT NOT NULL,
    currency TEXT NOT NULL,
    total TEXT NOT NULL,
    amount_due TEXT NOT NULL,
    status TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS credit_notes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    number TEXT NOT NULL,
    reference TEXT NOT NULL,
    contact TEXT NOT NULL,
    currency TEXT NOT NULL,
    total TEXT NOT NULL,
    status TEXT NOT NULL,
    invoice_id TEXT,
    allocated TEXT NOT NULL DEFAULT '0',
    created_at REAL NOT NULL,
    visible_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    idempotency_key TEXT,
    planted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS credit_notes_reference ON credit_notes (reference);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('in_flight', 'done')),
    created_at REAL NOT NULL,
    status_code INTEGER,
    body TEXT
);
"""


@dataclass
class AccountingConfig:
    """Settings that tests change at run time through POST /_sandbox/config."""

    # Six hours: far shorter than the payment provider's day, so retention really runs out.
    key_retention_seconds: float = 6 * 3600.0
    lookup_visibility_delay_seconds: float = 2.0

    def update(self, values: Mapping[str, Any]) -> None:
        known = {f.name for f in fields(self)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown config keys: {sorted(unknown)}; known: {sorted(known)}")
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a non-negative number")
            setattr(self, name, float(value))


class XeroError(Exception):
    """A Xero-shaped error answer, raised inside the handlers and turned into a Response."""

    def __init__(self, status: int, type_: str, message: str, *, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"ErrorNumber": _ERROR_NUMBERS.get(type_, 0), "Type": type_, "Message": message}
        if errors:
            self.body["Elements"] = [{"ValidationErrors": [{"Message": text} for text in errors]}]

    def response(self) -> Response:
        return Response(self.status, self.body)


_ERROR_NUMBERS = {"ValidationException": 10, "NotFound": 404, "Unauthorized": 401, "RateLimit": 429}


def validation_error(*messages: str) -> XeroError:
    return XeroError(400, "ValidationException", "A validation exception occurred", errors=list(messages))


def _decimal(value: Any, name: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise validation_error(f"{name} must be a number.")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise validation_error(f"{name} must be a number.") from None
    if not amount.is_finite():
        raise validation_error(f"{name} must be a finite number.")
    return amount


def _money(amount: Decimal) -> float:
    # Xero answers amounts as JSON numbers; two decimals survive the float round trip.
    return float(amount)


def _json_body(request: Request) -> dict[str, Any]:
    if not request.body.strip():
        return {}
    try:
        data = json.loads(request.body)
    except ValueError as exc:
        raise XeroError(400, "ValidationException", f"The body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise XeroError(400, "ValidationException", "The body must be a JSON object.")
    return data


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return None


def _server_error(mode: str) -> Response:
    return Response(500, {"ErrorNumber": 500, "Type": "InternalError", "Message": f"Sandbox fault {mode}."})


def _refusal(fault: Fault | None) -> Response | None:
    """The answer for faults that refuse a request before anything is executed."""
    if fault is None:
        return None
    if fault.mode == "rate_limit":
        return Response(
            429,
            {"ErrorNumber": 429, "Type": "RateLimit", "Message": "Rate limit exceeded (sandbox fault rate_limit)."},
            {"Retry-After": "1", "X-Rate-Limit-Problem": "minute"},
        )
    if fault.mode == "reject_invalid":
        return validation_error("Invalid request (sandbox fault reject_invalid).").response()
    if fault.mode == "fail_before_commit":
        return _server_error("fail_before_commit")
    return None


class AccountingSandbox:
    """A Xero-compatible accounting API for credit notes on supplier bills, in one SQLite file."""

    def __init__(self, db_path: str, config: AccountingConfig | None = None, *, fault_seed: int | None = None) -> None:
        self.db_path = db_path
        self._defaults = config or AccountingConfig()
        self.config = AccountingConfig(**asdict(self._defaults))
        self._fault_seed = fault_seed
        self.faults = FaultPlan(seed=fault_seed)
        self._clock_offset = 0.0
        self._generation = 0
        self._lock = threading.RLock()
        self._db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        # After a crash a key still in flight either has its answer stored (the credit note was
        # committed with it) or never reached the commit, so nothing happened and it is released.
        with self._tx() as db:
            db.execute("DELETE FROM idempotency_keys WHERE state = 'in_flight' AND body IS NULL")
            db.execute("UPDATE idempotency_keys SET state = 'done' WHERE state = 'in_flight'")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def now(self) -> float:
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

    # -- dispatch -----------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        try:
            response = self._route(request)
        except XeroError as exc:
            response = exc.response()
        response.headers.setdefault("Xero-Correlation-Id", str(uuid.uuid4()))
        return response

    def _route(self, request: Request) -> Response:
        method, path = request.method.upper(), request.path.rstrip("/") or "/"
        if path.startswith("/_sandbox/"):
            return self._route_control(method, path[len("/_sandbox/") :], request)
        if path.startswith(API_PREFIX + "/"):
            self._authenticate(request.headers)
            parts = path[len(API_PREFIX) + 1 :].split("/")
            if parts == ["CreditNotes"] and method == "PUT":
                return self.create_credit_note(request)
            if parts == ["CreditNotes"] and method == "GET":
                return self._lookup(lambda: self.list_credit_notes(request.query))
            if len(parts) == 2 and parts[0] == "CreditNotes" and method == "GET":
                return self._lookup(lambda: self.get_credit_note(parts[1]))
            if len(parts) == 2 and parts[0] == "CreditNotes" and method == "POST":
                return self.update_credit_note(parts[1], request)
            if len(parts) == 3 and parts[0] == "CreditNotes" and parts[2] == "Allocations" and method == "PUT":
                return self.allocate(parts[1], _json_body(request))
            if len(parts) == 2 and parts[0] == "Invoices" and method == "GET":
                return self._lookup(lambda: self.get_invoice(parts[1]))
        raise XeroError(404, "NotFound", f"The resource you're looking for cannot be found ({method} {path}).")

    def _authenticate(self, headers: Mapping[str, str]) -> None:
        header = _header(headers, "Authorization") or ""
        if not header.startswith("Bearer ") or not header[len("Bearer ") :].strip():
            raise XeroError(401, "Unauthorized", "AuthenticationUnsuccessful: provide a Bearer token.")
        if not (_header(headers, "xero-tenant-id") or "").strip():
            raise XeroError(403, "Unauthorized", "AuthorizationUnsuccessful: the xero-tenant-id header is missing.")

    # -- PUT /CreditNotes ---------------------------------------------------------------------

    def create_credit_note(self, request: Request) -> Response:
        key = _header(request.headers, "Idempotency-Key")
        if key is not None and not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX_LENGTH:
            raise validation_error(f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX_LENGTH} characters.")
        body = _json_body(request)
        fingerprint = hashlib.sha256(json.dumps(["PUT", "/CreditNotes", body], sort_keys=True).encode()).hexdigest()
        with self._tx() as db:
            now = self.now()
            if key is not None:
                stored = self._idempotent_answer(db, key, fingerprint, now)
                if stored is not None:
                    return stored
            # Shape errors come before any fault and store nothing: the request never executed.
            note = self._parse_credit_note(body)
            fault = self.faults.pick("create", action_id=note["reference"])
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
                time.sleep(fault.sleep_seconds)
            with self._tx() as db:
                if self._generation != generation:
                    return _server_error("reset while the request was running")
                now = self.now()
                try:
                    response = self._execute_create(db, note, key, now)
                except XeroError as exc:
                    # Validation against the bill: nothing saved, and the key keeps this answer.
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
                with self._tx() as db:
                    db.execute(
                        "DELETE FROM idempotency_keys WHERE key = ? AND token = ? AND body IS NULL", (key, token)
                    )
            raise
        return self._deliver(response, fault, key, token)

    def _deliver(self, response: Response, fault: Fault | None, key: str | None, token: str) -> Response:
        """Apply a commit_then_* fault to an answer that is already committed."""
        if fault is None:
            return response
        if fault.mode == "commit_then_timeout":
            time.sleep(fault.sleep_seconds)
            if key is not None:
                with self._tx() as db:
                    db.execute("UPDATE idempotency_keys SET state = 'done' WHERE key = ? AND token = ?", (key, token))
            return response
        if fault.mode == "commit_then_500":
            return _server_error("commit_then_500")
        if fault.mode == "commit_then_drop":
            return Response(0, None, drop=True)
        return response

    def _idempotent_answer(self, db: sqlite3.Connection, key: str, fingerprint: str, now: float) -> Response | None:
        row = db.execute("SELECT * FROM idempotency_keys WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if now - row["created_at"] >= self.config.key_retention_seconds:
            # Past retention the key is forgotten: a resend creates a second credit note.
            db.execute("DELETE FROM idempotency_keys WHERE key = ?", (key,))
            return None
        if row["fingerprint"] != fingerprint:
            raise XeroError(
                422,
                "IdempotencyKeyMismatch",
                f"The Idempotency-Key '{key}' was already used with a different request body.",
            )
        if row["state"] == "in_flight":
            raise XeroError(409, "IdempotencyKeyInUse", "A request with this Idempotency-Key is still being processed.")
        return Response(row["status_code"], json.loads(row["body"]), {"Idempotent-Replayed": "true"})

    def _parse_credit_note(self, body: dict[str, Any]) -> dict[str, Any]:
        notes = body.get("CreditNotes")
        if not isinstance(notes, list) or len(notes) != 1 or not isinstance(notes[0], dict):
            raise validation_error("Send exactly one credit note in CreditNotes.")
        raw = notes[0]
        if raw.get("Type") != "ACCPAYCREDIT":
            raise validation_error("Type must be ACCPAYCREDIT (a credit note from a supplier).")
        reference = raw.get("Reference")
        if not isinstance(reference, str) or not reference.strip():
            raise validation_error("Reference is required.")
        contact = (raw.get("Contact") or {}).get("Name") if isinstance(raw.get("Contact"), dict) else None
        if not isinstance(contact, str) or not contact:
            raise validation_error("Contact.Name is required.")
        currency = raw.get("CurrencyCode")
        if not isinstance(currency, str) or len(currency) != 3:
            raise validation_error("CurrencyCode must be a three-letter code.")
        lines = raw.get("LineItems")
        if not isinstance(lines, list) or not lines:
            raise validation_error("At least one line item is required.")
        total = Decimal("0")
        for line in lines:
            if not isinstance(line, dict):
                raise validation_error("Each line item must be an object.")
            total += _decimal(line.get("Quantity", 1), "Quantity") * _decimal(line.get("UnitAmount"), "UnitAmount")
        if total <= 0:
            raise validation_error("The credit note's total must be positive.")
        status = raw.get("Status", "AUTHORISED")
        if status not in ("DRAFT", "AUTHORISED"):
            raise validation_error("Status must be DRAFT or AUTHORISED.")
        allocations = raw.get("Allocations") or []
        invoice_id = None
        if allocations:
            if not isinstance(allocations, list) or len(allocations) != 1 or not isinstance(allocations[0], dict):
                raise validation_error("Allocate to exactly one bill.")
            invoice = allocations[0].get("Invoice")
            invoice_id = invoice.get("InvoiceID") if isinstance(invoice, dict) else None
            if not isinstance(invoice_id, str):
                raise validation_error("Allocations[0].Invoice.InvoiceID is required.")
            if _decimal(allocations[0].get("Amount"), "Allocations[0].Amount") != total:
                raise validation_error("The allocated amount must equal the credit note's total.")
        return {
            "reference": reference,
            "contact": contact,
            "currency": currency.upper(),
            "total": total,
            "status": status,
            "invoice_id": invoice_id,
        }

    def _execute_create(self, db: sqlite3.Connection, note: dict[str, Any], key: str | None, now: float) -> Response:
        invoice = None
        if note["invoice_id"] is not None:
            invoice = self._invoice_row(db, note["invoice_id"])
            problems = self._allocation_problems(invoice, note["currency"], note["total"])
            if problems:
                raise validation_error(*problems)
        credit_id = self._insert_credit_note(
            db, note=note, key=key, now=now, visible_at=now + self.config.lookup_visibility_delay_seconds
        )
        if invoice is not None and note["status"] == "AUTHORISED":
            self._apply_allocation(db, credit_id, invoice["id"], note["total"], now)
        row = self._credit_row(db, credit_id)
        assert row is not None
        return Response(200, {"Id": str(uuid.uuid4()), "Status": "OK", "CreditNotes": [self._credit_json(db, row)]})

    def _allocation_problems(self, invoice: sqlite3.Row | None, currency: str, amount: Decimal) -> list[str]:
        if invoice is None:
            return ["The bill to allocate to does not exist."]
        problems = []
        if invoice["status"] == "VOIDED":
            problems.append(f"Bill {invoice['number']} is voided: nothing can be allocated to it.")
        if invoice["currency"] != currency:
            problems.append(f"Bill {invoice['number']} is in {invoice['currency']}, not {currency}.")
        if amount > Decimal(invoice["amount_due"]):
            problems.append(
                f"The amount {amount} is more than bill {invoice['number']}'s amount due ({invoice['amount_due']})."
            )
        return problems

    def _insert_credit_note(
        self,
        db: sqlite3.Connection,
        *,
        note: dict[str, Any],
        key: str | None,
        now: float,
        visible_at: float,
        planted: bool = False,
    ) -> str:
        credit_id = str(uuid.uuid4())
        (count,) = db.execute("SELECT COUNT(*) FROM credit_notes").fetchone()
        db.execute(
            "INSERT INTO credit_notes (id, number, reference, contact, currency, total, status, invoice_id, "
            "created_at, visible_at, updated_at, idempotency_key, planted) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                credit_id,
                f"CN-{count + 1:05d}",
                note["reference"],
                note["contact"],
                note["currency"],
                str(note["total"]),
                note["status"],
                note["invoice_id"],
                now,
                visible_at,
                now,
                key,
                int(planted),
            ),
        )
        return credit_id

    def _apply_allocation(
        self, db: sqlite3.Connection, credit_id: str, invoice_id: str, amount: Decimal, now: float
    ) -> None:
        invoice = self._invoice_row(db, invoice_id)
        assert invoice is not None
        due = Decimal(invoice["amount_due"]) - amount
        db.execute(
            "UPDATE invoices SET amount_due = ?, status = ?, updated_at = ? WHERE id = ?",
            (str(due), "PAID" if due == 0 else invoice["status"], now, invoice_id),
        )
        row = self._credit_row(db, credit_id)
        assert row is not None
        allocated = Decimal(row["allocated"]) + amount
        db.execute(
            "UPDATE credit_notes SET allocated = ?, invoice_id = ?, status = ?, updated_at = ? WHERE id = ?",
            (
                str(allocated),
                invoice_id,
                "PAID" if allocated == Decimal(row["total"]) else row["status"],
                now,
                credit_id,
            ),
        )

    # -- PUT /CreditNotes/{id}/Allocations and POST /CreditNotes/{id} (void) -------------------

    def allocate(self, credit_id: str, body: dict[str, Any]) -> Response:
        allocations = body.get("Allocations")
        if not isinstance(allocations, list) or len(allocations) != 1 or not isinstance(allocations[0], dict):
            raise validation_error("Send exactly one allocation in Allocations.")
        invoice = allocations[0].get("Invoice")
        invoice_id = invoice.get("InvoiceID") if isinstance(invoice, dict) else None
        amount = _decimal(allocations[0].get("Amount"), "Amount")
        with self._tx() as db:
            now = self.now()
            row = self._credit_row(db, credit_id)
            if row is None:
                raise XeroError(404, "NotFound", f"No credit note {credit_id}.")
            if row["status"] != "AUTHORISED":
                raise validation_error(f"Only an AUTHORISED credit note can be allocated; this one is {row['status']}.")
            if amount > Decimal(row["total"]) - Decimal(row["allocated"]):
                raise validation_error("The amount is more than the credit note's remaining credit.")
            bill = self._invoice_row(db, str(invoice_id))
            problems = self._allocation_problems(bill, row["currency"], amount)
            if problems:
                raise validation_error(*problems)
            assert bill is not None
            self._apply_allocation(db, credit_id, bill["id"], amount, now)
            return Response(200, {"Allocations": [{"Amount": _money(amount), "Invoice": {"InvoiceID": bill["id"]}}]})

    def update_credit_note(self, credit_id: str, request: Request) -> Response:
        """POST /CreditNotes/{id} with Status VOIDED: the correction path. Voiding is a "set"
        step: voiding a voided credit note changes nothing and answers the same."""
        body = _json_body(request)
        notes = body.get("CreditNotes")
        wanted = notes[0].get("Status") if isinstance(notes, list) and notes and isinstance(notes[0], dict) else None
        if wanted != "VOIDED":
            raise validation_error("Only Status VOIDED can be set on a credit note here.")
        with self._lock:
            fault = self.faults.pick("create", action_id=_header(request.headers, "Idempotency-Key"))
        refused = _refusal(fault)
        if refused is not None:
            return refused
        if fault is not None and fault.mode == "slow":
            time.sleep(fault.sleep_seconds)
        with self._tx() as db:
            now = self.now()
            row = self._credit_row(db, credit_id)
            if row is None:
                raise XeroError(404, "NotFound", f"No credit note {credit_id}.")
            if row["status"] != "VOIDED":
                allocated = Decimal(row["allocated"])
                if row["invoice_id"] and allocated:
                    invoice = self._invoice_row(db, row["invoice_id"])
                    assert invoice is not None
                    due = Decimal(invoice["amount_due"]) + allocated
                    status = "AUTHORISED" if invoice["status"] == "PAID" else invoice["status"]
                    db.execute(
                        "UPDATE invoices SET amount_due = ?, status = ?, updated_at = ? WHERE id = ?",
                        (str(due), status, now, invoice["id"]),
                    )
                db.execute(
                    "UPDATE credit_notes SET status = 'VOIDED', allocated = '0', updated_at = ? WHERE id = ?",
                    (now, credit_id),
                )
            row = self._credit_row(db, credit_id)
            assert row is not None
            response = Response(200, {"Status": "OK", "CreditNotes": [self._credit_json(db, row)]})
        return self._deliver(response, fault, None, "")

    # -- reads --------------------------------------------------------------------------------

    def _lookup(self, compute: Any) -> Response:
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

    def list_credit_notes(self, query: str) -> Response:
        """GET /CreditNotes?where=Reference=="..." (only what is visible yet), or ?page=N, optionally
        within a span of creation times: ``where=CreatedDateUTC>=DateTime(2026,12,05,18,00,00)&&
        CreatedDateUTC<DateTime(...)``, in the accounting system's where syntax."""
        params = dict(parse_qsl(query, keep_blank_values=True))
        where = params.get("where")
        if where is not None and where.replace(" ", "").startswith("CreatedDateUTC"):
            params["where_created"], where = where, None
        with self._tx() as db:
            now = self.now()
            if where is not None:
                prefix, quote = 'Reference=="', '"'
                if not (where.startswith(prefix) and where.endswith(quote) and len(where) > len(prefix)):
                    raise validation_error('Only where=Reference=="..." is supported by the sandbox.')
                reference = where[len(prefix) : -1]
                rows = db.execute(
                    "SELECT * FROM credit_notes WHERE reference = ? AND visible_at <= ? ORDER BY seq",
                    (reference, now),
                ).fetchall()
            else:
                try:
                    page = max(int(params.get("page", "1")), 1)
                except ValueError:
                    raise validation_error("page must be a whole number.") from None
                conditions, args = ["visible_at <= ?"], [now]
                for operator, seconds in _created_bounds(params.get("where_created", "")):
                    conditions.append(f"created_at {operator} ?")
                    args.append(seconds)
                # Only fixed fragments are interpolated; every value is a bound parameter.
                sql = f"SELECT * FROM credit_notes WHERE {' AND '.join(conditions)}"  # noqa: S608
                rows = db.execute(
                    sql + " ORDER BY seq LIMIT ? OFFSET ?", (*args, PAGE_SIZE, (page - 1) * PAGE_SIZE)
                ).fetchall()
            return Response(200, {"CreditNotes": [self._credit_json(db, row) for row in rows]})

    def get_credit_note(self, credit_id: str) -> Response:
        with self._tx() as db:
            row = self._credit_row(db, credit_id)
            if row is None:
                raise XeroError(404, "NotFound", f"No credit note {credit_id}.")
            return Response(200, {"CreditNotes": [self._credit_json(db, row)]})

    def get_invoice(self, invoice_id: str) -> Response:
        with self._tx() as db:
            row = self._invoice_row(db, invoice_id)
            if row is None:
                raise XeroError(404, "NotFound", f"No invoice {invoice_id}.")
            return Response(200, {"Invoices": [self._invoice_json(db, row)]})

    def _invoice_row(self, db: sqlite3.Connection, invoice_id: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = db.execute("SELECT * FROM invoices WHERE id = ?", (invoice_id,)).fetchone()
        return row

    def _credit_row(self, db: sqlite3.Connection, credit_id: str) -> sqlite3.Row | None:
        row: sqlite3.Row | None = db.execute("SELECT * FROM credit_notes WHERE id = ?", (credit_id,)).fetchone()
        return row

    def _credit_json(self, db: sqlite3.Connection, row: sqlite3.Row) -> dict[str, Any]:
        data: dict[str, Any] = {
            "CreditNoteID": row["id"],
            "CreditNoteNumber": row["number"],
            "Type": "ACCPAYCREDIT",
            "Reference": row["reference"],
            "Contact": {"Name": row["contact"]},
            "CurrencyCode": row["currency"],
            "Total": _money(Decimal(row["total"])),
            "RemainingCredit": _money(Decimal(row["total"]) - Decimal(row["allocated"])),
            "Status": row["status"],
            "UpdatedDateUTC": f"/Date({int(row['updated_at'] * 1000)}+0000)/",
            "CreatedDateUTC": f"/Date({int(row['created_at'] * 1000)}+0000)/",
            "Allocations": [],
        }
        if row["invoice_id"] and Decimal(row["allocated"]):
            data["Allocations"] = [
                {"Amount": _money(Decimal(row["allocated"])), "Invoice": {"InvoiceID": row["invoice_id"]}}
            ]
        return data

    def _invoice_json(self, db: sqlite3.Connection, row: sqlite3.Row) -> dict[str, Any]:
        return {
            "InvoiceID": row["id"],
            "InvoiceNumber": row["number"],
            "Type": "ACCPAY",
            "Contact": {"Name": row["contact"]},
            "CurrencyCode": row["currency"],
            "Total": _money(Decimal(row["total"])),
            "AmountDue": _money(Decimal(row["amount_due"])),
            "Status": row["status"],
            "UpdatedDateUTC": f"/Date({int(row['updated_at'] * 1000)}+0000)/",
        }

    # -- control endpoints (/_sandbox/...) ----------------------------------------------------

    def _route_control(self, method: str, name: str, request: Request) -> Response:
        routes: dict[tuple[str, str], Any] = {
            ("GET", "health"): lambda: Response(200, {"status": "ok", "pid": os.getpid(), "now": self.now()}),
            ("POST", "reset"): self.reset,
            ("POST", "invoices"): lambda: self.seed_invoice(_json_body(request)),
            ("POST", "credit_notes"): lambda: self.plant_credit_note(_json_body(request)),
            ("GET", "ledger"): self.ledger,
            ("GET", "faults"): lambda: Response(200, self.faults.to_json()),
            ("POST", "faults"): lambda: self.add_faults(_json_body(request)),
            ("DELETE", "faults"): self.clear_faults,
            ("GET", "config"): lambda: Response(200, asdict(self.config)),
            ("POST", "config"): lambda: self.set_config(_json_body(request)),
            ("GET", "clock"): lambda: Response(200, {"now": self.now(), "offset_seconds": self._clock_offset}),
            ("POST", "clock"): lambda: self.advance_clock(_json_body(request)),
        }
        if method == "POST" and name.startswith("invoices/") and name.endswith("/void"):
            return self.void_invoice(name.split("/")[1])
        route = routes.get((method, name))
        if route is None:
            raise XeroError(404, "NotFound", f"No control endpoint {method} /_sandbox/{name}.")
        response: Response = route()
        return response

    def reset(self) -> Response:
        with self._tx() as db:
            db.execute("DELETE FROM idempotency_keys")
            db.execute("DELETE FROM credit_notes")
            db.execute("DELETE FROM invoices")
            self._generation += 1
            self.faults.clear()
            self.faults.reseed(self._fault_seed)
            self.config = AccountingConfig(**asdict(self._defaults))
            self._clock_offset = 0.0
        return Response(200, {"status": "reset"})

    def seed_invoice(self, body: dict[str, Any]) -> Response:
        """Store a supplier bill: {InvoiceID?, InvoiceNumber, Contact, CurrencyCode, Total, AmountDue?}."""
        invoice_id = body.get("InvoiceID") or str(uuid.uuid4())
        number = body.get("InvoiceNumber")
        contact = body.get("Contact") or "Supplier"
        currency = body.get("CurrencyCode")
        if not isinstance(number, str) or not number:
            raise validation_error("InvoiceNumber is required.")
        if not isinstance(currency, str) or len(currency) != 3:
            raise validation_error("CurrencyCode must be a three-letter code.")
        total = _decimal(body.get("Total"), "Total")
        due = _decimal(body.get("AmountDue", body.get("Total")), "AmountDue")
        with self._tx() as db:
            if self._invoice_row(db, str(invoice_id)) is not None:
                raise validation_error(f"Invoice {invoice_id} already exists.")
            db.execute(
                "INSERT INTO invoices (id, number, contact, currency, total, amount_due, status, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, 'AUTHORISED', ?)",
                (str(invoice_id), number, str(contact), currency.upper(), str(total), str(due), self.now()),
            )
            row = self._invoice_row(db, str(invoice_id))
            assert row is not None
            return Response(200, self._invoice_json(db, row))

    def void_invoice(self, invoice_id: str) -> Response:
        with self._tx() as db:
            if self._invoice_row(db, invoice_id) is None:
                raise XeroError(404, "NotFound", f"No invoice {invoice_id}.")
            db.execute("UPDATE invoices SET status = 'VOIDED', updated_at = ? WHERE id = ?", (self.now(), invoice_id))
            row = self._invoice_row(db, invoice_id)
            assert row is not None
            return Response(200, self._invoice_json(db, row))

    def plant_credit_note(self, body: dict[str, Any]) -> Response:
        """Store a credit note directly, bypassing keys, faults and validation: for audit tests,
        which need exactly the duplicates the real API would not make on its own."""
        note = {
            "reference": str(body.get("Reference", "")),
            "contact": str(body.get("Contact", "Supplier")),
            "currency": str(body.get("CurrencyCode", "EUR")).upper(),
            "total": _decimal(body.get("Total"), "Total"),
            "status": str(body.get("Status", "AUTHORISED")),
            "invoice_id": None,
        }
        with self._tx() as db:
            now = self.now()
            credit_id = self._insert_credit_note(db, note=note, key=None, now=now, visible_at=now, planted=True)
            row = self._credit_row(db, credit_id)
            assert row is not None
            return Response(200, self._credit_json(db, row))

    def ledger(self) -> Response:
        """Every credit note ever stored, oldest first, visible or not, and every bill."""
        with self._tx() as db:
            now = self.now()
            notes = []
            for row in db.execute("SELECT * FROM credit_notes ORDER BY seq").fetchall():
                data = self._credit_json(db, row)
                data["InvoiceID"] = row["invoice_id"]
                data["sandbox"] = {
                    "visible": row["visible_at"] <= now,
                    "idempotency_key": row["idempotency_key"],
                    "planted": bool(row["planted"]),
                }
                notes.append(data)
            invoices = [self._invoice_json(db, row) for row in db.execute("SELECT * FROM invoices ORDER BY seq")]
        return Response(200, {"CreditNotes": notes, "Invoices": invoices})

    def add_faults(self, body: dict[str, Any]) -> Response:
        modes = set(body.get("probabilities") or {}) | ({body["mode"]} if "mode" in body else set())
        if modes & UNSUPPORTED_MODES:
            raise validation_error(
                f"Credit notes do not settle later: {sorted(modes & UNSUPPORTED_MODES)} are not modes here."
            )
        with self._lock:
            try:
                queued = self.faults.configure(body)
            except FaultError as exc:
                raise validation_error(str(exc)) from exc
            return Response(200, {"queued": [fault.to_json() for fault in queued], **self.faults.to_json()})

    def clear_faults(self) -> Response:
        with self._lock:
            self.faults.clear()
            return Response(200, self.faults.to_json())

    def set_config(self, body: dict[str, Any]) -> Response:
        with self._lock:
            try:
                self.config.update(body)
            except ValueError as exc:
                raise validation_error(str(exc)) from exc
            return Response(200, asdict(self.config))

    def advance_clock(self, body: dict[str, Any]) -> Response:
        seconds = body.get("advance_seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise validation_error("advance_seconds must be a non-negative number")
        with self._lock:
            self._clock_offset += float(seconds)
            return Response(200, {"now": self.now(), "offset_seconds": self._clock_offset})
