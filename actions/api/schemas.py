"""Request and response schemas: they validate requests and generate the OpenAPI document.

Request schemas check form (types, patterns, lengths, choices) and refuse unknown fields, so
that a misspelt field is an error rather than a silently ignored one. The services check
meaning (does the order exist, is the amount refundable) and name the field either way.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AwareDatetime, ConfigDict, Field, Strict, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from actions.foundation.text import unsafe_characters, unsafe_characters_message
from actions.kinds.fields import MAX_EVIDENCE_LENGTH, MAX_NOTE_LENGTH
from actions.models import ReasonCode

ORDER_NUMBER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,31}$"
EXTERNAL_REFERENCE_PATTERN = r"^[A-Za-z0-9#][A-Za-z0-9_.:#/@+\-]{0,99}$"

# Every status an agent can see (NEW never leaves memory). A test keeps this list equal to
# ActionStatus.
ActionStatusName = Literal[
    "PROPOSED",
    "REJECTED",
    "AUTHORIZED",
    "STALE",
    "CANCELLED",
    "SUBMITTING",
    "SETTLING",
    "SUCCEEDED",
    "FAILED_FINAL",
    "UNKNOWN",
    "NEEDS_REVIEW",
]

# A decimal amount in the currency's major unit, e.g. "12.50": never a JSON number.
DECIMAL_PATTERN = r"^[0-9]+(\.[0-9]+)?$"


def document_number(description: str, example: str) -> Any:
    """A business document's number (an order's, a supplier bill's), as its own system shows it."""
    return Field(min_length=1, max_length=32, pattern=ORDER_NUMBER_PATTERN, description=description, examples=[example])


def decimal_amount(description: str, example: str) -> Any:
    return Field(min_length=1, max_length=20, pattern=DECIMAL_PATTERN, description=description, examples=[example])


OrderNumber = Annotated[str, document_number("The order's number, as the shop shows it.", "4821")]
CurrencyCode = Annotated[
    str, Field(min_length=3, max_length=3, pattern=r"^[A-Za-z]{3}$", description="ISO 4217 code.", examples=["EUR"])
]
ExternalReference = Annotated[
    str,
    Field(
        min_length=1,
        max_length=100,
        pattern=EXTERNAL_REFERENCE_PATTERN,
        description="The support ticket's id (or another reference that names the customer's request once).",
        examples=["ZD-48213"],
    ),
]


class _Request(Schema):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="after")
    @classmethod
    def _no_control_characters(cls, value: Any, info: ValidationInfo) -> Any:
        # Every string field of every request, so that a field added later is covered too.
        if isinstance(value, str):
            codes = unsafe_characters(value)
            if codes:
                raise PydanticCustomError(
                    "invalid_characters", unsafe_characters_message(codes), {"field": info.field_name}
                )
        return value


def service_arguments(payload: Schema) -> dict[str, Any]:
    """A request's fields as the agent-facing service's keyword arguments: the request schemas
    name their fields as the services name their parameters, so the API and the MCP tools pass
    them through rather than each spelling them out; a choice goes as its plain value."""
    return {name: value.value if isinstance(value, Enum) else value for name, value in payload}


class RefundProposal(_Request):
    """Propose a refund for a refund request on an order.

    Name the refund request by its number (``request_number``) or by the external reference
    it was opened with (``external_reference``), not both. Sending the same proposal again is
    always safe: it returns the existing action.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "order_number": "4821",
                    "request_number": 1,
                    "amount": "12.50",
                    "currency": "EUR",
                    "reason_code": "damaged",
                    "evidence": "Customer sent a photo of the broken lid (ticket ZD-48213).",
                }
            ]
        },
    )

    order_number: OrderNumber
    request_number: Annotated[int, Strict()] | None = Field(
        None, ge=1, le=1_000_000, description="The refund request's number on the order (1, 2, ...)."
    )
    external_reference: ExternalReference | None = None
    amount: str = decimal_amount(
        'The amount as a decimal string in the currency\'s major unit, e.g. "12.50". Never a JSON number: binary '
        "floating point cannot hold most decimal amounts exactly.",
        "12.50",
    )
    currency: CurrencyCode
    reason_code: ReasonCode = Field(description="Why the customer gets money back.")
    evidence: str = Field(
        "",
        max_length=MAX_EVIDENCE_LENGTH,
        description="Free text for the manager who decides: what the customer said, what the agent checked.",
    )

    @model_validator(mode="after")
    def _one_request_reference(self) -> RefundProposal:
        if (self.request_number is None) == (self.external_reference is None):
            raise PydanticCustomError(
                "one_request_reference",
                "Give either request_number or external_reference (exactly one).",
                {"field": "request_number"},
            )
        return self


class SupplierEmailProposal(_Request):
    """Propose an email to a supplier, rendered from one of the console's templates.

    Never raw text or HTML: name the template and give its parameters; the console renders the
    subject and the body now and the manager approves exactly that. ``to`` must be one of the
    supplier's known contacts. Sending the same proposal again returns the existing action.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "supplier": "ACME",
                    "reference": "bill-BL-1042",
                    "template": "bill_adjusted",
                    "parameters": {
                        "supplier_name": "Acme Widgets",
                        "bill_number": "BL-1042",
                        "amount": "120.00",
                        "currency": "EUR",
                        "reason": "Two pallets arrived damaged.",
                    },
                    "to": "ap@acme.example",
                }
            ]
        },
    )

    supplier: str = Field(min_length=1, max_length=32, description="The supplier's code.", examples=["ACME"])
    reference: str = Field(
        min_length=1,
        max_length=32,
        description="The business reference the message is about (a bill, a purchase order); with the "
        "supplier and the template it names the action.",
        examples=["bill-BL-1042"],
    )
    template: str = Field(min_length=1, max_length=64, description="A template name: bill_adjusted, po_mismatch_query.")
    parameters: dict[str, str] = Field(
        default_factory=dict, description="Every parameter the template names, as strings; no others."
    )
    to: str = Field(min_length=1, max_length=254, description="One of the supplier's known contact addresses.")
    evidence: str = Field(
        "", max_length=MAX_EVIDENCE_LENGTH, description="Free text for the manager who decides: why this message."
    )


class RefundRequestOpen(_Request):
    """Open a refund request on an order. Idempotent by ``external_reference``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "order_number": "4821",
                    "external_reference": "ZD-48213",
                    "reason_code": "damaged",
                    "note": "Lid arrived broken.",
                }
            ]
        },
    )

    order_number: OrderNumber
    external_reference: ExternalReference
    reason_code: ReasonCode = Field(description="Why the customer asks for money back.")
    note: str = Field("", max_length=MAX_NOTE_LENGTH, description="What the customer asked for, in a sentence.")


class OrderUpsert(_Request):
    """An order as the shop's commerce system knows it. Idempotent by ``order_number``.

    Send the whole order each time it changes (items cancelled, amount changed): the console
    compares it with what it holds, applies the difference and raises the order's version, so
    that approvals given for the old order are asked for again.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "order_number": "4821",
                    "customer_name": "Ada Lovelace",
                    "customer_email": "ada@example.com",
                    "currency": "EUR",
                    "captured_amount": "1000.00",
                    "charge_reference": "ch_4821",
                    "paid_at": "2026-11-28T10:15:00Z",
                }
            ]
        },
    )

    order_number: OrderNumber
    customer_name: str = Field(min_length=1, max_length=200, description="The customer's name, for managers.")
    customer_email: str = Field(
        "", max_length=254, description="The customer's email address; empty keeps the one recorded."
    )
    currency: CurrencyCode
    captured_amount: str = decimal_amount(
        'What the customer paid and the provider captured, as a decimal string, e.g. "79.00". It can go down (items '
        "cancelled) but never below what is refunded and reserved for refunds.",
        "1000.00",
    )
    charge_reference: str = Field(
        "",
        max_length=255,
        pattern=r"^[A-Za-z0-9_]*$",
        description="The payment provider's charge id (refunds are made on it). Once set it cannot change; "
        "empty means not known, and the one recorded (e.g. by the charge import) is kept.",
        examples=["ch_4821"],
    )
    paid_at: AwareDatetime = Field(description="When the customer paid, with its UTC offset.")


# --- responses ----------------------------------------------------------------------------


class FieldError(Schema):
    field: str = Field(description="The request field, e.g. 'amount'; nested fields are joined with dots.")
    code: str = Field(description="Machine-readable, e.g. 'required', 'invalid_format', 'not_found'.")
    message: str


class Differing(Schema):
    existing: Any = None
    proposed: Any = None


class Problem(Schema):
    """An RFC 9457 problem document (media type application/problem+json)."""

    type: str = Field(description="A link to this kind of problem on the docs page.")
    title: str
    status: int
    detail: str
    instance: str | None = None
    code: str = Field(description="Machine-readable reason, e.g. 'token_missing', 'validation_failed'.")
    errors: list[FieldError] = Field(default_factory=list, description="One entry per invalid field.")
    action_id: str | None = Field(None, description="For a conflict: the action the proposal collides with.")
    differing: dict[str, Differing] | None = Field(
        None, description="For a conflict: each material field whose existing and proposed values differ."
    )
    links: dict[str, str] | None = Field(None, description="For a conflict: 'existing', the action to read.")


class StatusExplanationOut(Schema):
    summary: str = Field(description="What is true now, in a sentence.")
    next_step: str = Field(description="What happens next, and what the agent should (not) do.")
    held_by: str = Field(description="Who or what the action waits for: a role, never a person's name.")
    final: bool = Field(description="True when nothing will change any more.")
    needs_person: bool = Field(description="True when a person must act before anything changes.")


class RejectionReason(Schema):
    code: str
    message: str


class ActionOut(Schema):
    action_id: str = Field(description="Names the business action, e.g. 'refund:order-4821:request-1'.")
    kind: str
    status: ActionStatusName
    explanation: StatusExplanationOut
    order_number: str | None
    request_number: int | None
    external_reference: str | None
    amount: str = Field(description="Decimal string.")
    currency: str
    reason_code: str
    provider_reference: str | None = Field(description="The payment provider's id for the refund, once known.")
    rejection_reasons: list[RejectionReason]
    created_at: datetime
    updated_at: datetime
    status_changed_at: datetime | None
    links: dict[str, str]


class ActionPageOut(Schema):
    items: list[ActionOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= to read the next page; null on the last page.")
    links: dict[str, str]


class RefundRequestOut(Schema):
    order_number: str
    request_number: int
    external_reference: str | None
    source: str
    created_at: datetime
    links: dict[str, str]


class OrderOut(Schema):
    order_number: str
    customer_name: str
    currency: str
    captured_amount: str = Field(description="Decimal string.")
    refunded_amount: str = Field(description="Refunded through the console (and booked outside refunds).")
    reserved_amount: str = Field(description="Held for refunds whose outcome is not final yet.")
    refundable_amount: str = Field(description="What can still be refunded: captured - refunded - reserved.")
    version: int = Field(description="Raised by every change; approvals given at an older version go stale.")
    charge_reference: str | None
    paid_at: datetime
    created_at: datetime
    changed: list[str] = Field(description="The fields this request changed (empty when nothing changed).")
    links: dict[str, str]
