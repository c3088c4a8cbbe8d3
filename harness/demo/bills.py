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
from actions.models import AdjustmentRequest, Agent, Bill
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


def seed_demo_bills(*, accounting: str, owner: Any) -> str:
    """Create the demo bills, register them with the accounting sandbox at ``accounting`` and
    have the payables agent propose an adjustment on each. Returns a line for the seed's output."""
    agent, _ = Agent.objects.get_or_create(
        name="payables-bot", defaults={"owner": owner, "scopes": ["invoice_adjustment"]}
    )
    reachable = True
    for number, supplier, currency, amount, po, line, adjustment, reason in DEMO_BILLS:
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
                    "lines": [
                        {"item": item, "ordered_qty": qty, "ordered_price": po_price, "invoiced_price": invoiced}
                    ],
                },
                "issued_at": timezone.now() - timedelta(days=4),
            },
        )
        if reachable:
            reachable = _register(accounting, bill)
        request, _ = AdjustmentRequest.objects.get_or_create(
            bill=bill, number=1, defaults={"external_reference": f"MATCH-{number}", "note": bill.po_mismatch["summary"]}
        )
        action_propose_invoice_adjustment(
            bill_number=bill.number,
            adjustment_number=request.number,
            amount=adjustment,
            currency=currency,
            reason_code=reason,
            evidence=f"Purchase-order match failed: {bill.po_mismatch['summary']}",
            proposer=Actor.for_agent(agent),
        )
    if not reachable:
        return f"The accounting sandbox at {accounting} is not reachable: bills were not registered there."
    return f"{len(DEMO_BILLS)} supplier bills with purchase-order mismatches, registered at {accounting}."


def _register(accounting: str, bill: Bill) -> bool:
    body = {
        "InvoiceID": bill.accounting_reference,
        "InvoiceNumber": bill.number,
        "Contact": bill.supplier_name,
        "CurrencyCode": bill.currency,
        "Total": str(bill.amount),
        "AmountDue": str(bill.amount_due),
    }
    request = urllib.request.Request(  # noqa: S310 - the sandbox's own http address, from settings
        f"{accounting.rstrip('/')}/_sandbox/invoices",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5):  # noqa: S310 - as above
            return True
    except urllib.error.HTTPError as error:
        return error.code == 400  # the bill is registered already
    except OSError:
        return False
