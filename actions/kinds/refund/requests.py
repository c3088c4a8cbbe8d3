"""Refund requests: the customer's request for money back, opened on an order.

A request is numbered per order (request-1, request-2...) and that number becomes part of
the action id of the refund proposed for it. Opening one is idempotent by its external
reference (the support ticket's id): a retry returns the request that exists.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from actions.kinds.fields import FieldProblem, ProposalInvalid, check_external_reference, check_note, check_reference
from actions.kinds.refund.checks import REFUND_REQUEST_FIELDS
from actions.models import Agent, Order, ReasonCode, RefundRequest, RequestSource
from actions.services import RequestBook, RequestConflict, RequestOpened, RequestTaken


class RefundRequestConflict(RequestConflict):
    request_words = "a refund request"
    target_words = "order"
    one_request_is = "One ticket"


class RefundRequestTaken(RequestTaken):
    pass


REFUND_REQUESTS = RequestBook(
    RefundRequest, Order, taken=RefundRequestTaken, conflict=RefundRequestConflict, names=REFUND_REQUEST_FIELDS
)


def _check_reason_code(raw: object, problems: list[FieldProblem], *, required: bool) -> str:
    value = str(raw or "").strip()
    if not value:
        if required:
            problems.append(FieldProblem("reason_code", "required", "Say why the customer asks: a reason code."))
        return ""
    if value not in ReasonCode.values:
        problems.append(FieldProblem("reason_code", "invalid_choice", f"Use one of: {', '.join(ReasonCode.values)}."))
    return value


def refund_request_open(
    *,
    order_number: object,
    external_reference: object,
    note: object = "",
    source: str = RequestSource.TICKET,
    reason_code: object = "",
    opened_by_agent: Agent | None = None,
    now: datetime | None = None,
) -> RequestOpened[RefundRequest]:
    """Open the next refund request on an order, or return the one this reference opened.

    - Bad input raises ProposalInvalid and writes nothing (invariant 11).
    - The same external reference on the same order returns the existing request (a retry is
      safe); on another order it raises RefundRequestConflict. The note of a retry is not
      compared: it is a remark, not part of the request's identity.
    - Numbers are safe under concurrency: the order row is locked while the next number is
      chosen, so two requests on one order are numbered one after the other.
    - An agent must give a reason code, may open at most REFUND_REQUESTS_PER_ORDER_PER_DAY
      requests per order per day, and cannot read back (replay) a request another agent opened
      (RefundRequestTaken).
    """
    now = now or timezone.now()
    problems: list[FieldProblem] = []
    order_ref = check_reference("order_number", order_number, problems)
    reference = check_external_reference(external_reference, problems)
    note_text = check_note(note, problems)
    reason = _check_reason_code(reason_code, problems, required=opened_by_agent is not None)
    if source not in RequestSource.values:
        problems.append(FieldProblem("source", "invalid_choice", f"Use one of: {', '.join(RequestSource.values)}."))
    if problems:
        raise ProposalInvalid(problems)
    assert order_ref is not None and reference is not None

    return REFUND_REQUESTS.open(
        order_ref,
        reference,
        opened_by_agent=opened_by_agent,
        before_create=lambda order: _within_agent_limit(order, opened_by_agent, now=now),
        source=source,
        note=note_text,
        reason_code=reason,
    )


def _within_agent_limit(order: Order, agent: Agent | None, *, now: datetime) -> None:
    if agent is None:
        return
    # Counted under the order's lock, so that parallel openers cannot all fit under it.
    opened_today = RefundRequest.objects.filter(
        order=order, opened_by_agent=agent, created_at__gte=now - timedelta(days=1)
    ).count()
    if opened_today >= settings.REFUND_REQUESTS_PER_ORDER_PER_DAY:
        raise ProposalInvalid.for_field(
            "order_number",
            "request_limit_reached",
            f"This agent opened {opened_today} refund requests on order {order.number} in the last "
            f"24 hours, the most it may. Nothing was written: ask a person to handle this order.",
        )
