"""The po_mismatch_resolution template: read the documents, post a credit note, email the supplier."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone

from actions.kinds import StepClass
from actions.kinds.email_templates import EmailTemplate
from actions.kinds.fields import check_evidence, check_reference
from actions.kinds.invoice_adjustment.contract import accounting_from_settings
from actions.models import (
    ActionKind,
    AdjustmentReason,
    Bill,
    Supplier,
)
from actions.providers.base import ProviderError
from actions.workflows.templates import (
    READ,
    Proposal,
    StepSpec,
    Template,
    registered_template,
    template_register,
)
from actions.workflows.templates.building import (
    email_payload,
    money_parameters,
    one_line_text,
    parameter_problems_raise,
    parameter_refusal,
    parameters_checked,
    reason_parameter,
    registered_email,
    step_entry,
    workflow_ids,
    workflow_proposal,
)

CORRECTION_TEMPLATE = EmailTemplate(
    name="po_mismatch_correction",
    version=1,
    subject="Correction: bill $bill_number",
    body=(
        "Dear $supplier_name,\n"
        "\n"
        "Our earlier message about your bill $bill_number no longer holds: the credit note of "
        "$amount $currency we announced has been withdrawn.\n"
        "Please disregard that message. We will write again once the bill is settled.\n"
        "\n"
        "Accounts payable\n"
    ),
)

# The supplier's notice reads as a lone supplier email of the same template would.
ADJUSTED_TEMPLATE = registered_email("bill_adjusted")


def documents_read(payload: dict[str, Any]) -> dict[str, Any]:
    """The bill as the accounting system holds it, and the purchase order's mismatch as the
    console's matcher recorded it."""
    bill = Bill.objects.get(number=payload["bill"])
    evidence: dict[str, Any] = {
        "bill": {
            "number": bill.number,
            "amount": str(bill.amount),
            "amount_due": str(bill.amount_due),
            "currency": bill.currency,
            "version": bill.version,
        },
        "purchase_order": {"number": bill.purchase_order, "mismatch": bill.po_mismatch},
        "read_at": timezone.now().isoformat(),
    }
    if settings.ACCOUNTING_API_BASE and bill.accounting_reference:
        try:
            invoice = accounting_from_settings().get_invoice(bill.accounting_reference)
            evidence["accounting"] = {
                "invoice_id": invoice.id,
                "number": invoice.number,
                "status": invoice.status,
                "total": str(invoice.total),
                "amount_due": str(invoice.amount_due),
                "currency": invoice.currency,
            }
        except ProviderError as error:
            evidence["accounting"] = {"invoice_id": bill.accounting_reference, "error": str(error)}
    return evidence


PO_STEPS = (
    StepSpec(
        "read_documents",
        READ,
        StepClass.READ,
        None,
        "None needed: a read changes nothing. Its result is saved as evidence and reused on recovery.",
        read=documents_read,
    ),
    StepSpec(
        "post_credit_note",
        ActionKind.INVOICE_ADJUSTMENT.value,
        StepClass.CREATE,
        ActionKind.CREDIT_NOTE_VOID.value,
        "Void the credit note (a set step: safe to repeat while it is voided).",
    ),
    StepSpec(
        "email_supplier",
        ActionKind.SUPPLIER_EMAIL.value,
        StepClass.IRREVERSIBLE,
        ActionKind.SUPPLIER_EMAIL.value,
        "A correction email: a message cannot be taken back, only corrected.",
    ),
)


@dataclass(frozen=True)
class _Fields:
    bill_ref: str
    case_ref: str
    currency: str
    amount: Decimal
    reason: str
    supplier_code: str
    to: str
    explanation: str
    evidence: str


def _po_validate(raw_input: dict[str, Any]) -> Proposal:
    template = registered_template("po_mismatch_resolution")
    fields = _po_fields(raw_input, template)
    bill, supplier = _po_records(fields)
    workflow_id, case = workflow_ids("po-mismatch", f"bill-{bill.number}", fields.case_ref)
    parameters = {
        "bill_number": bill.number,
        "case": fields.case_ref,
        "amount": str(fields.amount),
        "currency": fields.currency,
        "reason_code": fields.reason,
        "supplier": supplier.code,
        "to": fields.to,
        "explanation": fields.explanation,
        "evidence": fields.evidence,
    }
    steps = _po_steps(fields, bill=bill, supplier=supplier, workflow_id=workflow_id)
    return workflow_proposal(
        template, workflow_id=workflow_id, case=case, parameters=parameters, steps=steps, evidence=fields.evidence
    )


def _po_fields(raw_input: dict[str, Any], template: Template) -> _Fields:
    """Every parameter's own check; all the bad ones are named at once."""
    raw, problems = parameters_checked(raw_input, template)
    bill_ref = check_reference("parameters.bill_number", raw.get("bill_number"), problems)
    case_ref = check_reference("parameters.case", raw.get("case"), problems)
    currency, amount = money_parameters(raw, problems)
    allowed = [r for r in AdjustmentReason.values if r != AdjustmentReason.DUPLICATE_CREDIT_NOTE]
    reason = reason_parameter(raw, allowed, problems)
    supplier_code = check_reference("parameters.supplier", raw.get("supplier"), problems)
    to = one_line_text("parameters.to", raw.get("to"), problems, limit=254)
    explanation = one_line_text("parameters.explanation", raw.get("explanation"), problems)
    evidence = check_evidence(raw.get("evidence", ""), problems)
    parameter_problems_raise(problems)
    assert bill_ref and case_ref and currency and amount is not None and supplier_code and to and explanation
    return _Fields(bill_ref, case_ref, currency, amount, reason, supplier_code, to, explanation, evidence)


def _po_records(fields: _Fields) -> tuple[Bill, Supplier]:
    """The bill and the supplier the parameters name, as the console holds them."""
    bill_ref, currency, supplier_code, to = fields.bill_ref, fields.currency, fields.supplier_code, fields.to
    bill = Bill.objects.filter(number=bill_ref).first()
    if bill is None:
        raise parameter_refusal("parameters.bill_number", "not_found", f"There is no bill {bill_ref}.")
    if not bill.accounting_reference:
        raise parameter_refusal("parameters.bill_number", "not_in_accounting", f"Bill {bill_ref} is not in accounting.")
    if bill.voided:
        raise parameter_refusal("parameters.bill_number", "bill_voided", f"Bill {bill_ref} is voided.")
    if currency != bill.currency:
        raise parameter_refusal("parameters.currency", "currency_mismatch", f"Bill {bill_ref} is in {bill.currency}.")
    supplier = Supplier.objects.filter(code=supplier_code).first()
    if supplier is None:
        raise parameter_refusal("parameters.supplier", "not_found", f"There is no supplier {supplier_code}.")
    if to.lower() not in supplier.known_addresses():
        raise parameter_refusal(
            "parameters.to", "unknown_contact", f"{to} is not one of {supplier.code}'s known contacts."
        )
    return bill, supplier


def _po_steps(fields: _Fields, *, bill: Bill, supplier: Supplier, workflow_id: str) -> list[dict[str, Any]]:
    """The plan: read the documents, post the credit note (voided to compensate), email the
    supplier (a correction email to compensate)."""
    amount, currency, reason, case_ref, to = fields.amount, fields.currency, fields.reason, fields.case_ref, fields.to
    read, post, email = PO_STEPS
    values = {
        "supplier_name": supplier.name,
        "bill_number": bill.number,
        "amount": str(amount),
        "currency": currency,
        "reason": fields.explanation,
    }

    def supplier_message(template: EmailTemplate, values: dict[str, str], *, action_key: str) -> dict[str, Any]:
        """The email to the supplier's contact about this bill: the adjustment, or its correction."""
        return {
            "kind": email.kind,
            "supplier": supplier.code,
            "reference": f"bill-{bill.number}",
            **email_payload(template, values, action_key=action_key, sender=settings.SUPPLIER_EMAIL_FROM, to=to),
        }

    return [
        step_entry(
            read,
            1,
            target={"type": "bill", "ref": bill.number},
            payload={
                "bill": bill.number,
                "invoice_id": bill.accounting_reference,
                "purchase_order": bill.purchase_order,
            },
        ),
        step_entry(
            post,
            2,
            target={"type": "bill", "ref": bill.number},
            payload={
                "kind": post.kind,
                "bill": bill.number,
                "adjustment": f"{case_ref}",
                "invoice_id": bill.accounting_reference,
                "supplier": bill.supplier_name,
                "amount": str(amount),
                "currency": currency,
                "reason_code": reason,
            },
            amount=amount,
            currency=currency,
            compensation_payload={
                "kind": ActionKind.CREDIT_NOTE_VOID.value,
                "bill": bill.number,
                "amount": str(amount),
                "currency": currency,
                # The credit note's id is the accounting system's: known once the step succeeded.
                "credit_note": None,
            },
        ),
        step_entry(
            email,
            3,
            target={"type": "supplier", "ref": supplier.code},
            payload=supplier_message(ADJUSTED_TEMPLATE, values, action_key=f"{workflow_id}:{email.name}"),
            compensation_payload=supplier_message(
                CORRECTION_TEMPLATE,
                {k: values[k] for k in ("supplier_name", "bill_number", "amount", "currency")},
                action_key=f"{workflow_id}:{email.name}:compensate",
            ),
        ),
    ]


template_register(
    Template(
        name="po_mismatch_resolution",
        label="Resolve a purchase-order mismatch",
        parameters={
            "bill_number": "The supplier bill that failed its purchase-order match.",
            "case": "Your reference for this decision (e.g. the matcher's case id); part of the workflow id.",
            "amount": 'The credit note\'s amount, as a decimal string ("20.00").',
            "currency": "The bill's currency (ISO 4217).",
            "reason_code": "Why the bill failed the match: price_mismatch, quantity_mismatch or damaged_goods.",
            "supplier": "The supplier's code.",
            "to": "One of the supplier's known contacts.",
            "explanation": "One line for the supplier: what differs.",
            "evidence": "Free text for the manager who decides (optional).",
        },
        steps=PO_STEPS,
        validate=_po_validate,
    )
)
