"""The MCP tools for invoice adjustments, through the SDK's own client against the
real ASGI app: open an adjustment request, propose the credit note, read what became of it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from actions.agents.services import INVOICE_ADJUSTMENT_SCOPE, agent_token_issue
from actions.models import Action, ActionKind, AdjustmentRequest, Bill
from tests.factories import make_adjustment_request, make_agent, make_bill
from tests.mcp.conftest import mcp_call, mcp_tools

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def payable_token(agent_owner: Any) -> str:
    """A token of an agent that matches supplier bills (the invoice_adjustment scope only)."""
    agent = make_agent(agent_owner, name="matcher-bot", scopes=[INVOICE_ADJUSTMENT_SCOPE])
    return agent_token_issue(agent=agent).plain


def _proposal(bill: Bill, **changes: Any) -> dict[str, Any]:
    return {
        "bill_number": bill.number,
        "adjustment_number": 1,
        "amount": "20.00",
        "currency": "EUR",
        "reason_code": "price_mismatch",
        "evidence": "PO says 18.00 a unit; the bill charges 20.00 for 10 units.",
        **changes,
    }


def test_the_adjustment_tools_are_listed_as_idempotent_writes(mcp_url: str, payable_token: str) -> None:
    tools = {tool.name: tool for tool in mcp_tools(mcp_url, payable_token)}
    propose = tools["propose_invoice_adjustment"]
    assert propose.annotations is not None
    assert (propose.annotations.read_only_hint, propose.annotations.idempotent_hint) == (False, True)
    assert propose.annotations.destructive_hint is True
    assert "it never creates a second credit note" in (propose.description or "")
    opening = tools["open_adjustment_request"]
    assert opening.annotations is not None and opening.annotations.idempotent_hint is True


def test_an_agent_opens_a_request_proposes_once_and_reads_the_state(mcp_url: str, payable_token: str) -> None:
    bill = make_bill(amount="200.00")
    opening = {"bill_number": bill.number, "external_reference": "MATCH-7731", "note": "Unit price above the PO."}

    opened = mcp_call(mcp_url, payable_token, "open_adjustment_request", opening)
    reopened = mcp_call(mcp_url, payable_token, "open_adjustment_request", opening)
    first = mcp_call(mcp_url, payable_token, "propose_invoice_adjustment", _proposal(bill))
    again = mcp_call(mcp_url, payable_token, "propose_invoice_adjustment", _proposal(bill))

    assert opened.structured_content is not None and reopened.structured_content is not None
    assert (opened.structured_content["created"], reopened.structured_content["created"]) == (True, False)
    assert opened.structured_content["adjustment_number"] == 1
    assert AdjustmentRequest.objects.filter(bill=bill).count() == 1
    assert not first.is_error and not again.is_error
    assert first.structured_content is not None and again.structured_content is not None
    action_id = f"invoice-adjustment:bill-{bill.number}:adjustment-1"
    assert first.structured_content["action_id"] == again.structured_content["action_id"] == action_id
    assert Action.objects.filter(kind=ActionKind.INVOICE_ADJUSTMENT).count() == 1

    # Reading its state: the same document as the API's, and what to do next.
    read = mcp_call(mcp_url, payable_token, "get_action", {"action_id": action_id}).structured_content
    explained = mcp_call(mcp_url, payable_token, "explain_action", {"action_id": action_id}).structured_content
    stored = Action.objects.get(action_id=action_id)
    assert read is not None and explained is not None
    assert read["status"] == explained["status"] == stored.status
    assert read["amount"] == "20.00" and read["currency"] == "EUR"
    assert explained["explanation"]["final"] is False
    assert "Never send a new proposal" in explained["agent_should"]


def test_a_changed_adjustment_is_needs_person_naming_the_fields(mcp_url: str, payable_token: str) -> None:
    bill = make_bill(amount="200.00")
    make_adjustment_request(bill)
    mcp_call(mcp_url, payable_token, "propose_invoice_adjustment", _proposal(bill))

    changed = mcp_call(mcp_url, payable_token, "propose_invoice_adjustment", _proposal(bill, amount="21.00"))

    assert changed.is_error
    error = changed.structured_content
    assert error is not None
    assert (error["error"], error["code"]) == ("needs_person", "payload_conflict")
    assert error["action_id"] == f"invoice-adjustment:bill-{bill.number}:adjustment-1"
    assert error["differing"] == {"amount": {"existing": "20.00", "proposed": "21.00"}}
    assert Action.objects.get(bill=bill).amount == 20


def test_bad_arguments_are_bad_input_naming_each_field_and_write_nothing(mcp_url: str, payable_token: str) -> None:
    bill = make_bill(amount="200.00")
    make_adjustment_request(bill)

    shapes = mcp_call(
        mcp_url, payable_token, "propose_invoice_adjustment", _proposal(bill, amount=20, adjustment_number="1")
    )
    unknown = mcp_call(mcp_url, payable_token, "propose_invoice_adjustment", _proposal(bill, bill_number="NO-SUCH"))
    too_much = mcp_call(mcp_url, payable_token, "propose_invoice_adjustment", _proposal(bill, amount="200.01"))

    assert shapes.structured_content is not None and shapes.structured_content["error"] == "bad_input"
    assert {e["field"] for e in shapes.structured_content["errors"]} == {"amount", "adjustment_number"}
    assert unknown.structured_content is not None
    assert [(e["field"], e["code"]) for e in unknown.structured_content["errors"]] == [("bill_number", "not_found")]
    assert too_much.structured_content is not None
    assert [(e["field"], e["code"]) for e in too_much.structured_content["errors"]] == [
        ("amount", "over_adjustable_balance")
    ]
    assert not Action.objects.exists()


def test_an_agent_without_the_adjustment_scope_needs_a_person(mcp_url: str, token: str) -> None:
    """The default agent may refund, not adjust bills."""
    bill = make_bill(amount="200.00")
    make_adjustment_request(bill)

    result = mcp_call(mcp_url, token, "propose_invoice_adjustment", _proposal(bill))
    opening = mcp_call(
        mcp_url, token, "open_adjustment_request", {"bill_number": bill.number, "external_reference": "MATCH-1"}
    )

    for refused in (result, opening):
        assert refused.structured_content is not None
        assert (refused.structured_content["error"], refused.structured_content["code"]) == (
            "needs_person",
            "scope_missing",
        )
    assert not Action.objects.exists()
    assert AdjustmentRequest.objects.filter(bill=bill).count() == 1


def test_opening_an_adjustment_request_is_logged_with_the_bill_and_adjustment_numbers(
    mcp_url: str, payable_token: str, caplog: pytest.LogCaptureFixture
) -> None:
    bill = make_bill(amount="200.00")
    opening = {"bill_number": bill.number, "external_reference": "MATCH-7731"}
    with caplog.at_level(logging.INFO):
        mcp_call(mcp_url, payable_token, "open_adjustment_request", opening)
        mcp_call(mcp_url, payable_token, "open_adjustment_request", opening)

    opened = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mcp.adjustment_request.")]
    assert opened == [
        f"mcp.adjustment_request.opened agent=matcher-bot bill={bill.number} adjustment=1",
        f"mcp.adjustment_request.replayed agent=matcher-bot bill={bill.number} adjustment=1",
    ]
