"""Supplier emails for an agent: propose an email to a supplier from a template."""

from __future__ import annotations

from actions.kinds.supplier_email.proposal import supplier_email_propose
from actions.models import ActionKind, Agent
from actions.proposals.rules import proposal_for_agent, scope_require
from actions.services import ProposalConflict, ProposalResult


def _conflict_detail(conflict: ProposalConflict) -> str:
    return (
        f"{conflict.action.action_id} already exists with a different message. A different message is a different "
        "business action: use another reference."
    )


def agent_supplier_email_propose(*, agent: Agent, **fields: object) -> ProposalResult:
    """Propose an email to a supplier (``fields`` as ``supplier_email_propose`` takes them); the
    same (supplier, reference) proposed by someone else is ``proposed_elsewhere``."""
    scope_require(agent, ActionKind.SUPPLIER_EMAIL, doing="propose supplier_email actions")
    return proposal_for_agent(
        agent,
        supplier_email_propose,
        fields,
        noun="supplier email",
        payload_fields={},
        conflict_detail=_conflict_detail,
    )
