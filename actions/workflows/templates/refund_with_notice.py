"""The refund_with_notice template: refund a customer, then tell them."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings

from actions.kinds import StepClass
from actions.kinds.email_templates import EmailTemplate
from actions.kinds.fields import (
    FieldProblem,
    check_evidence,
    check_reference,
)
from actions.models import (
    Action,
    ActionKind,
    ActionStatus,
    Order,
    ReasonCode,
    RefundRequest,
)
from actions.workflows.templates import (
    Proposal,
    StepSpec,
    Template,
    registered_template,
    template_register,
)
from actions.workflows.templates.building import (
    email_payload,
    money_parameters,
    parameter_problems_raise,
    parameter_refusal,
    parameters_checked,
    reason_parameter,
    step_entry,
    workflow_ids,
    workflow_proposal,
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


@dataclass(frozen=True)
class _Fields:
    order_ref: str
    case_ref: str
    number: int
    currency: str
    amount: Decimal
    reason: str
    evidence: str


def _refund_validate(raw_input: dict[str, Any]) -> Proposal:
    template = registered_template("refund_with_notice")
    fields = _refund_fields(raw_input, template)
    request = _refund_request(fields)
    order: Order = request.order
    workflow_id, case = workflow_ids("refund-notice", f"order-{order.number}:request-{request.number}", fields.case_ref)
    parameters = {
        "order_number": order.number,
        "request_number": request.number,
        "case": fields.case_ref,
        "amount": str(fields.amount),
        "currency": fields.currency,
        "reason_code": fields.reason,
        "evidence": fields.evidence,
    }
    steps = _refund_steps(fields, request=request, workflow_id=workflow_id)
    return workflow_proposal(
        template, workflow_id=workflow_id, case=case, parameters=parameters, steps=steps, evidence=fields.evidence
    )


def _refund_fields(raw_input: dict[str, Any], template: Template) -> _Fields:
    """Every parameter's own check; all the bad ones are named at once."""
    raw, problems = parameters_checked(raw_input, template)
    order_ref = check_reference("parameters.order_number", raw.get("order_number"), problems)
    case_ref = check_reference("parameters.case", raw.get("case"), problems)
    number_raw = raw.get("request_number")
    number = number_raw if isinstance(number_raw, int) and not isinstance(number_raw, bool) else None
    if number is None or not 1 <= number <= 1_000_000:
        problems.append(FieldProblem("parameters.request_number", "invalid", "A whole number, at least 1."))
    currency, amount = money_parameters(raw, problems)
    reason = reason_parameter(raw, ReasonCode.values, problems)
    evidence = check_evidence(raw.get("evidence", ""), problems)
    parameter_problems_raise(problems)
    assert order_ref and case_ref and number is not None and currency and amount is not None
    return _Fields(order_ref, case_ref, number, currency, amount, reason, evidence)


def _refund_request(fields: _Fields) -> RefundRequest:
    """The refund request the parameters name, on an order that can take this refund and be told of
    it, and not already taken by a lone refund."""
    order_ref, number, currency, amount = fields.order_ref, fields.number, fields.currency, fields.amount
    request = RefundRequest.objects.select_related("order").filter(order__number=order_ref, number=number).first()
    if request is None:
        raise parameter_refusal(
            "parameters.request_number", "not_found", f"Order {order_ref} has no refund request {number}."
        )
    order: Order = request.order
    if not order.charge_reference:
        raise parameter_refusal("parameters.order_number", "no_charge", "The order has no payment.")
    if currency != order.currency:
        raise parameter_refusal(
            "parameters.currency", "currency_mismatch", f"Order {order_ref} was paid in {order.currency}."
        )
    if not order.customer_email:
        raise parameter_refusal("parameters.order_number", "no_customer_email", "The order has no customer address.")
    if amount > order.refundable_amount:
        raise parameter_refusal(
            "parameters.amount",
            "over_refundable_balance",
            f"{amount} {currency} is more than order {order_ref}'s refundable balance "
            f"({order.refundable_amount} {currency}).",
        )
    # One refund request is one refund: a lone refund proposal for it already is that refund.
    lone = (
        Action.objects.filter(refund_request=request, kind=ActionKind.REFUND)
        .exclude(status__in=[ActionStatus.REJECTED, ActionStatus.CANCELLED, ActionStatus.FAILED_FINAL])
        .exclude(payload__has_key="workflow")
        .first()
    )
    if lone is not None:
        raise parameter_refusal(
            "parameters.request_number",
            "request_taken",
            f"Refund request {number} of order {order_ref} already has the refund {lone.action_id}.",
        )
    return request


def _refund_steps(fields: _Fields, *, request: RefundRequest, workflow_id: str) -> list[dict[str, Any]]:
    """The plan: the refund, then the customer's notice."""
    order = request.order
    amount, currency, reason = fields.amount, fields.currency, fields.reason
    refund, notify = REFUND_STEPS
    return [
        step_entry(
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
        step_entry(
            notify,
            2,
            target={"type": "customer", "ref": order.number},
            payload={
                "kind": notify.kind,
                "order": order.number,
                **email_payload(
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
