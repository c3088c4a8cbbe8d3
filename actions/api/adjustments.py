"""The agent API for invoice adjustments: adjustment requests on bills, and proposals.

Registered on the same API as refunds (``actions.api.views.api``) when ``actions.api.urls``
imports this module; same semantics: 201 created, 200 the same proposal again, 409 naming the
differing fields, 422 naming each invalid field. Scope ``invoice_adjustment``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from django.http import HttpRequest
from django.urls import reverse
from ninja import Schema, Status
from pydantic import ConfigDict, Field, Strict

from actions.api.schemas import (
    ActionOut,
    CurrencyCode,
    ExternalReference,
    decimal_amount,
    document_number,
)
from actions.api.views import idempotent_post, opened, proposed
from actions.kinds.fields import MAX_EVIDENCE_LENGTH, MAX_NOTE_LENGTH
from actions.models import AdjustmentReason, AdjustmentRequest
from actions.proposals.adjustments import agent_adjustment_request_open, agent_invoice_adjustment_propose

BillNumber = Annotated[
    str, document_number("The supplier bill's number, as the accounting system shows it.", "INV-2291")
]


class AdjustmentRequestOpen(Schema):
    """Open an adjustment request on a bill. Idempotent by ``external_reference``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"bill_number": "INV-2291", "external_reference": "MATCH-7731", "note": "Unit price above the PO."}
            ]
        },
    )

    bill_number: BillNumber
    external_reference: ExternalReference
    note: str = Field("", max_length=MAX_NOTE_LENGTH, description="What failed the purchase-order match.")


class AdjustmentRequestOut(Schema):
    bill_number: str
    adjustment_number: int
    external_reference: str | None
    created_at: datetime
    links: dict[str, str]


class InvoiceAdjustmentProposal(Schema):
    """Propose a credit note against a supplier bill, for one of its adjustment requests.

    Sending the same proposal again is always safe: it returns the existing action.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "bill_number": "INV-2291",
                    "adjustment_number": 1,
                    "amount": "20.00",
                    "currency": "EUR",
                    "reason_code": "price_mismatch",
                    "evidence": "PO-8812 says 18.00 a unit; the bill charges 20.00 for 10 units.",
                }
            ]
        },
    )

    bill_number: BillNumber
    adjustment_number: Annotated[int, Strict()] = Field(
        ge=1, le=1_000_000, description="The adjustment request's number on the bill (1, 2, ...)."
    )
    amount: str = decimal_amount(
        'The credit note\'s amount as a decimal string, e.g. "20.00". Never a JSON number.', "20.00"
    )
    currency: CurrencyCode
    reason_code: AdjustmentReason = Field(description="Why the bill failed its purchase-order match.")
    evidence: str = Field("", max_length=MAX_EVIDENCE_LENGTH, description="Free text for the manager who decides.")


def adjustment_request_out(request: AdjustmentRequest) -> AdjustmentRequestOut:
    return AdjustmentRequestOut(
        bill_number=request.bill.number,
        adjustment_number=request.number,
        external_reference=request.external_reference,
        created_at=request.created_at,
        links={"propose_invoice_adjustment": reverse("api-v1:invoice_adjustments")},
    )


@idempotent_post(
    "/adjustment-requests",
    AdjustmentRequestOut,
    url_name="adjustment_requests",
    summary="Open an adjustment request on a supplier bill",
    tag="invoice adjustments",
)
def open_adjustment_request(request: HttpRequest, payload: AdjustmentRequestOpen) -> Status[AdjustmentRequestOut]:
    """Open the next adjustment request on a bill. Idempotent by external reference: 201 with the
    new request, 200 with the one this reference opened before, 409 when the reference already
    belongs to a request on another bill."""
    return opened(request, "adjustment_request", agent_adjustment_request_open, payload, adjustment_request_out)


@idempotent_post(
    "/invoice-adjustments",
    ActionOut,
    url_name="invoice_adjustments",
    summary="Propose an invoice adjustment (a credit note against a supplier bill)",
    tag="invoice adjustments",
)
def propose_invoice_adjustment(request: HttpRequest, payload: InvoiceAdjustmentProposal) -> Status[ActionOut]:
    """Propose an invoice adjustment. 201 with the new action; 200 with the existing one when the
    same proposal was made before; 409 when the adjustment request already has a different
    proposal (the differing fields are listed); 422 naming each invalid field."""
    return proposed(request, "invoice_adjustment", agent_invoice_adjustment_propose, payload)
