"""Both agent interfaces answer the same call the same way: the parity table.

Every agent-facing REST operation (the ninja API's registered operations) and every MCP tool
(the MCP server's tool list) has an entry in ``OPERATIONS``, and every entry answers each row
of ``ROWS``: with cases that run on both interfaces, or with the reason the row does not apply.
``test_every_rest_operation_and_mcp_tool_has_an_entry_with_every_row`` fails when an operation
or a tool is added without its entry.

Three agents with one owner: A (alpha-bot) opened requests and proposed actions; B (beta-bot)
has the same scopes and tries to reach A's requests and actions, by reference and by number;
C (gamma-bot) has no scope at all.

Each case runs against two copies of one world, one per interface, so that a write through one
interface cannot change what the other answers. The answers are compared as classes of answer
(REST 404 and MCP ``bad_input``/``action_not_found`` are both "not found", and so on, in
``REST_OUTCOMES`` and ``MCP_OUTCOMES``), then code for code, field problem for field problem
and, for the records, document for document, after each world's own names are replaced by
placeholders. A case with a ``twin`` (another agent's record) must answer exactly as its twin
(a record that does not exist) on each interface. A refusal writes nothing.

REST-only operations (orders, supplier emails, workflows) run their rows on REST alone; their
entry says why MCP has no tool for them.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db.models import Sum

import actions.api.urls  # noqa: F401 (registers the adjustments' and workflows' operations on the API)
from actions.agents.services import INVOICE_ADJUSTMENT_SCOPE, ORDERS_SCOPE, agent_token_issue
from actions.api.views import api as ninja_api
from actions.kinds.refund.proposal import action_propose_refund
from actions.kinds.supplier_email.proposal import supplier_email_propose
from actions.mcp.server import mcp_server
from actions.models import (
    Action,
    ActionEvent,
    AdjustmentRequest,
    Agent,
    Order,
    RefundRequest,
    Supplier,
    SupplierContact,
    Workflow,
)
from actions.services import Actor
from actions.workflows.services import workflow_propose
from tests.api.conftest import ApiClient
from tests.factories import make_adjustment_request, make_agent, make_bill, make_order, make_request, make_user
from tests.mail import BILL_PARAMETERS
from tests.mcp.conftest import McpServerThread, mcp_call

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = ("missing_scope", "another_agent", "replay", "conflict", "bad_fields", "unknown_id")

ALL_SCOPES = ["refund", INVOICE_ADJUSTMENT_SCOPE, "supplier_email", ORDERS_SCOPE]

# The class of each answer. REST: by status. MCP: by error kind and code, as the MCP server
# documents them (actions.proposals.outcomes); an MCP answer this table does not know fails.
REST_OUTCOMES = {200: "accepted", 201: "accepted", 403: "forbidden", 404: "not_found", 409: "conflict", 422: "invalid"}
MCP_OUTCOMES = {
    ("bad_input", "action_not_found"): "not_found",
    ("needs_person", "scope_missing"): "forbidden",
    ("bad_input", "validation_failed"): "invalid",
    ("needs_person", "payload_conflict"): "conflict",
    ("needs_person", "proposed_elsewhere"): "conflict",
    ("needs_person", "reference_taken"): "conflict",
    # The one conflict MCP leaves to the agent: it named the wrong order or bill.
    ("bad_input", "reference_conflict"): "conflict",
}

# Keys of a problem document (REST) or a tool error (MCP) that belong to the transport: the
# status, the words (MCP adds what a model should do next), the links.
_TRANSPORT_KEYS = {"type", "title", "status", "instance", "detail", "links", "error", "retry_after_seconds"}
# Keys of a record's document that say when, or whether this call made it.
_MOMENT_KEYS = {"created_at", "updated_at", "status_changed_at", "created"}


# --- the world: the same records twice, once per interface ---------------------------------


@dataclass(frozen=True)
class World:
    """One copy of the records. ``n`` is the copy's digit: its names differ only by it."""

    n: str
    names: dict[str, str] = field(default_factory=dict)

    @property
    def order(self) -> str:
        return f"{self.n}821"

    @property
    def other_order(self) -> str:
        return f"{self.n}822"

    @property
    def unknown_order(self) -> str:
        return f"{self.n}899"

    @property
    def bill(self) -> str:
        return f"INV-{self.n}2"

    @property
    def other_bill(self) -> str:
        return f"INV-{self.n}3"

    @property
    def unknown_bill(self) -> str:
        return f"INV-{self.n}9"

    def ref(self, name: str) -> str:
        """An external reference of this copy: ``ZD-A`` is A's ticket, ``MATCH-A`` A's mismatch."""
        return f"{name}{self.n}"

    @property
    def a_refund(self) -> str:
        return f"refund:order-{self.order}:request-1"

    @property
    def a_adjustment(self) -> str:
        return f"invoice-adjustment:bill-{self.bill}:adjustment-1"

    @property
    def a_workflow(self) -> str:
        return f"refund-notice:order-{self.order}:request-4:case-A"

    def placeholders(self) -> dict[str, str]:
        names = {
            self.order: "<order>",
            self.other_order: "<other-order>",
            self.unknown_order: "<unknown-order>",
            self.bill: "<bill>",
            self.other_bill: "<other-bill>",
            self.unknown_bill: "<unknown-bill>",
        }
        for ref in ("ZD-A", "ZD-C", "ZD-N", "ZD-X", "ZD-T", "MATCH-A", "MATCH-C", "MATCH-N", "MATCH-T"):
            names[self.ref(ref)] = f"<{ref}>"
        return names


def build_world(
    n: str, agents: dict[str, Agent], clients: dict[str, ApiClient], *, with_rest_only_records: bool
) -> World:
    """A's requests are opened as A opens them, through the API; its actions through the
    proposal services. Requests 2 to 4 of the order and 2 of the bill come from a ticket and
    the matcher: no agent opened them, so every agent may propose against them."""
    world = World(n)
    actor = Actor.for_agent(agents["A"])
    order = make_order(number=world.order, captured="1000.00")
    make_order(number=world.other_order)
    opened = clients["A"].post(
        "/api/v1/refund-requests",
        {"order_number": world.order, "external_reference": world.ref("ZD-A"), "reason_code": "damaged"},
    )
    assert opened.status_code == 201, opened.content
    for number in (2, 3, 4):
        make_request(order, number, external_reference=world.ref("ZD-T") + str(number))
    for number in (1, 2):
        action_propose_refund(
            order_number=world.order,
            request_number=number,
            amount="40.00",
            currency="EUR",
            reason_code="damaged",
            evidence="Photo of the broken lid.",
            proposer=actor,
        )
    bill = make_bill(number=world.bill, amount="200.00")
    make_bill(number=world.other_bill)
    opened = clients["A"].post(
        "/api/v1/adjustment-requests", {"bill_number": world.bill, "external_reference": world.ref("MATCH-A")}
    )
    assert opened.status_code == 201, opened.content
    make_adjustment_request(bill, 2, external_reference=world.ref("MATCH-T"))
    for number in (1, 2):
        proposed = clients["A"].post("/api/v1/invoice-adjustments", adjustment_args(world, adjustment_number=number))
        assert proposed.status_code == 201, proposed.content
    if with_rest_only_records:
        supplier = Supplier.objects.create(code="ACME", name="Acme Widgets")
        SupplierContact.objects.create(supplier=supplier, email="ap@acme.example", name="Accounts payable")
        supplier_email_propose(proposer=actor, **email_args())
        workflow_propose(template="refund_with_notice", parameters=workflow_parameters(world), proposer=actor)
    return world


def refund_args(world: World, **changes: Any) -> dict[str, Any]:
    """A's proposal for its own request 1, as it was made."""
    return {
        "order_number": world.order,
        "request_number": 1,
        "amount": "40.00",
        "currency": "EUR",
        "reason_code": "damaged",
        "evidence": "Photo of the broken lid.",
        **changes,
    }


def by_reference(world: World, reference: str, **changes: Any) -> dict[str, Any]:
    args = refund_args(world, external_reference=reference, **changes)
    del args["request_number"]
    return args


def adjustment_args(world: World, **changes: Any) -> dict[str, Any]:
    return {
        "bill_number": world.bill,
        "adjustment_number": 1,
        "amount": "20.00",
        "currency": "EUR",
        "reason_code": "price_mismatch",
        "evidence": "PO says 18.00 a unit; the bill charges 20.00.",
        **changes,
    }


def email_args(**changes: Any) -> dict[str, Any]:
    return {
        "supplier": "ACME",
        "reference": "bill-BL-1042",
        "template": "bill_adjusted",
        "parameters": dict(BILL_PARAMETERS),
        "to": "ap@acme.example",
        **changes,
    }


def workflow_parameters(world: World, **changes: Any) -> dict[str, Any]:
    """A's refund_with_notice plan, on the ticket's request 4."""
    return {
        "order_number": world.order,
        "request_number": 4,
        "case": "case-A",
        "amount": "30.00",
        "currency": "EUR",
        "reason_code": "damaged",
        **changes,
    }


def order_args(world: World, **changes: Any) -> dict[str, Any]:
    """The order as the console holds it: sending it again changes nothing."""
    order = Order.objects.get(number=world.order)
    return {
        "order_number": order.number,
        "customer_name": order.customer_name,
        "customer_email": order.customer_email,
        "currency": order.currency,
        "captured_amount": str(order.captured_amount),
        "charge_reference": order.charge_reference,
        "paid_at": order.paid_at.isoformat(),
        **changes,
    }


# --- the table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    agent: str  # "A", "B" or "C"
    arguments: Callable[[World], dict[str, Any]]
    outcome: str
    code: str | None = None
    # The (field, code) pairs of a refusal for bad input.
    fields: frozenset[tuple[str, str]] | None = None
    # A call that must answer exactly as this one (another agent's record, and no record).
    twin: Callable[[World], dict[str, Any]] | None = None
    # More about the document of an accepted call.
    check: Callable[[dict[str, Any], World], None] | None = None
    # False where each transport's own parser words a problem (unknown query parameters).
    same_messages: bool = True


@dataclass(frozen=True)
class NotApplicable:
    why: str


@dataclass(frozen=True)
class Operation:
    name: str
    rest: tuple[str, str]  # (method, path under /api/v1)
    mcp: str | None
    rows: dict[str, list[Case] | NotApplicable]
    no_mcp_because: str = ""


def _fields(*pairs: tuple[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset(pairs)


def _b_sees_none_of_as_actions(document: dict[str, Any], world: World) -> None:
    assert document["items"] == []
    assert document["next_cursor"] is None


def _a_sees_its_own_actions(document: dict[str, Any], world: World) -> None:
    # Both copies of the world hold A's actions; A sees every one of them and only them.
    mine = Action.objects.filter(proposed_by_agent__name="alpha-bot").count()
    assert len(document["items"]) == mine > 0


def _explained(document: dict[str, Any], world: World) -> None:
    assert document["action_id"] == world.a_refund
    assert document["explanation"]["final"] is False


_READS_NEED_NO_SCOPE = "Reading needs no scope: an agent reads and lists its own records whatever it may do."

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "open a refund request",
        rest=("POST", "/refund-requests"),
        mcp="open_refund_request",
        rows={
            "missing_scope": [
                Case(
                    "scopeless agent",
                    "C",
                    lambda w: {"order_number": w.order, "external_reference": w.ref("ZD-C"), "reason_code": "damaged"},
                    "forbidden",
                    "scope_missing",
                )
            ],
            "another_agent": [
                Case(
                    "B opens with A's reference",
                    "B",
                    lambda w: {"order_number": w.order, "external_reference": w.ref("ZD-A"), "reason_code": "damaged"},
                    "conflict",
                    "reference_taken",
                )
            ],
            "replay": [
                Case(
                    "A opens its reference again",
                    "A",
                    lambda w: {"order_number": w.order, "external_reference": w.ref("ZD-A"), "reason_code": "damaged"},
                    "accepted",
                    check=lambda document, w: _request_is(document, 1),
                )
            ],
            "conflict": [
                Case(
                    "A's reference on another order",
                    "A",
                    lambda w: {
                        "order_number": w.other_order,
                        "external_reference": w.ref("ZD-A"),
                        "reason_code": "damaged",
                    },
                    "conflict",
                    "reference_conflict",
                )
            ],
            "bad_fields": [
                Case(
                    "a malformed order number and no reason",
                    "A",
                    lambda w: {"order_number": "no spaces", "external_reference": w.ref("ZD-N")},
                    "invalid",
                    "validation_failed",
                    _fields(("order_number", "invalid_format"), ("reason_code", "required")),
                )
            ],
            "unknown_id": [
                Case(
                    "an order that does not exist",
                    "A",
                    lambda w: {
                        "order_number": w.unknown_order,
                        "external_reference": w.ref("ZD-N"),
                        "reason_code": "damaged",
                    },
                    "invalid",
                    "validation_failed",
                    _fields(("order_number", "not_found")),
                )
            ],
        },
    ),
    Operation(
        "propose a refund",
        rest=("POST", "/refunds"),
        mcp="propose_refund",
        rows={
            "missing_scope": [
                Case("scopeless agent", "C", lambda w: refund_args(w, request_number=3), "forbidden", "scope_missing")
            ],
            "another_agent": [
                Case(
                    "B proposes against A's request by number",
                    "B",
                    lambda w: refund_args(w, amount="10.00"),
                    "invalid",
                    "validation_failed",
                    _fields(("request_number", "not_found")),
                    twin=lambda w: refund_args(w, request_number=9, amount="10.00"),
                ),
                Case(
                    "B proposes against A's request by reference",
                    "B",
                    lambda w: by_reference(w, w.ref("ZD-A"), amount="10.00"),
                    "invalid",
                    "validation_failed",
                    _fields(("external_reference", "not_found")),
                    twin=lambda w: by_reference(w, w.ref("ZD-X"), amount="10.00"),
                ),
                Case(
                    "B sends A's proposal on a ticket's request",
                    "B",
                    lambda w: refund_args(w, request_number=2),
                    "conflict",
                    "proposed_elsewhere",
                ),
                Case(
                    "B sends another proposal on a ticket's request A proposed on",
                    "B",
                    lambda w: refund_args(w, request_number=2, amount="41.00"),
                    "conflict",
                    "proposed_elsewhere",
                ),
            ],
            "replay": [
                Case(
                    "A sends its proposal again, by number",
                    "A",
                    refund_args,
                    "accepted",
                    check=lambda document, w: _action_is(document, w.a_refund),
                ),
                Case(
                    "A sends its proposal again, by reference",
                    "A",
                    lambda w: by_reference(w, w.ref("ZD-A")),
                    "accepted",
                    check=lambda document, w: _action_is(document, w.a_refund),
                ),
            ],
            "conflict": [
                Case(
                    "A changes the amount",
                    "A",
                    lambda w: refund_args(w, amount="41.00"),
                    "conflict",
                    "payload_conflict",
                    check=lambda problem, w: _differing_is(problem, {"amount"}),
                )
            ],
            "bad_fields": [
                Case(
                    "a malformed amount and currency",
                    "A",
                    lambda w: refund_args(w, request_number=3, amount="12.5.0", currency="EURO"),
                    "invalid",
                    "validation_failed",
                    _fields(("amount", "invalid_format"), ("currency", "too_long")),
                ),
                Case(
                    "more than the order can pay (its figures stay hidden)",
                    "A",
                    lambda w: refund_args(w, request_number=3, amount="5000.00"),
                    "invalid",
                    "validation_failed",
                    _fields(("amount", "over_refundable_balance")),
                    check=lambda problem, w: _says_nothing_of_the_balance(problem),
                ),
            ],
            "unknown_id": [
                Case(
                    "an order that does not exist",
                    "A",
                    lambda w: refund_args(w, order_number=w.unknown_order),
                    "invalid",
                    "validation_failed",
                    _fields(("order_number", "not_found")),
                )
            ],
        },
    ),
    Operation(
        "open an adjustment request",
        rest=("POST", "/adjustment-requests"),
        mcp="open_adjustment_request",
        rows={
            "missing_scope": [
                Case(
                    "scopeless agent",
                    "C",
                    lambda w: {"bill_number": w.bill, "external_reference": w.ref("MATCH-C")},
                    "forbidden",
                    "scope_missing",
                )
            ],
            "another_agent": [
                Case(
                    "B opens with A's reference",
                    "B",
                    lambda w: {"bill_number": w.bill, "external_reference": w.ref("MATCH-A")},
                    "conflict",
                    "reference_taken",
                )
            ],
            "replay": [
                Case(
                    "A opens its reference again",
                    "A",
                    lambda w: {"bill_number": w.bill, "external_reference": w.ref("MATCH-A")},
                    "accepted",
                    check=lambda document, w: _adjustment_request_is(document, 1),
                )
            ],
            "conflict": [
                Case(
                    "A's reference on another bill",
                    "A",
                    lambda w: {"bill_number": w.other_bill, "external_reference": w.ref("MATCH-A")},
                    "conflict",
                    "reference_conflict",
                )
            ],
            "bad_fields": [
                Case(
                    "a malformed bill number",
                    "A",
                    lambda w: {"bill_number": "no spaces", "external_reference": w.ref("MATCH-N")},
                    "invalid",
                    "validation_failed",
                    _fields(("bill_number", "invalid_format")),
                )
            ],
            "unknown_id": [
                Case(
                    "a bill that does not exist",
                    "A",
                    lambda w: {"bill_number": w.unknown_bill, "external_reference": w.ref("MATCH-N")},
                    "invalid",
                    "validation_failed",
                    _fields(("bill_number", "not_found")),
                )
            ],
        },
    ),
    Operation(
        "propose an invoice adjustment",
        rest=("POST", "/invoice-adjustments"),
        mcp="propose_invoice_adjustment",
        rows={
            "missing_scope": [Case("scopeless agent", "C", adjustment_args, "forbidden", "scope_missing")],
            "another_agent": [
                # An adjustment proposal names its request by number only; B's use of A's
                # reference is the "open an adjustment request" row.
                Case(
                    "B proposes against A's request by number",
                    "B",
                    lambda w: adjustment_args(w, amount="5.00"),
                    "invalid",
                    "validation_failed",
                    _fields(("adjustment_number", "not_found")),
                    twin=lambda w: adjustment_args(w, adjustment_number=9, amount="5.00"),
                ),
                Case(
                    "B sends A's proposal on the matcher's request",
                    "B",
                    lambda w: adjustment_args(w, adjustment_number=2),
                    "conflict",
                    "proposed_elsewhere",
                ),
            ],
            "replay": [
                Case(
                    "A sends its proposal again",
                    "A",
                    adjustment_args,
                    "accepted",
                    check=lambda document, w: _action_is(document, w.a_adjustment),
                )
            ],
            "conflict": [
                Case(
                    "A changes the amount",
                    "A",
                    lambda w: adjustment_args(w, amount="21.00"),
                    "conflict",
                    "payload_conflict",
                    check=lambda problem, w: _differing_is(problem, {"amount"}),
                )
            ],
            "bad_fields": [
                Case(
                    "a number for the amount, a string for the request",
                    "A",
                    lambda w: adjustment_args(w, amount=20, adjustment_number="1"),
                    "invalid",
                    "validation_failed",
                    _fields(("amount", "invalid_type"), ("adjustment_number", "invalid_type")),
                )
            ],
            "unknown_id": [
                Case(
                    "a bill that does not exist",
                    "A",
                    lambda w: adjustment_args(w, bill_number=w.unknown_bill),
                    "invalid",
                    "validation_failed",
                    _fields(("bill_number", "not_found")),
                )
            ],
        },
    ),
    Operation(
        "read an action",
        rest=("GET", "/actions/{action_id}"),
        mcp="get_action",
        rows={
            "missing_scope": NotApplicable(_READS_NEED_NO_SCOPE),
            "another_agent": [
                Case(
                    "B reads A's refund",
                    "B",
                    lambda w: {"action_id": w.a_refund},
                    "not_found",
                    "action_not_found",
                    twin=lambda w: {"action_id": f"refund:order-{w.unknown_order}:request-1"},
                ),
                Case(
                    "B reads A's adjustment",
                    "B",
                    lambda w: {"action_id": w.a_adjustment},
                    "not_found",
                    "action_not_found",
                    twin=lambda w: {"action_id": f"invoice-adjustment:bill-{w.unknown_bill}:adjustment-1"},
                ),
            ],
            "replay": [
                Case(
                    "A reads its refund",
                    "A",
                    lambda w: {"action_id": w.a_refund},
                    "accepted",
                    check=lambda document, w: _action_is(document, w.a_refund),
                )
            ],
            "conflict": NotApplicable("A read writes nothing, so nothing can conflict with it."),
            "bad_fields": [
                Case(
                    "an argument the operation does not take",
                    "A",
                    lambda w: {"action_id": w.a_refund, "colour": "blue"},
                    "invalid",
                    "validation_failed",
                    _fields(("colour", "unknown_field")),
                    same_messages=False,
                )
            ],
            "unknown_id": [
                Case(
                    "an id that does not exist, and one no column could hold",
                    "A",
                    lambda w: {"action_id": f"refund:order-{w.unknown_order}:request-1"},
                    "not_found",
                    "action_not_found",
                    twin=lambda w: {"action_id": "x" * 300},
                )
            ],
        },
    ),
    Operation(
        # Over REST the explanation is part of the action's document.
        "explain an action",
        rest=("GET", "/actions/{action_id}"),
        mcp="explain_action",
        rows={
            "missing_scope": NotApplicable(_READS_NEED_NO_SCOPE),
            "another_agent": [
                Case(
                    "B asks about A's refund",
                    "B",
                    lambda w: {"action_id": w.a_refund},
                    "not_found",
                    "action_not_found",
                    twin=lambda w: {"action_id": f"refund:order-{w.unknown_order}:request-1"},
                )
            ],
            "replay": [
                Case("A asks about its refund", "A", lambda w: {"action_id": w.a_refund}, "accepted", check=_explained)
            ],
            "conflict": NotApplicable("A read writes nothing, so nothing can conflict with it."),
            "bad_fields": [
                Case(
                    "an argument the operation does not take",
                    "A",
                    lambda w: {"action_id": w.a_refund, "colour": "blue"},
                    "invalid",
                    "validation_failed",
                    _fields(("colour", "unknown_field")),
                    same_messages=False,
                )
            ],
            "unknown_id": [
                Case(
                    "an id that does not exist",
                    "A",
                    lambda w: {"action_id": "refund:order-0000:request-9"},
                    "not_found",
                    "action_not_found",
                )
            ],
        },
    ),
    Operation(
        "list actions",
        rest=("GET", "/actions"),
        mcp="list_actions",
        rows={
            "missing_scope": NotApplicable(_READS_NEED_NO_SCOPE),
            "another_agent": [
                Case("B lists: none of A's actions", "B", lambda w: {}, "accepted", check=_b_sees_none_of_as_actions)
            ],
            "replay": [Case("A lists its own actions", "A", lambda w: {}, "accepted", check=_a_sees_its_own_actions)],
            "conflict": NotApplicable("A read writes nothing, so nothing can conflict with it."),
            "bad_fields": [
                Case(
                    "a status that does not exist",
                    "A",
                    lambda w: {"status": ["NOPE"]},
                    "invalid",
                    "validation_failed",
                    _fields(("status.0", "invalid_choice")),
                )
            ],
            "unknown_id": [
                Case(
                    "a cursor this console did not issue",
                    "A",
                    lambda w: {"cursor": "not-a-cursor"},
                    "invalid",
                    "validation_failed",
                    _fields(("cursor", "invalid_cursor")),
                )
            ],
        },
    ),
    Operation(
        "propose a supplier email",
        rest=("POST", "/supplier-emails"),
        mcp=None,
        no_mcp_because="Supplier emails are proposed over REST only; an MCP tool for them must add its row here.",
        rows={
            "missing_scope": [Case("scopeless agent", "C", lambda w: email_args(), "forbidden", "scope_missing")],
            "another_agent": [
                Case("B sends A's email", "B", lambda w: email_args(), "conflict", "proposed_elsewhere"),
            ],
            "replay": [Case("A sends its email again", "A", lambda w: email_args(), "accepted")],
            "conflict": [
                Case(
                    "A changes the parameters",
                    "A",
                    lambda w: email_args(parameters={**BILL_PARAMETERS, "amount": "130.00"}),
                    "conflict",
                    "payload_conflict",
                )
            ],
            "bad_fields": [
                Case(
                    "a header in the address",
                    "A",
                    lambda w: email_args(to="ap@acme.example\r\nBcc: all@evil.example"),
                    "invalid",
                    "validation_failed",
                    _fields(("to", "header_injection")),
                )
            ],
            "unknown_id": [
                Case(
                    "a supplier that does not exist",
                    "A",
                    lambda w: email_args(supplier="NOPE"),
                    "invalid",
                    "validation_failed",
                    _fields(("supplier", "not_found")),
                )
            ],
        },
    ),
    Operation(
        "send an order",
        rest=("POST", "/orders"),
        mcp=None,
        no_mcp_because="Orders come from the shop's commerce system over REST; agents on MCP do not send them.",
        rows={
            "missing_scope": [Case("scopeless agent", "C", order_args, "forbidden", "scope_missing")],
            "another_agent": NotApplicable(
                "Orders are the shop's, not an agent's: every agent with the orders scope sends the same orders."
            ),
            "replay": [Case("A sends the order unchanged", "A", order_args, "accepted")],
            "conflict": [
                Case(
                    "A changes its currency",
                    "A",
                    lambda w: order_args(w, currency="USD"),
                    "conflict",
                    "currency_changed",
                )
            ],
            "bad_fields": [
                Case(
                    "a captured amount that is not one",
                    "A",
                    lambda w: order_args(w, captured_amount="lots"),
                    "invalid",
                    "validation_failed",
                    _fields(("captured_amount", "invalid_format")),
                )
            ],
            "unknown_id": NotApplicable("An order number the console does not know creates the order."),
        },
    ),
    Operation(
        "propose a workflow",
        rest=("POST", "/workflows"),
        mcp=None,
        no_mcp_because="Workflows are proposed over REST only; an MCP tool for them must add its row here.",
        rows={
            "missing_scope": [
                Case(
                    "scopeless agent",
                    "C",
                    lambda w: {"template": "refund_with_notice", "parameters": workflow_parameters(w, case="case-C")},
                    "forbidden",
                    "scope_missing",
                )
            ],
            "another_agent": [
                Case(
                    "B plans a refund on A's request",
                    "B",
                    lambda w: {
                        "template": "refund_with_notice",
                        "parameters": workflow_parameters(w, request_number=1, case="case-B"),
                    },
                    "invalid",
                    "validation_failed",
                    _fields(("parameters.request_number", "not_found")),
                    twin=lambda w: {
                        "template": "refund_with_notice",
                        "parameters": workflow_parameters(w, request_number=9, case="case-B"),
                    },
                ),
                Case(
                    "B sends A's plan",
                    "B",
                    lambda w: {"template": "refund_with_notice", "parameters": workflow_parameters(w)},
                    "conflict",
                    "proposed_elsewhere",
                ),
            ],
            "replay": [
                Case(
                    "A sends its plan again",
                    "A",
                    lambda w: {"template": "refund_with_notice", "parameters": workflow_parameters(w)},
                    "accepted",
                )
            ],
            "conflict": [
                Case(
                    "A changes the amount of its plan",
                    "A",
                    lambda w: {"template": "refund_with_notice", "parameters": workflow_parameters(w, amount="31.00")},
                    "conflict",
                    "live_workflow",
                )
            ],
            "bad_fields": [
                Case(
                    "a currency the console does not take",
                    "A",
                    lambda w: {
                        "template": "refund_with_notice",
                        "parameters": workflow_parameters(w, currency="XXX", case="case-N"),
                    },
                    "invalid",
                    "validation_failed",
                    _fields(("parameters.currency", "unknown_currency")),
                )
            ],
            "unknown_id": [
                Case(
                    "a template that does not exist",
                    "A",
                    lambda w: {"template": "nope", "parameters": {}},
                    "invalid",
                    "validation_failed",
                    _fields(("template", "unknown_template")),
                )
            ],
        },
    ),
    Operation(
        "read a workflow",
        rest=("GET", "/workflows/{workflow_id}"),
        mcp=None,
        no_mcp_because="Workflows are read over REST only; an MCP tool for them must add its row here.",
        rows={
            "missing_scope": NotApplicable("Reading needs no scope: an agent reads its own workflows."),
            "another_agent": [
                Case(
                    "B reads A's workflow",
                    "B",
                    lambda w: {"workflow_id": w.a_workflow},
                    "not_found",
                    "workflow_not_found",
                    twin=lambda w: {"workflow_id": f"refund-notice:order-{w.order}:request-4:case-Z"},
                )
            ],
            "replay": [Case("A reads its workflow", "A", lambda w: {"workflow_id": w.a_workflow}, "accepted")],
            "conflict": NotApplicable("A read writes nothing, so nothing can conflict with it."),
            "bad_fields": [
                Case(
                    "a query parameter the operation does not take",
                    "A",
                    lambda w: {"workflow_id": w.a_workflow, "colour": "blue"},
                    "invalid",
                    "validation_failed",
                    _fields(("colour", "unknown_field")),
                )
            ],
            "unknown_id": [
                Case(
                    "an id that does not exist",
                    "A",
                    lambda w: {"workflow_id": "refund-notice:order-0:request-1:case-Z"},
                    "not_found",
                    "workflow_not_found",
                )
            ],
        },
    ),
)


def _action_is(document: dict[str, Any], action_id: str) -> None:
    assert document["action_id"] == action_id


def _request_is(document: dict[str, Any], number: int) -> None:
    assert document["request_number"] == number


def _adjustment_request_is(document: dict[str, Any], number: int) -> None:
    assert document["adjustment_number"] == number


def _differing_is(problem: dict[str, Any], names: set[str]) -> None:
    assert set(problem["differing"]) == names


def _says_nothing_of_the_balance(problem: dict[str, Any]) -> None:
    text = json.dumps(problem)
    assert "captured" not in text and "reserved" not in text and "1000" not in text


# --- running a case on each interface ------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    outcome: str
    code: str | None
    errors: list[dict[str, str]]
    document: dict[str, Any]


def rest_call(client: ApiClient, operation: Operation, arguments: dict[str, Any]) -> Answer:
    method, path = operation.rest
    rest = dict(arguments)
    for name in re.findall(r"{(\w+)}", path):
        path = path.replace("{" + name + "}", str(rest.pop(name)))
    url = f"/api/v1{path}"
    if method == "GET":
        query = [(key, item) for key, value in rest.items() for item in (value if isinstance(value, list) else [value])]
        response = client.get(url + ("?" + urlencode(query) if query else ""))
    else:
        response = client.post(url, rest)
    assert response.status_code in REST_OUTCOMES, response.content
    document: dict[str, Any] = response.json()
    outcome = REST_OUTCOMES[response.status_code]
    if outcome == "accepted":
        return Answer(outcome, None, [], document)
    return Answer(outcome, document["code"], document["errors"], document)


def mcp_answer(url: str, token: str, operation: Operation, arguments: dict[str, Any]) -> Answer:
    assert operation.mcp is not None
    result = mcp_call(url, token, operation.mcp, arguments)
    document = result.structured_content
    assert document is not None
    if not result.is_error:
        return Answer("accepted", None, [], document)
    key = (document["error"], document["code"])
    assert key in MCP_OUTCOMES, f"an MCP answer the parity table does not know: {key}"
    return Answer(MCP_OUTCOMES[key], document["code"], document["errors"], document)


def _normalized(value: Any, *worlds: World, digits: bool = False) -> Any:
    """The value with the worlds' own names as placeholders (and every number as #, for twins
    that differ only by the number they name). A list of actions holds both worlds' records."""
    text = json.dumps(value, sort_keys=True)
    names = {name: placeholder for world in worlds for name, placeholder in world.placeholders().items()}
    for name, placeholder in sorted(names.items(), key=lambda item: -len(item[0])):
        text = text.replace(name, placeholder)
    if digits:
        text = re.sub(r"\d+", "#", text)
    return json.loads(text)


def _comparable(answer: Answer, *, messages: bool) -> dict[str, Any]:
    """What must be the same on both interfaces: the class, the code, each field problem (with
    its words unless each transport's parser words it) and what the answer says of the record."""
    errors = [
        {key: value for key, value in error.items() if messages or key != "message"} for error in answer.errors
    ]
    if answer.outcome == "accepted":
        document = _without_moments(answer.document)
    else:
        document = {
            key: value for key, value in answer.document.items() if key not in _TRANSPORT_KEYS | {"code", "errors"}
        }
    return {"outcome": answer.outcome, "code": answer.code, "errors": errors, "document": document}


def _without_moments(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_moments(item) for key, item in value.items() if key not in _MOMENT_KEYS}
    if isinstance(value, list):
        return [_without_moments(item) for item in value]
    return value


def _shared(rest: dict[str, Any], mcp: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both answers on the document keys they share: MCP's explain_action answers with the
    action's id, status and explanation, the part of the REST document it explains."""
    keys = set(rest["document"]) & set(mcp["document"])
    return (
        {**rest, "document": {key: rest["document"][key] for key in keys}},
        {**mcp, "document": {key: mcp["document"][key] for key in keys}},
    )


def _written() -> dict[str, Any]:
    return {
        "actions": Action.objects.count(),
        "events": ActionEvent.objects.count(),
        "refund_requests": RefundRequest.objects.count(),
        "adjustment_requests": AdjustmentRequest.objects.count(),
        "workflows": Workflow.objects.count(),
        "order_versions": Order.objects.aggregate(total=Sum("version"))["total"],
    }


# --- the fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parity_server() -> Iterator[str]:
    """One MCP server for the module: each case's records are committed, so its thread sees them."""
    server = McpServerThread()
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def no_workflow_advance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actions.foundation.publish.workflow_advance_enqueue", lambda workflow_id: None)


@dataclass
class Parity:
    tokens: dict[str, str]
    clients: dict[str, ApiClient]
    rest_world: World
    mcp_world: World


@pytest.fixture
def parity(transactional_db: Any) -> Parity:
    owner = make_user("otto.owner", "agent")
    agents = {
        "A": make_agent(owner, name="alpha-bot", scopes=ALL_SCOPES),
        "B": make_agent(owner, name="beta-bot", scopes=ALL_SCOPES),
        "C": make_agent(owner, name="gamma-bot", scopes=[]),
    }
    tokens = {key: agent_token_issue(agent=agent).plain for key, agent in agents.items()}
    clients = {key: ApiClient(token) for key, token in tokens.items()}
    return Parity(
        tokens=tokens,
        clients=clients,
        rest_world=build_world("4", agents, clients, with_rest_only_records=True),
        mcp_world=build_world("5", agents, clients, with_rest_only_records=False),
    )


# --- the tests -----------------------------------------------------------------------------


def _cases() -> Iterator[Any]:
    for operation in OPERATIONS:
        for row in ROWS:
            cases = operation.rows.get(row)
            if isinstance(cases, list):
                for case in cases:
                    yield pytest.param(operation, case, id=f"{operation.name}|{row}|{case.name}")


def _registered_rest_operations() -> set[tuple[str, str]]:
    found = set()
    for _prefix, router in ninja_api._routers:
        for path, path_view in router.path_operations.items():
            for operation in path_view.operations:
                found |= {(method, path) for method in operation.methods}
    return found


def _listed_mcp_tools() -> set[str]:
    return {tool.name for tool in asyncio.run(mcp_server().list_tools())}


def test_every_rest_operation_and_mcp_tool_has_an_entry_with_every_row() -> None:
    rest = _registered_rest_operations()
    tools = _listed_mcp_tools()
    assert rest, "the API registered no operation: the table would pass on nothing"
    assert tools, "the MCP server lists no tool: the table would pass on nothing"
    entered_rest = {operation.rest for operation in OPERATIONS}
    entered_tools = {operation.mcp for operation in OPERATIONS if operation.mcp is not None}
    assert rest - entered_rest == set(), "REST operations without an entry in OPERATIONS"
    assert tools - entered_tools == set(), "MCP tools without an entry in OPERATIONS"
    assert entered_rest - rest == set(), "entries for REST operations the API no longer has"
    assert entered_tools - tools == set(), "entries for MCP tools the server no longer lists"
    for operation in OPERATIONS:
        assert set(operation.rows) == set(ROWS), f"{operation.name}: every row is a case or a reason"
        for row, cases in operation.rows.items():
            assert (isinstance(cases, list) and cases) or (isinstance(cases, NotApplicable) and cases.why), (
                f"{operation.name}|{row}"
            )
        assert operation.mcp is not None or operation.no_mcp_because, f"{operation.name}: why is there no MCP tool?"


@pytest.mark.parametrize(("operation", "case"), list(_cases()))
def test_both_interfaces_answer_alike(parity: Parity, parity_server: str, operation: Operation, case: Case) -> None:
    client = parity.clients[case.agent]
    token = parity.tokens[case.agent]

    def on_rest(arguments: Callable[[World], dict[str, Any]]) -> Answer:
        return rest_call(client, operation, arguments(parity.rest_world))

    def on_mcp(arguments: Callable[[World], dict[str, Any]]) -> Answer:
        return mcp_answer(parity_server, token, operation, arguments(parity.mcp_world))

    interfaces = [("REST", on_rest, parity.rest_world)]
    if operation.mcp is not None:
        interfaces.append(("MCP", on_mcp, parity.mcp_world))
    answers = {}
    for name, call, world in interfaces:
        before = _written()
        answer = call(case.arguments)
        # Every case is a refusal, a replay or a read: none writes anything.
        assert _written() == before, f"{name}: {case.name} wrote something"
        assert (answer.outcome, answer.code) == (case.outcome, case.code), f"{name}: {answer.document}"
        if case.fields is not None:
            fields = {(error["field"], error["code"]) for error in answer.errors}
            assert fields == case.fields, f"{name}: {answer.errors}"
        if case.check is not None:
            case.check(answer.document, world)
        if case.twin is not None:
            twin = call(case.twin)
            assert _normalized(_comparable(answer, messages=True), world, digits=True) == _normalized(
                _comparable(twin, messages=True), world, digits=True
            ), f"{name}: another agent's record answers unlike a missing one"
            if "action_id" in case.arguments(world):
                # An action id is answered byte for byte alike: nothing of it is echoed.
                assert answer.document == twin.document
        answers[name] = _normalized(
            _comparable(answer, messages=case.same_messages), parity.rest_world, parity.mcp_world
        )

    if "MCP" in answers:
        rest, mcp = _shared(answers["REST"], answers["MCP"])
        assert rest["document"] or case.outcome != "accepted", "the two records share nothing to compare"
        assert rest == mcp


def test_the_reported_takeover_over_mcp_is_refused_and_the_opener_still_proposes(
    parity: Parity, parity_server: str
) -> None:
    """The attack as reported: A opens a refund request over REST and has not proposed yet; B
    proposes against it over MCP by A's order and external reference (and tries by number, and
    over REST). B is refused every time as if there were no such request, nothing is written,
    and A's own proposal then goes through."""
    world = parity.mcp_world
    opened = parity.clients["A"].post(
        "/api/v1/refund-requests",
        {"order_number": world.other_order, "external_reference": "ZD-TAKEOVER", "reason_code": "damaged"},
    )
    assert opened.status_code == 201
    by_reference = {
        "order_number": world.other_order,
        "external_reference": "ZD-TAKEOVER",
        "amount": "10.00",
        "currency": "EUR",
        "reason_code": "damaged",
    }
    by_number = {**{k: v for k, v in by_reference.items() if k != "external_reference"}, "request_number": 1}

    for arguments in (by_reference, by_number):
        refused = mcp_call(parity_server, parity.tokens["B"], "propose_refund", arguments)
        assert refused.is_error and refused.structured_content is not None, refused.structured_content
        assert (refused.structured_content["error"], refused.structured_content["code"]) == (
            "bad_input",
            "validation_failed",
        )
        assert refused.structured_content["errors"][0]["code"] == "not_found"
        response = parity.clients["B"].post("/api/v1/refunds", arguments)
        assert (response.status_code, response.json()["errors"][0]["code"]) == (422, "not_found"), response.content

    assert not Action.objects.filter(order__number=world.other_order).exists()
    own = mcp_call(parity_server, parity.tokens["A"], "propose_refund", by_reference)
    assert not own.is_error, own.structured_content
    assert Action.objects.get(order__number=world.other_order).proposed_by_agent.name == "alpha-bot"


def test_another_agents_fresh_adjustment_request_cannot_be_taken_over_on_either_interface(
    parity: Parity, parity_server: str
) -> None:
    """The same for a bill: A opens an adjustment request and has not proposed yet; B's proposal
    against its number is refused on both interfaces as for a request that does not exist."""
    world = parity.mcp_world
    opened = parity.clients["A"].post(
        "/api/v1/adjustment-requests", {"bill_number": world.other_bill, "external_reference": "MATCH-TAKEOVER"}
    )
    assert opened.status_code == 201
    arguments = adjustment_args(world, bill_number=world.other_bill, amount="5.00")

    refused = mcp_call(parity_server, parity.tokens["B"], "propose_invoice_adjustment", arguments)
    response = parity.clients["B"].post("/api/v1/invoice-adjustments", arguments)

    hidden = [("adjustment_number", "not_found")]
    assert refused.structured_content is not None
    assert [(e["field"], e["code"]) for e in refused.structured_content["errors"]] == hidden
    assert response.status_code == 422, response.content
    assert [(e["field"], e["code"]) for e in response.json()["errors"]] == hidden
    assert not Action.objects.filter(bill__number=world.other_bill).exists()
    own = mcp_call(parity_server, parity.tokens["A"], "propose_invoice_adjustment", arguments)
    assert not own.is_error, own.structured_content
