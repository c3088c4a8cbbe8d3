"""Invoice adjustments for an agent: open an adjustment request on a bill, propose the credit note."""

from __future__ import annotations

from actions.agents.services import INVOICE_ADJUSTMENT_SCOPE
from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.kinds.invoice_adjustment.requests import AdjustmentRequestResult, adjustment_request_open
from actions.models import Agent
from actions.proposals.rules import proposal_for_agent, request_open_for_agent, scope_require
from actions.services import (
    Actor,
    ProposalConflict,
    ProposalResult,
)

_DOING = "propose invoice adjustments"

# Payload keys (the material payload) as the fields an agent sends.
PAYLOAD_FIELDS = {"bill": "bill_number", "adjustment": "adjustment_number"}


def agent_adjustment_request_open(
    *, agent: Agent, bill_number: str, external_reference: str, note: str = ""
) -> AdjustmentRequestResult:
    """Open the next adjustment request on a bill for ``agent``, or return the one its reference
    opened; another agent's reference is ``reference_taken``, one on another bill
    ``reference_conflict``."""
    scope_require(agent, INVOICE_ADJUSTMENT_SCOPE, doing=_DOING)
    return request_open_for_agent(
        lambda: adjustment_request_open(
            bill_number=bill_number, external_reference=external_reference, note=note, opened_by_agent=agent
        ),
        noun="adjustment request",
    )


def _conflict_detail(conflict: ProposalConflict) -> str:
    return str(conflict).replace("refund request", "adjustment request")


def agent_invoice_adjustment_propose(
    *,
    agent: Agent,
    bill_number: str,
    adjustment_number: int,
    amount: str,
    currency: str,
    reason_code: str,
    evidence: str = "",
) -> ProposalResult:
    """Propose a credit note for one of the bill's adjustment requests. Another agent's request
    reads as no request: the same ``not_found`` as a number that does not exist."""
    scope_require(agent, INVOICE_ADJUSTMENT_SCOPE, doing=_DOING)
    return proposal_for_agent(
        agent,
        lambda: action_propose_invoice_adjustment(
            bill_number=bill_number,
            adjustment_number=adjustment_number,
            amount=amount,
            currency=currency,
            reason_code=reason_code,
            evidence=evidence,
            proposer=Actor.for_agent(agent),
        ),
        noun="adjustment request",
        payload_fields=PAYLOAD_FIELDS,
        conflict_detail=_conflict_detail,
    )
