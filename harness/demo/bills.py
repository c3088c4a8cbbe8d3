"""Demo supplier bills for ``seed_demo``: bills that failed their purchase-order match, held in the
console and registered with the accounting sandbox, and adjustments proposed on them.

Idempotent like the rest of the seed: a bill, request or proposal that exists is left as it is.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone

from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.models import Action, AdjustmentRequest, Agent, Bill
from actions.proposals.workflows import agent_workflow_propose
from actions.services import Actor

# number, supplier, currency, amount, purchase order, (item, qty, PO price, invoiced price), adjustment, reason
DEMO_BILLS = [
    (
        "INV-2291",
        "Acme Supplies",
        "EUR",
        "200.00",
        "PO-8812",
        ("Widget", 10, "18.00", "20.00"),
        "20.00",
        "price_mismatch",
    ),
    (
        "INV-2292",
        "Northwind Traders",
        "EUR",
        "960.00",
        "PO-8813",
        ("Pallet", 12, "80.00", "80.00"),
        "160.00",
        "quantity_mismatch",
    ),
    (
        "INV-2293",
        "Globex Parts",
        "EUR",
        "450.00",
        "PO-8814",
        ("Bearing", 50, "8.10", "9.00"),
        "45.00",
        "price_mismatch",
    ),
    (
        "INV-2294",
        "Initech Office",
        "USD",
        "310.00",
        "PO-8815",
        ("Chair", 4, "70.00", "77.50"),
        "30.00",
        "price_mismatch",
    ),
    (
        "INV-2295",
        "Umbrella Logistics",
        "EUR",
        "1200.00",
        "PO-8816",
        ("Freight", 1, "1100.00", "1200.00"),
        "100.00",
        "price_mismatch",
    ),
]


# A bill the payables agent resolves with a plan (po_mismatch_resolution: read the documents,
# post the credit note, email the supplier) instead of a single adjustment, so that a manager
# finds a plan waiting. Its supplier is the demo's supplier ACME, whose known contact gets the
# email; the names agree, so the email's greeting names the bill's supplier.
PLAN_BILL = (
    "INV-2296",
    "Acme Supplies",
    "EUR",
    "480.00",
    "PO-8817",
    ("Gasket", 40, "11.00", "12.00"),
    "40.00",
    "price_mismatch",
)
PLAN_SUPPLIER = ("ACME", "ap@acme.example")

# A bill whose adjustment the accounting system saved although its answer was lost: seed_demo's
# scenario hands it to accounts payable (alex), who looks it up and records what it finds.
REVIEW_BILL = (
    "INV-2297",
    "Initrode Packaging",
    "EUR",
    "640.00",
    "PO-8818",
    ("Carton", 400, "1.50", "1.60"),
    "40.00",
    "price_mismatch",
)
# What the payables agent needs to propose that plan: every kind among its steps.
PAYABLES_SCOPES = ["invoice_adjustment", "supplier_email"]


def seed_demo_bills(*, accounting: str, owner: Any) -> str:
    """Create the demo bills, register them with the accounting sandbox at ``accounting`` and
    have the payables agent propose an adjustment on each, or a plan on ``PLAN_BILL``. Returns a
    line for the seed's output."""
    agent, _ = Agent.objects.get_or_create(name="payables-bot", defaults={"owner": owner, "scopes": PAYABLES_SCOPES})
    if not set(PAYABLES_SCOPES) <= set(agent.scopes):
        # A demo seeded before the plan: its agent lacked the supplier-email scope.
        agent.scopes = sorted({*agent.scopes, *PAYABLES_SCOPES})
        agent.save(update_fields=["scopes"])
    reachable = True
    for entry in [*DEMO_BILLS, PLAN_BILL]:
        bill, reachable = _bill(accounting, entry, reachable=reachable)
        if entry is PLAN_BILL:
            _propose_plan(agent, bill, entry)
            continue
        _propose_adjustment(agent, bill, entry)
    if not reachable:
        return f"The accounting sandbox at {accounting} is not reachable: bills were not registered there."
    return (
        f"{len(DEMO_BILLS) + 1} supplier bills with purchase-order mismatches, registered at {accounting}; "
        f"bill {PLAN_BILL[0]} has a plan waiting for a manager."
    )


def _propose_adjustment(agent: Agent, bill: Bill, entry: tuple[Any, ...]) -> Action:
    """The payables agent proposes the adjustment ``entry`` names on ``bill``; proposing it
    again returns the existing action."""
    _, _, currency, _, _, _, adjustment, reason = entry
    request, _ = AdjustmentRequest.objects.get_or_create(
        bill=bill,
        number=1,
        defaults={"external_reference": f"MATCH-{bill.number}", "note": bill.po_mismatch["summary"]},
    )
    return action_propose_invoice_adjustment(
        bill_number=bill.number,
        adjustment_number=request.number,
        amount=adjustment,
        currency=currency,
        reason_code=reason,
        evidence=f"Purchase-order match failed: {bill.po_mismatch['summary']}",
        proposer=Actor.for_agent(agent),
    ).action


def seed_review_adjustment(*, accounting: str) -> Action | None:
    """Register ``REVIEW_BILL`` and have the payables agent (``seed_demo_bills`` made it)
    propose its adjustment. Returns the action, or None when the accounting sandbox cannot be
    reached (the adjustment could then never be looked up)."""
    bill, reachable = _bill(accounting, REVIEW_BILL, reachable=True)
    if not reachable:
        return None
    return _propose_adjustment(Agent.objects.get(name="payables-bot"), bill, REVIEW_BILL)


def plant_credit_note(*, accounting: str, action: Action) -> None:
    """The credit note the accounting system saved for ``action`` although its answer was lost:
    what accounts payable's lookup finds. Raises OSError when the sandbox cannot be reached."""
    bill = action.bill
    assert bill is not None
    _control_post(
        accounting,
        "credit_notes",
        {
            "Reference": action.action_id,
            "Contact": bill.supplier_name,
            "CurrencyCode": action.currency,
            "Total": str(action.amount),
        },
    )


def _propose_plan(agent: Agent, bill: Bill, entry: tuple[Any, ...]) -> None:
    """The payables agent proposes the po_mismatch_resolution plan for ``bill``, through the
    agent operation the API calls (its scopes are checked); proposing it again returns the
    live plan."""
    supplier, to = PLAN_SUPPLIER
    agent_workflow_propose(
        agent=agent,
        template="po_mismatch_resolution",
        parameters={
            "bill_number": bill.number,
            "case": f"MATCH-{bill.number}",
            "amount": entry[6],
            "currency": bill.currency,
            "reason_code": entry[7],
            "supplier": supplier,
            "to": to,
            "explanation": bill.po_mismatch["summary"],
        },
    )


def _bill(accounting: str, entry: tuple[Any, ...], *, reachable: bool) -> tuple[Bill, bool]:
    number, supplier, currency, amount, po, line, _, _ = entry
    item, qty, po_price, invoiced = line
    bill, _ = Bill.objects.get_or_create(
        number=number,
        defaults={
            "supplier_name": supplier,
            "currency": currency,
            "amount": Decimal(amount),
            "amount_due": Decimal(amount),
            "accounting_reference": f"demo-{number.lower()}",
            "purchase_order": po,
            "po_mismatch": {
                "summary": (
                    f"{qty} {item} at {invoiced} on the bill, {po_price} on {po}."
                    if po_price != invoiced
                    else f"{qty} {item} on the bill, {qty - 2} received against {po}."
                ),
                "lines": [{"item": item, "ordered_qty": qty, "ordered_price": po_price, "invoiced_price": invoiced}],
            },
            "issued_at": timezone.now() - timedelta(days=4),
        },
    )
    if reachable:
        reachable = _register(accounting, bill)
    return bill, reachable


def _register(accounting: str, bill: Bill) -> bool:
    body = {
        "InvoiceID": bill.accounting_reference,
        "InvoiceNumber": bill.number,
        "Contact": bill.supplier_name,
        "CurrencyCode": bill.currency,
        "Total": str(bill.amount),
        "AmountDue": str(bill.amount_due),
    }
    try:
        _control_post(accounting, "invoices", body)
    except urllib.error.HTTPError as error:
        return error.code == 400  # the bill is registered already
    except OSError:
        return False
    return True


def _control_post(accounting: str, name: str, body: dict[str, Any]) -> None:
    """POST to one of the accounting sandbox's control endpoints (/_sandbox/<name>). Raises
    HTTPError when it refuses, OSError when it cannot be reached."""
    request = urllib.request.Request(  # noqa: S310 - the sandbox's own http address, from settings
        f"{accounting.rstrip('/')}/_sandbox/{name}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5):  # noqa: S310 - as above
        pass
