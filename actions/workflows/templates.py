"""Workflow templates, registered in code: a name, a parameter schema, ordered steps.

Each step names an effect kind (or ``read``), its step class, how its payload is built from the
parameters, and its compensation: another kind's payload, or "none" with the reason. The plan a
template builds is fixed at proposal time; its hash is what the approval binds.

Shipped templates (docs/architecture.md section 10):

``po_mismatch_resolution``
  1. ``read_documents`` (read): the bill as the accounting system holds it and the purchase
     order's mismatch as the matcher found it. Saved as evidence; recovery reuses it.
  2. ``post_credit_note`` (create): the credit note. Compensation: void it (a set step).
  3. ``email_supplier`` (irreversible): tell the supplier. Compensation: a correction email.

``refund_with_notice``
  1. ``refund`` (irreversible, money). Compensation: none. Money returned to a customer cannot be
     taken back by the console; a failed refund opens a remedy (store credit, transfer, cheque).
  2. ``notify_customer`` (irreversible, last). Compensation: none, it is the last step, so no
     later step can fail after it and ask for it to be walked back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.utils import timezone

from actions.kinds import StepClass, kind_for
from actions.kinds.email_templates import EmailTemplate
from actions.kinds.fields import (
    REFERENCE_PATTERN,
    FieldProblem,
    ProposalInvalid,
    check_currency,
    check_evidence,
    check_reference,
    parse_amount,
)
from actions.kinds.invoice_adjustment import accounting_from_settings
from actions.kinds.supplier_email import message_id_for
from actions.models import (
    Action,
    ActionKind,
    ActionStatus,
    AdjustmentReason,
    Bill,
    Order,
    RefundRequest,
    Supplier,
)
from actions.providers.base import ProviderError
from actions.services import (
    payload_hash,
)

READ = "read"
MAX_ACTION_ID = 255

# The messages the workflows send. Kept out of the supplier-email template registry: an agent
# proposing a lone supplier email must not pick a workflow's correction text.
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
NOTICE_TEMPLATE = EmailTemplate(
    name="refund_notice",
    version=1,
    subject="Your refund for order $order_number",
    body=(
        "Dear $customer_name,\n"
        "\n"
        "We have refunded $amount $currency for your order $order_number.\n"
        "It may take a few days to appear on your statement.\n"
        "\n"
        "Customer service\n"
    ),
)
ADJUSTED_TEMPLATE = EmailTemplate(
    name="bill_adjusted",
    version=1,
    subject="Bill $bill_number: adjusted by $amount $currency",
    body=(
        "Dear $supplier_name,\n"
        "\n"
        "We have adjusted your bill $bill_number by $amount $currency.\n"
        "Reason: $reason\n"
        "\n"
        "A credit note follows separately. Please reply to this message if anything is unclear.\n"
        "\n"
        "Accounts payable\n"
    ),
)


@dataclass(frozen=True)
class StepSpec:
    name: str
    kind: str  # an effect kind's name, or READ
    step_class: StepClass
    # The compensation's kind, or None for "none"; ``compensation_note`` says what it does, or
    # why there is none and what happens instead.
    compensation_kind: str | None
    compensation_note: str
    # A read step's read: the step's payload in, the evidence to save out. The coordinator runs
    # it outside any transaction and saves its first result for every later run to reuse.
    read: Callable[[dict[str, Any]], dict[str, Any]] | None = None


@dataclass(frozen=True)
class Proposal:
    """A validated proposal: the ids and the plan, before anything is written."""

    workflow_id: str
    case: str
    parameters: dict[str, Any]
    plan: dict[str, Any]
    plan_hash: str


@dataclass(frozen=True)
class Template:
    name: str
    label: str
    parameters: dict[str, str]  # name -> description (the schema, for people and the API docs)
    steps: tuple[StepSpec, ...]
    validate: Callable[[dict[str, Any]], Proposal]
    # Why an irreversible step is not last, where one is not; empty when they are all last.
    order_note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def spec(self, name: str) -> StepSpec:
        return next(step for step in self.steps if step.name == name)


_TEMPLATES: dict[str, Template] = {}


def template_register(template: Template) -> Template:
    """Register a template after checking its rules: irreversible steps last (unless the template
    says why not) and every compensation either a kind or a reason."""
    seen_irreversible = False
    for spec in template.steps:
        if spec.step_class == StepClass.IRREVERSIBLE:
            seen_irreversible = True
        elif seen_irreversible and not template.order_note:
            raise ValueError(f"{template.name}: irreversible steps go last unless the template says why")
        if spec.compensation_kind is None and not spec.compensation_note:
            raise ValueError(f"{template.name}.{spec.name}: a step without compensation needs the reason")
        if (spec.kind == READ) != (spec.read is not None):
            raise ValueError(f"{template.name}.{spec.name}: a read step, and only a read step, names its read")
    _TEMPLATES[template.name] = template
    return template


def template_for(name: str) -> Template | None:
    return _TEMPLATES.get(name)


def all_templates() -> list[Template]:
    return sorted(_TEMPLATES.values(), key=lambda template: template.name)


def plan_hash_of(template: str, steps: list[dict[str, Any]]) -> str:
    """The plan's identity: its template and each step's material parts. The workflow id is not
    in it, so the same plan proposed under another case reference is recognised as the same."""
    material = [
        {key: step.get(key) for key in ("name", "kind", "amount", "currency", "target", "payload", "compensation")}
        for step in steps
    ]
    text = json.dumps({"template": template, "steps": material}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _step(
    spec: StepSpec,
    position: int,
    *,
    target: dict[str, Any],
    payload: dict[str, Any],
    amount: Decimal | None = None,
    currency: str = "",
    compensation_payload: dict[str, Any] | None = None,
) -> dict[str, Any]:
    receiver = "the console (reads only)" if spec.kind == READ else kind_for(spec.kind).contract().receiver
    return {
        "position": position,
        "name": spec.name,
        "kind": spec.kind,
        "step_class": str(spec.step_class),
        "receiver": receiver,
        "target": target,
        "amount": str(amount) if amount is not None else None,
        "currency": currency,
        "payload": payload,
        "compensation": {
            "kind": spec.compensation_kind,
            "note": spec.compensation_note,
            "payload": compensation_payload,
        },
    }


def _prefixed(problems: list[FieldProblem]) -> list[FieldProblem]:
    """The shared checks name their fields bare ("amount"); here they are parameters."""
    return [
        p if p.field.startswith("parameters.") else FieldProblem(f"parameters.{p.field}", p.code, p.message)
        for p in problems
    ]


def _check_dict(raw: object) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ProposalInvalid([FieldProblem("parameters", "invalid_type", "Give the parameters as an object.")])
    return raw


def _unknown(raw: dict[str, Any], template: Template, problems: list[FieldProblem]) -> None:
    for name in sorted(set(raw) - set(template.parameters)):
        problems.append(
            FieldProblem(f"parameters.{str(name)[:40]}", "unknown_parameter", f"{template.name} has no such parameter.")
        )


def _text(name: str, raw: object, problems: list[FieldProblem], *, limit: int = 500) -> str | None:
    if not isinstance(raw, str) or not raw.strip():
        problems.append(FieldProblem(name, "required", "Give a non-empty string."))
        return None
    if len(raw) > limit or "\x00" in raw or "\n" in raw or "\r" in raw:
        problems.append(FieldProblem(name, "invalid", f"One line of at most {limit} characters."))
        return None
    return raw.strip()


def _email(template: EmailTemplate, values: dict[str, str], *, action_key: str, sender: str, to: str) -> dict[str, Any]:
    subject, body = template.render(values)
    return {
        "template": template.name,
        "template_version": template.version,
        "parameters": values,
        "from": sender,
        "to": to,
        "subject": subject,
        "body": body,
        "message_id": message_id_for(action_key, domain=settings.EMAIL_MESSAGE_ID_DOMAIN),
    }


def _ids(prefix: str, business: str, case_ref: str) -> tuple[str, str]:
    workflow_id = f"{prefix}:{business}:{case_ref}"
    # The longest child key must still fit the receivers' key limit.
    if len(workflow_id) + len(":post_credit_note:compensate") > MAX_ACTION_ID:
        raise ProposalInvalid([FieldProblem("parameters.case", "too_long", "The workflow id would be too long.")])
    return workflow_id, f"{prefix}:{business}"


# --- po_mismatch_resolution --------------------------------------------------------------------


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


def _po_validate(raw_input: dict[str, Any]) -> Proposal:
    template = _TEMPLATES["po_mismatch_resolution"]
    raw = _check_dict(raw_input)
    problems: list[FieldProblem] = []
    _unknown(raw, template, problems)
    bill_ref = check_reference("parameters.bill_number", raw.get("bill_number"), problems)
    case_ref = check_reference("parameters.case", raw.get("case"), problems)
    currency = check_currency(raw.get("currency"), problems)
    amount = parse_amount(raw.get("amount"), currency, problems)
    reason = str(raw.get("reason_code") or "")
    allowed = [r for r in AdjustmentReason.values if r != AdjustmentReason.DUPLICATE_CREDIT_NOTE]
    if reason not in allowed:
        problems.append(
            FieldProblem("parameters.reason_code", "unknown_reason_code", f"Use one of: {', '.join(allowed)}.")
        )
    supplier_code = check_reference("parameters.supplier", raw.get("supplier"), problems)
    to = _text("parameters.to", raw.get("to"), problems, limit=254)
    explanation = _text("parameters.explanation", raw.get("explanation"), problems)
    evidence = check_evidence(raw.get("evidence", ""), problems)
    if problems:
        raise ProposalInvalid(_prefixed(problems))
    assert bill_ref and case_ref and currency and amount is not None and supplier_code and to and explanation

    bill = Bill.objects.filter(number=bill_ref).first()
    if bill is None:
        raise ProposalInvalid([FieldProblem("parameters.bill_number", "not_found", f"There is no bill {bill_ref}.")])
    if not bill.accounting_reference:
        raise ProposalInvalid(
            [FieldProblem("parameters.bill_number", "not_in_accounting", f"Bill {bill_ref} is not in accounting.")]
        )
    if bill.voided:
        raise ProposalInvalid([FieldProblem("parameters.bill_number", "bill_voided", f"Bill {bill_ref} is voided.")])
    if currency != bill.currency:
        raise ProposalInvalid(
            [FieldProblem("parameters.currency", "currency_mismatch", f"Bill {bill_ref} is in {bill.currency}.")]
        )
    supplier = Supplier.objects.filter(code=supplier_code).first()
    if supplier is None:
        raise ProposalInvalid(
            [FieldProblem("parameters.supplier", "not_found", f"There is no supplier {supplier_code}.")]
        )
    if to.lower() not in supplier.known_addresses():
        raise ProposalInvalid(
            [FieldProblem("parameters.to", "unknown_contact", f"{to} is not one of {supplier.code}'s known contacts.")]
        )
    workflow_id, case = _ids("po-mismatch", f"bill-{bill.number}", case_ref)
    parameters = {
        "bill_number": bill.number,
        "case": case_ref,
        "amount": str(amount),
        "currency": currency,
        "reason_code": reason,
        "supplier": supplier.code,
        "to": to,
        "explanation": explanation,
        "evidence": evidence,
    }
    read, post, email = PO_STEPS
    values = {
        "supplier_name": supplier.name,
        "bill_number": bill.number,
        "amount": str(amount),
        "currency": currency,
        "reason": explanation,
    }
    steps = [
        _step(
            read,
            1,
            target={"type": "bill", "ref": bill.number},
            payload={
                "bill": bill.number,
                "invoice_id": bill.accounting_reference,
                "purchase_order": bill.purchase_order,
            },
        ),
        _step(
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
        _step(
            email,
            3,
            target={"type": "supplier", "ref": supplier.code},
            payload={
                "kind": email.kind,
                "supplier": supplier.code,
                "reference": f"bill-{bill.number}",
                **_email(
                    ADJUSTED_TEMPLATE,
                    values,
                    action_key=f"{workflow_id}:{email.name}",
                    sender=settings.SUPPLIER_EMAIL_FROM,
                    to=to,
                ),
            },
            compensation_payload={
                "kind": email.kind,
                "supplier": supplier.code,
                "reference": f"bill-{bill.number}",
                **_email(
                    CORRECTION_TEMPLATE,
                    {k: values[k] for k in ("supplier_name", "bill_number", "amount", "currency")},
                    action_key=f"{workflow_id}:{email.name}:compensate",
                    sender=settings.SUPPLIER_EMAIL_FROM,
                    to=to,
                ),
            },
        ),
    ]
    # The Message-IDs are derived from the workflow id; the plan hash must not be (see
    # plan_hash_of), so they are left out of the hash by hashing without them.
    digest = plan_hash_of(template.name, _without_message_ids(steps))
    return Proposal(
        workflow_id=workflow_id,
        case=case,
        parameters=parameters,
        plan={"template": template.name, "steps": steps, "evidence": evidence},
        plan_hash=digest,
    )


def _without_message_ids(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cleaned = json.loads(json.dumps(steps))
    for step in cleaned:
        step["payload"].pop("message_id", None)
        payload = step["compensation"].get("payload") or {}
        payload.pop("message_id", None)
        payload.pop("adjustment", None)
        step["payload"].pop("adjustment", None)
    return list(cleaned)


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


# --- refund_with_notice ------------------------------------------------------------------------

REFUND_STEPS = (
    StepSpec(
        "refund",
        ActionKind.REFUND.value,
        StepClass.IRREVERSIBLE,
        None,
        "None: money paid back to a customer cannot be taken back by the console. If the refund fails "
        "for good a remedy opens instead (store credit, a transfer or a cheque, owned by finance).",
    ),
    StepSpec(
        "notify_customer",
        ActionKind.CUSTOMER_EMAIL.value,
        StepClass.IRREVERSIBLE,
        None,
        "None: it is the last step, so nothing can fail after it; a message cannot be taken back anyway.",
    ),
)


def _refund_validate(raw_input: dict[str, Any]) -> Proposal:
    template = _TEMPLATES["refund_with_notice"]
    raw = _check_dict(raw_input)
    problems: list[FieldProblem] = []
    _unknown(raw, template, problems)
    order_ref = check_reference("parameters.order_number", raw.get("order_number"), problems)
    case_ref = check_reference("parameters.case", raw.get("case"), problems)
    number_raw = raw.get("request_number")
    number = number_raw if isinstance(number_raw, int) and not isinstance(number_raw, bool) else None
    if number is None or not 1 <= number <= 1_000_000:
        problems.append(FieldProblem("parameters.request_number", "invalid", "A whole number, at least 1."))
    currency = check_currency(raw.get("currency"), problems)
    amount = parse_amount(raw.get("amount"), currency, problems)
    reason = str(raw.get("reason_code") or "")
    from actions.models import ReasonCode

    if reason not in ReasonCode.values:
        problems.append(
            FieldProblem(
                "parameters.reason_code", "unknown_reason_code", f"Use one of: {', '.join(ReasonCode.values)}."
            )
        )
    evidence = check_evidence(raw.get("evidence", ""), problems)
    if problems:
        raise ProposalInvalid(_prefixed(problems))
    assert order_ref and case_ref and number is not None and currency and amount is not None

    request = RefundRequest.objects.select_related("order").filter(order__number=order_ref, number=number).first()
    if request is None:
        raise ProposalInvalid(
            [
                FieldProblem(
                    "parameters.request_number", "not_found", f"Order {order_ref} has no refund request {number}."
                )
            ]
        )
    order: Order = request.order
    if not order.charge_reference:
        raise ProposalInvalid([FieldProblem("parameters.order_number", "no_charge", "The order has no payment.")])
    if currency != order.currency:
        raise ProposalInvalid(
            [
                FieldProblem(
                    "parameters.currency", "currency_mismatch", f"Order {order_ref} was paid in {order.currency}."
                )
            ]
        )
    if not order.customer_email:
        raise ProposalInvalid(
            [FieldProblem("parameters.order_number", "no_customer_email", "The order has no customer address.")]
        )
    if amount > order.refundable_amount:
        raise ProposalInvalid(
            [
                FieldProblem(
                    "parameters.amount",
                    "over_refundable_balance",
                    f"{amount} {currency} is more than order {order_ref}'s refundable balance "
                    f"({order.refundable_amount} {currency}).",
                )
            ]
        )
    # One refund request is one refund: a lone refund proposal for it already is that refund.
    lone = (
        Action.objects.filter(refund_request=request, kind=ActionKind.REFUND)
        .exclude(status__in=[ActionStatus.REJECTED, ActionStatus.CANCELLED, ActionStatus.FAILED_FINAL])
        .exclude(payload__has_key="workflow")
        .first()
    )
    if lone is not None:
        raise ProposalInvalid(
            [
                FieldProblem(
                    "parameters.request_number",
                    "request_taken",
                    f"Refund request {number} of order {order_ref} already has the refund {lone.action_id}.",
                )
            ]
        )
    workflow_id, case = _ids("refund-notice", f"order-{order.number}:request-{request.number}", case_ref)
    refund, notify = REFUND_STEPS
    parameters = {
        "order_number": order.number,
        "request_number": request.number,
        "case": case_ref,
        "amount": str(amount),
        "currency": currency,
        "reason_code": reason,
        "evidence": evidence,
    }
    steps = [
        _step(
            refund,
            1,
            target={"type": "order", "ref": order.number},
            payload={
                "kind": ActionKind.REFUND.value,
                "order": order.number,
                "request": request.number,
                "charge": order.charge_reference,
                "amount": str(amount),
                "currency": currency,
                "reason_code": reason,
            },
            amount=amount,
            currency=currency,
        ),
        _step(
            notify,
            2,
            target={"type": "customer", "ref": order.number},
            payload={
                "kind": notify.kind,
                "order": order.number,
                **_email(
                    NOTICE_TEMPLATE,
                    {
                        "customer_name": order.customer_name,
                        "order_number": order.number,
                        "amount": str(amount),
                        "currency": currency,
                    },
                    action_key=f"{workflow_id}:{notify.name}",
                    sender=settings.SUPPLIER_EMAIL_FROM,
                    to=order.customer_email,
                ),
            },
        ),
    ]
    return Proposal(
        workflow_id=workflow_id,
        case=case,
        parameters=parameters,
        plan={"template": template.name, "steps": steps, "evidence": evidence},
        plan_hash=plan_hash_of(template.name, _without_message_ids(steps)),
    )


template_register(
    Template(
        name="refund_with_notice",
        label="Refund a customer and tell them",
        parameters={
            "order_number": "The order to refund.",
            "request_number": "The order's refund request (a whole number).",
            "case": "Your reference for this decision; part of the workflow id.",
            "amount": 'The refund\'s amount, as a decimal string ("12.50").',
            "currency": "The order's currency (ISO 4217).",
            "reason_code": "Why: one of the refund reason codes.",
            "evidence": "Free text for the manager who decides (optional).",
        },
        steps=REFUND_STEPS,
        validate=_refund_validate,
    )
)


# --- child actions -----------------------------------------------------------------------------


def step_key(workflow_id: str, step: str) -> str:
    return f"{workflow_id}:{step}"


def compensation_key(workflow_id: str, step: str) -> str:
    return f"{workflow_id}:{step}:compensate"


def child_action(
    *, workflow_id: str, step: dict[str, Any], key: str, payload: dict[str, Any], kind: str, evidence: str = ""
) -> Action:
    """The unsaved child action for a step or a compensation: its key, its payload (with the
    workflow's name in it, which the trail reads to wake the coordinator) and its target."""
    full = {**payload, "workflow": workflow_id, "step": step["name"]}
    money = Decimal(payload["amount"]) if kind_for(kind).moves_money and payload.get("amount") else Decimal("0")
    action = Action(
        action_id=key,
        kind=kind,
        idempotency_key=key,
        payload=full,
        payload_hash=payload_hash(full),
        amount=money,
        currency=str(payload.get("currency", "")) if money else "",
        reason_code=str(payload.get("reason_code", "")),
        evidence=evidence,
    )
    kind_for(kind).bind_target(action, payload)
    return action


def plan_actions(workflow_id: str, plan: dict[str, Any]) -> list[tuple[dict[str, Any], Action | None]]:
    """Each planned step with its unsaved child action (None for a read step): for the plan's
    page (receivers, previews) and for the approval's binding (target versions)."""
    return [
        (
            step,
            None
            if step["kind"] == READ
            else child_action(
                workflow_id=workflow_id,
                step=step,
                key=step_key(workflow_id, step["name"]),
                payload=step["payload"],
                kind=step["kind"],
            ),
        )
        for step in plan["steps"]
    ]


def plan_totals(plan: dict[str, Any]) -> dict[str, str]:
    totals: dict[str, Decimal] = {}
    for step in plan["steps"]:
        if step.get("amount") and step.get("currency"):
            totals[step["currency"]] = totals.get(step["currency"], Decimal("0")) + Decimal(step["amount"])
    return {currency: str(total) for currency, total in sorted(totals.items())}


__all__ = [
    "READ",
    "REFERENCE_PATTERN",
    "Proposal",
    "StepSpec",
    "Template",
    "all_templates",
    "child_action",
    "compensation_key",
    "plan_actions",
    "plan_totals",
    "step_key",
    "template_for",
]
