"""A small HTTP client for the accounting sandbox's control endpoints, used by the tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests


@dataclass
class AccountingSandboxClient:
    url: str
    session: requests.Session

    def control(self, method: str, name: str, body: dict[str, Any] | None = None) -> Any:
        response = self.session.request(method, f"{self.url}/_sandbox/{name}", json=body, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    def reset(self) -> None:
        self.control("POST", "reset")

    def configure(self, **values: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.control("POST", "config", values)
        return result

    def fault(self, **spec: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.control("POST", "faults", spec)
        return result

    def advance_clock(self, seconds: float) -> None:
        self.control("POST", "clock", {"advance_seconds": seconds})

    def seed_invoice(self, *, invoice_id: str, number: str, total: str, currency: str = "EUR", **extra: Any) -> Any:
        body = {"InvoiceID": invoice_id, "InvoiceNumber": number, "Total": total, "CurrencyCode": currency, **extra}
        return self.control("POST", "invoices", body)

    def void_invoice(self, invoice_id: str) -> Any:
        return self.control("POST", f"invoices/{invoice_id}/void")

    def plant_credit_note(self, **body: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.control("POST", "credit_notes", body)
        return result

    def ledger(self) -> list[dict[str, Any]]:
        notes: list[dict[str, Any]] = self.control("GET", "ledger")["CreditNotes"]
        return notes

    def invoices(self) -> list[dict[str, Any]]:
        invoices: list[dict[str, Any]] = self.control("GET", "ledger")["Invoices"]
        return invoices

    def credit_notes_for(self, action_id: str) -> list[dict[str, Any]]:
        """Live (not voided) credit notes whose Reference is the action id."""
        return [n for n in self.ledger() if n["Reference"] == action_id and n["Status"] != "VOIDED"]
