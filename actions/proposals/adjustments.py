"""Invoice adjustments for an agent: open an adjustment request on a bill, propose the credit note."""

from __future__ import annotations

from actions.agents.services import INVOICE_ADJUSTMENT_SCOPE
from actions.kinds.invoice_adjustment.proposal import action_propose_invoice_adjustment
from actions.kinds.invoice_adjustment.requests import adjustment_request_open
from actions.models import AdjustmentRequest, Agent
from actions.proposals.rules import proposal_for_agent, request_open_for_agent, scope_require
from actions.services import ProposalConflict, ProposalResult, RequestOpened

_DOING = "propose invoice adjustments"

# Payload keys (the material payload) as the fields an agent sends.
PAYLOAD_FIELDS = {"bill": "bill_number", "adjustment": "adjustment_number"}


def agent_adjustment_request_open(*, agent: Agent, **fields: object) -> RequestOpened[AdjustmentRequest]:
    """Open the next adjustment request on a bill for ``agent`` (``fields`` as
    ``adjustment_request_open`` takes them), or return the one its reference opened; another
    agent's reference is ``reference_taken``, one on another bill ``reference_conflict``."""
    scope_require(agent, INVOICE_ADJUSTMENT_SCOPE, doing=_DOING)
    return request_open_for_agent(agent, adjustment_request_open, fields, noun="adjustment request")


def _conflict_detail(conflict: ProposalConflict) -> str:
    return str(conflict).replace("refund request", "adjustment request")


def agent_invoice_adjustment_propose(*, agent: Agent, **fields: object) -> ProposalResult:
    """Propose a credit note for one of the bill's adjustment requests (``fields`` as
    ``action_propose_invoice_adjustment`` takes them). Another agent's request reads as no
    request: the same ``not_found`` as a number that does not exist."""
    scope_require(agent, INVOICE_ADJUSTMENT_SCOPE, doing=_DOING)
    return proposal_for_agent(
        agent,
        action_propose_invoice_adjustment,
        fields,
        noun="adjustment request",
        payload_fields=PAYLOAD_FIELDS,
        conflict_detail=_conflict_detail,
    )
