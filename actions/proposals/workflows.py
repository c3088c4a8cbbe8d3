"""Workflows for an agent: propose a plan from a template, read one of its own workflows."""

from __future__ import annotations

from typing import Any

from actions.agents.services import SCOPE_FOR_KIND
from actions.kinds.fields import REFERENCE_PATTERN, FieldProblem, ProposalInvalid
from actions.models import Agent, RefundRequest, Workflow
from actions.proposals.outcomes import Conflict, Forbidden, NotFound, invalid
from actions.proposals.rules import scopes_of
from actions.selectors import storable_text
from actions.services import (
    Actor,
)
from actions.workflows.services import WorkflowConflict, WorkflowProposalResult, workflow_propose
from actions.workflows.templates import READ, Template, template_for

# The longest stored workflow id; a longer one cannot exist.
MAX_WORKFLOW_ID_LENGTH = 200


def _scopes_require(agent: Agent, template: Template) -> None:
    # The scope of every effect the template's steps make: a po_mismatch_resolution needs both
    # invoice_adjustment and supplier_email.
    needed = sorted({SCOPE_FOR_KIND.get(step.kind, step.kind) for step in template.steps if step.kind != READ})
    missing = [scope for scope in needed if not agent.may_propose(scope)]
    if missing:
        raise Forbidden(
            code="scope_missing",
            detail=f"The agent {agent.name!r} may not propose {template.name}: it lacks the scopes "
            f"{', '.join(missing)} (its scopes are {scopes_of(agent)}). Ask its owner.",
        )


def _another_agents_request_refuse(agent: Agent, template: Template, parameters: dict[str, Any]) -> None:
    """A template whose parameters name a refund request (an order and a request number) may not
    act on another agent's request: it reads as no request, in the template's own words for a
    number that does not exist. Checked before the template validates the plan, so that nothing
    the template says about the request (that it already has a refund) reaches this agent."""
    if not {"order_number", "request_number"} <= set(template.parameters):
        return
    order_number, number = parameters.get("order_number"), parameters.get("request_number")
    if not (isinstance(order_number, str) and isinstance(number, int)) or isinstance(number, bool):
        return  # the template names the malformed field
    order_number = order_number.strip()
    if not REFERENCE_PATTERN.match(order_number):
        return
    others = RefundRequest.objects.filter(order__number=order_number, number=number).exclude(
        pk__in=RefundRequest.objects.visible_to(agent).values("pk")
    )
    if others.exists():
        raise invalid(
            [
                FieldProblem(
                    "parameters.request_number", "not_found", f"Order {order_number} has no refund request {number}."
                )
            ]
        )


def agent_workflow_propose(*, agent: Agent, template: str, parameters: dict[str, Any]) -> WorkflowProposalResult:
    """Propose a plan for ``agent``; the same plan again is its live workflow.

    - an unknown template or bad parameters: ``Invalid``;
    - a case with a live workflow of another plan: ``live_workflow``, naming it only when it is
      the agent's own;
    - the same plan proposed by someone else: ``proposed_elsewhere``.
    """
    found = template_for(template)
    if found is not None:  # an unknown template is named by the service
        _scopes_require(agent, found)
        _another_agents_request_refuse(agent, found, parameters)
    try:
        result = workflow_propose(template=template, parameters=parameters, proposer=Actor.for_agent(agent))
    except ProposalInvalid as problems:
        raise invalid(problems.problems) from None
    except WorkflowConflict as conflict:
        live = conflict.live
        if live.proposed_by_agent_id != agent.pk:
            raise Conflict(
                code="live_workflow",
                detail="The case already has a live workflow by another proposer. Nothing was written. Ask a person.",
            ) from None
        raise Conflict(
            code="live_workflow", detail=str(conflict), facts={"workflow_id": live.workflow_id, "state": live.state}
        ) from None
    if result.workflow.proposed_by_agent_id != agent.pk:
        raise Conflict(
            code="proposed_elsewhere",
            detail="The case already has this plan, proposed by another proposer. Nothing was written.",
        )
    return result


def agent_workflow_read(*, agent: Agent, workflow_id: str) -> Workflow:
    """The agent's own workflow with this id; any other id, whoever's it is, is ``NotFound``."""
    # An id no column could hold (too long, or with a NUL, which PostgreSQL refuses in text)
    # cannot exist: the same answer as any unknown id, never a database error.
    workflow = (
        Workflow.objects.filter(workflow_id=workflow_id, proposed_by_agent=agent).first()
        if len(workflow_id) <= MAX_WORKFLOW_ID_LENGTH and storable_text(workflow_id)
        else None
    )
    if workflow is None:
        raise NotFound(code="workflow_not_found", detail="There is no such workflow for this agent.")
    return workflow
