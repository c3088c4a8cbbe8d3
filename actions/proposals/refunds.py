"""Refunds for an agent: open a refund request on an order, propose the refund for it."""

from __future__ import annotations

from actions.kinds.fields import FieldProblem
from actions.kinds.refund.proposal import action_propose_refund
from actions.kinds.refund.requests import refund_request_open
from actions.models import ActionKind, Agent, RefundRequest, RequestSource
from actions.proposals.outcomes import invalid
from actions.proposals.rules import proposal_for_agent, request_open_for_agent, scope_require
from actions.selectors import refund_request_by_reference
from actions.services import ProposalResult, RequestOpened

_DOING = "propose refund actions"

# Payload keys (the material payload) as the fields an agent sends.
PAYLOAD_FIELDS = {"order": "order_number", "request": "request_number"}


def agent_refund_request_open(*, agent: Agent, **fields: object) -> RequestOpened[RefundRequest]:
    """Open the next refund request on an order for ``agent`` (``fields`` as
    ``refund_request_open`` takes them), or return the one its reference opened. A reference
    that another agent opened is ``reference_taken``: nothing about that request is told. A
    reference on another order is ``reference_conflict``."""
    scope_require(agent, ActionKind.REFUND, doing=_DOING)
    return request_open_for_agent(
        agent, refund_request_open, {**fields, "source": RequestSource.AGENT}, noun="refund request"
    )


def agent_refund_propose(
    *,
    agent: Agent,
    order_number: str,
    request_number: int | None,
    external_reference: str | None,
    **fields: object,
) -> ProposalResult:
    """Propose a refund for one of the order's refund requests, named by its number or by the
    external reference it was opened with (the other ``fields`` as ``action_propose_refund``
    takes them).

    Another agent's request, by either name, reads as no request: the same ``not_found``
    answer as a request that does not exist (``RefundRequest.objects.visible_to``).
    """
    scope_require(agent, ActionKind.REFUND, doing=_DOING)
    if (request_number is None) == (external_reference is None):
        raise invalid(
            [
                FieldProblem(
                    "request_number", "invalid", "Give either request_number or external_reference (exactly one)."
                )
            ]
        )
    if request_number is None:
        assert external_reference is not None
        request = refund_request_by_reference(
            order_number=order_number, external_reference=external_reference, agent=agent
        )
        if request is None:
            raise invalid(
                [
                    FieldProblem(
                        "external_reference",
                        "not_found",
                        f"Order {order_number} has no refund request with this external reference. Open it first.",
                    )
                ]
            )
        request_number = request.number
    return proposal_for_agent(
        agent,
        action_propose_refund,
        {"order_number": order_number, "request_number": request_number, **fields},
        noun="refund request",
        payload_fields=PAYLOAD_FIELDS,
    )
