"""Supplier emails for an agent: propose an email to a supplier from a template."""

from __future__ import annotations

from typing import Any

from actions.kinds.supplier_email.proposal import supplier_email_propose
from actions.models import ActionKind, Agent
from actions.proposals.rules import proposal_for_agent, scope_require
from actions.services import Actor, ProposalConflict, ProposalResult


def _conflict_detail(conflict: ProposalConflict) -> str:
    return (
        f"{conflict.action.action_id} already exists with a different message. A different message is a different "
        "business action: use another reference."
    )


def agent_supplier_email_propose(
    *,
    agent: Agent,
    supplier: str,
    reference: str,
    template: str,
    parameters: dict[str, Any],
    to: str,
    evidence: str = "",
) -> ProposalResult:
    """Propose an email to a supplier; the same (supplier, reference) proposed by someone else
    is ``proposed_elsewhere``."""
    scope_require(agent, ActionKind.SUPPLIER_EMAIL, doing="propose supplier_email actions")
    return proposal_for_agent(
        agent,
        lambda: supplier_email_propose(
            supplier=supplier,
            reference=reference,
            template=template,
            parameters=parameters,
            to=to,
            evidence=evidence,
            proposer=Actor.for_agent(agent),
        ),
        noun="supplier email",
        payload_fields={},
        conflict_detail=_conflict_detail,
    )
