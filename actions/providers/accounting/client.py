"""A thin, typed client for the Xero-compatible accounting API (credit notes against bills).

Why not the official ``xero-python`` SDK: its ``AccountingApi(api_client, base_url=...)`` can be
pointed at another address, but it is generated code without type hints, it insists on an OAuth2
token store with refresh callbacks (a sandbox has no OAuth server), and its transport (urllib3)
folds timeouts, dropped connections and 5xx into exceptions that must be unpicked to tell an
ambiguous answer from a definitive one, which is the one thing this client exists to do. Five
endpoints on ``requests`` (already a dependency) are simpler to read and to test; README's
dependency table records the decision.

Every error is typed as the engine's answer tables read them (``actions.providers.base``):
DefinitiveError (a validation error: nothing saved), AmbiguousError (timeout, dropped
connection, 5xx, 429, key in flight), IdempotencyMismatchError, NotFoundError.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import requests

from actions.providers.base import (
    AmbiguousError,
    ConfigurationError,
    DefinitiveError,
    IdempotencyMismatchError,
    LookupFailed,
    NotFoundError,
    ProviderError,
    retry_after_seconds,
)
from actions.providers.http import ThreadSessions, environment_session

API_PATH = "/api.xro/2.0"
PAGE_SIZE = 100


class CreditNoteStatus:
    DRAFT = "DRAFT"
    SUBMITTED = "SUBMITTED"
    AUTHORISED = "AUTHORISED"
    PAID = "PAID"
    VOIDED = "VOIDED"
    DELETED = "DELETED"


@dataclass(frozen=True)
class CreateCreditNote:
    """One supplier credit note, allocated to its bill in the same request."""

    idempotency_key: str
    reference: str
    contact_name: str
    invoice_id: str
    currency: str
    amount: Decimal
    description: str

    def body(self) -> dict[str, Any]:
        amount = str(self.amount)
        return {
            "CreditNotes": [
                {
                    "Type": "ACCPAYCREDIT",
                    "Status": CreditNoteStatus.AUTHORISED,
                    "Contact": {"Name": self.contact_name},
                    "Reference": self.reference,
                    "CurrencyCode": self.currency,
                    "LineItems": [{"Description": self.description, "Quantity": 1, "UnitAmount": amount}],
                    "Allocations": [{"Amount": amount, "Invoice": {"InvoiceID": self.invoice_id}}],
                }
            ]
        }


def json_date(value: Any) -> datetime | None:
    """A date in the accounting system's JSON form, ``/Date(1733421600000+0000)/``; None if absent."""
    match = re.fullmatch(r"/Date\((-?\d+)([+-]\d{4})?\)/", str(value or ""))
    return datetime.fromtimestamp(int(match.group(1)) / 1000, tz=UTC) if match else None


@dataclass(frozen=True)
class CreditNote:
    id: str
    number: str
    reference: str
    status: str
    total: Decimal
    currency: str
    invoice_id: str | None
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)
    created: datetime | None = field(default=None, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CreditNote:
        allocations = data.get("Allocations") or []
        invoice_id = data.get("InvoiceID")
        if allocations and isinstance(allocations[0], dict):
            invoice_id = (allocations[0].get("Invoice") or {}).get("InvoiceID") or invoice_id
        return cls(
            id=str(data["CreditNoteID"]),
            number=str(data.get("CreditNoteNumber", "")),
            reference=str(data.get("Reference", "")),
            status=str(data.get("Status", "")),
            total=Decimal(str(data.get("Total", "0"))),
            currency=str(data.get("CurrencyCode", "")).upper(),
            invoice_id=invoice_id,
            raw=data,
            created=json_date(data.get("CreatedDateUTC")),
        )


@dataclass(frozen=True)
class Invoice:
    id: str
    number: str
    status: str
    currency: str
    total: Decimal
    amount_due: Decimal
    updated: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Invoice:
        return cls(
            id=str(data["InvoiceID"]),
            number=str(data.get("InvoiceNumber", "")),
            status=str(data.get("Status", "")),
            currency=str(data.get("CurrencyCode", "")).upper(),
            total=Decimal(str(data.get("Total", "0"))),
            amount_due=Decimal(str(data.get("AmountDue", "0"))),
            updated=str(data.get("UpdatedDateUTC", "")),
        )


def _messages(body: dict[str, Any]) -> str:
    texts = [
        str(error.get("Message", ""))
        for element in body.get("Elements") or []
        if isinstance(element, dict)
        for error in element.get("ValidationErrors") or []
        if isinstance(error, dict)
    ]
    return "; ".join(texts) or str(body.get("Message", ""))


class AccountingClient:
    """Speaks the accounting API over one keep-alive requests session per thread (a dispatcher's
    threads call it at the same time, and requests does not promise a shared Session is safe)."""

    name = "accounting"

    def __init__(self, *, api_base: str, access_token: str, tenant_id: str, timeout_seconds: float) -> None:
        self.api_base = api_base.rstrip("/")
        self.timeout_seconds = timeout_seconds
        headers = {"Authorization": f"Bearer {access_token}", "xero-tenant-id": tenant_id, "Accept": "application/json"}
        self._sessions = ThreadSessions(lambda: environment_session(base_url=self.api_base, headers=headers))

    @property
    def session(self) -> requests.Session:
        """This thread's session."""
        return self._sessions.current()

    # -- the transport, and what its failures mean ----------------------------------------------

    def _call(self, method: str, path: str, *, lookup: bool, **kwargs: Any) -> dict[str, Any]:
        """One HTTP call. A write's unclear failure is AmbiguousError; a read's is LookupFailed."""
        unclear = LookupFailed if lookup else AmbiguousError
        try:
            response = self.session.request(
                method, f"{self.api_base}{API_PATH}{path}", timeout=self.timeout_seconds, **kwargs
            )
        except requests.Timeout as error:
            raise unclear(f"no answer within {self.timeout_seconds}s", code="timeout") from error
        except requests.RequestException as error:
            raise unclear(f"the connection failed: {type(error).__name__}", code="connection_error") from error
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        status = response.status_code
        if status == 200:
            return body
        message = _messages(body) or f"HTTP {status}"
        code = str(body.get("Type") or status)
        if status == 400:
            # Xero's ValidationException: nothing was saved, and nothing will be.
            raise DefinitiveError(message, code=code, http_status=status, raw=body)
        if status == 404:
            raise NotFoundError(message, code=code, http_status=status, raw=body)
        if status == 422 and code == "IdempotencyKeyMismatch":
            raise IdempotencyMismatchError(message, code=code, http_status=status, raw=body)
        if status in (401, 403):
            raise ConfigurationError(message, code=code, http_status=status, raw=body)
        # 409 (key in flight), 429, 5xx and anything unexpected prove nothing either way.
        raise unclear(
            message,
            code=code,
            http_status=status,
            raw=body,
            retry_after=retry_after_seconds(response.headers.get("Retry-After")) if status == 429 else None,
        )

    @staticmethod
    def _one_credit_note(body: dict[str, Any]) -> CreditNote:
        notes = body.get("CreditNotes") or []
        if len(notes) != 1:
            raise AmbiguousError(f"expected one credit note in the answer, got {len(notes)}", raw=body)
        return CreditNote.from_json(notes[0])

    # -- the endpoints ----------------------------------------------------------------------------

    def create_credit_note(self, request: CreateCreditNote) -> CreditNote:
        """PUT /CreditNotes with the Idempotency-Key: created once per key while it is retained."""
        body = self._call(
            "PUT",
            "/CreditNotes",
            lookup=False,
            data=json.dumps(request.body()),
            headers={"Idempotency-Key": request.idempotency_key, "Content-Type": "application/json"},
        )
        return self._one_credit_note(body)

    def find_credit_notes(self, *, reference: str) -> list[CreditNote]:
        """GET /CreditNotes?where=Reference=="..."; may miss credit notes younger than the lag."""
        body = self._call("GET", "/CreditNotes", lookup=True, params={"where": f'Reference=="{reference}"'})
        return [CreditNote.from_json(note) for note in body.get("CreditNotes") or []]

    def get_credit_note(self, credit_note_id: str) -> CreditNote:
        return self._one_credit_note(self._call("GET", f"/CreditNotes/{credit_note_id}", lookup=True))

    def allocate(self, *, credit_note_id: str, invoice_id: str, amount: Decimal) -> None:
        self._call(
            "PUT",
            f"/CreditNotes/{credit_note_id}/Allocations",
            lookup=False,
            json={"Allocations": [{"Amount": str(amount), "Invoice": {"InvoiceID": invoice_id}}]},
        )

    def get_invoice(self, invoice_id: str) -> Invoice:
        body = self._call("GET", f"/Invoices/{invoice_id}", lookup=True)
        invoices = body.get("Invoices") or []
        if len(invoices) != 1:
            raise LookupFailed(f"expected one invoice, got {len(invoices)}", raw=body)
        return Invoice.from_json(invoices[0])

    def void_credit_note(self, *, credit_note_id: str, idempotency_key: str) -> CreditNote:
        """POST /CreditNotes/{id} Status VOIDED. Setting VOIDED twice changes nothing."""
        body = self._call(
            "POST",
            f"/CreditNotes/{credit_note_id}",
            lookup=False,
            json={"CreditNotes": [{"CreditNoteID": credit_note_id, "Status": CreditNoteStatus.VOIDED}]},
            headers={"Idempotency-Key": idempotency_key},
        )
        return self._one_credit_note(body)

    def iter_ledger(
        self, *, created_from: datetime | None = None, created_before: datetime | None = None
    ) -> Iterator[CreditNote]:
        """The credit notes created from ``created_from`` up to, not including, ``created_before``
        (None: no bound), page by page (GET /CreditNotes?where=...&page=N). Raises LookupFailed."""
        clauses = [
            f"CreatedDateUTC{operator}DateTime({when.astimezone(UTC):%Y,%m,%d,%H,%M,%S})"
            for operator, when in ((">=", created_from), ("<", created_before))
            if when is not None
        ]
        where = {"where": "&&".join(clauses)} if clauses else {}
        page = 1
        while True:
            body = self._call("GET", "/CreditNotes", lookup=True, params={**where, "page": page})
            notes = body.get("CreditNotes") or []
            for note in notes:
                yield CreditNote.from_json(note)
            if len(notes) < PAGE_SIZE:
                return
            page += 1


__all__ = [
    "AccountingClient",
    "CreateCreditNote",
    "CreditNote",
    "CreditNoteStatus",
    "Invoice",
    "ProviderError",
]
