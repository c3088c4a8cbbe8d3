"""The agent API for workflows: propose a plan from a template, read a workflow.

Same semantics as single actions: 201 created, 200 the same plan again (the live workflow), 409
a different plan for a case with a live workflow (naming it and its state), 422 naming each
invalid field. An agent needs the scope of every effect its template's steps make (a
po_mismatch_resolution needs ``invoice_adjustment`` and ``supplier_email``), and sees only the
workflows it proposed: any other id is 404.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.urls import reverse
from ninja import Schema, Status
from pydantic import ConfigDict, Field

from actions.agents import INVOICE_ADJUSTMENT_SCOPE
from actions.api.logs import bind, log_event
from actions.api.problems import ApiProblem
from actions.api.schemas import Problem
from actions.api.views import _agent, _invalid, _refuse_unknown_query, api
from actions.models import ActionKind, Agent, Workflow
from actions.selectors import storable_text
from actions.services import Actor, ProposalInvalid
from actions.workflows.services import WorkflowConflict, workflow_propose, workflow_summary
from actions.workflows.templates import READ, template_for

# The scope an agent needs for a step of each kind (a customer notice rides on the refund's).
_SCOPE_FOR_KIND = {
    ActionKind.REFUND.value: ActionKind.REFUND.value,
    ActionKind.CUSTOMER_EMAIL.value: ActionKind.REFUND.value,
    ActionKind.INVOICE_ADJUSTMENT.value: INVOICE_ADJUSTMENT_SCOPE,
    ActionKind.SUPPLIER_EMAIL.value: ActionKind.SUPPLIER_EMAIL.value,
}


class WorkflowProposal(Schema):
    """Propose a workflow: a registered template and its parameters. Proposing the same plan
    again is always safe: it returns the live workflow."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "template": "po_mismatch_resolution",
                    "parameters": {
                        "bill_number": "INV-2291",
                        "case": "case-1",
                        "amount": "20.00",
                        "currency": "EUR",
                        "reason_code": "price_mismatch",
                        "supplier": "ACME",
                        "to": "ap@acme.example",
                        "explanation": "Unit price 20.00 on the bill, 18.00 on the purchase order.",
                    },
                }
            ]
        },
    )

    template: str = Field(min_length=1, max_length=64, description="po_mismatch_resolution or refund_with_notice.")
    parameters: dict[str, Any] = Field(description="The template's parameters.")


class WorkflowCompensationOut(Schema):
    kind: str | None
    none_reason: str | None
    action_id: str | None
    state: str | None


class WorkflowStepOut(Schema):
    position: int
    name: str
    kind: str
    step_class: str
    state: str
    action_id: str | None
    completion_order: int | None
    compensation: WorkflowCompensationOut


class WorkflowOut(Schema):
    workflow_id: str
    template: str
    case: str
    state: str
    final: bool
    plan_hash: str
    owner: str | None
    waiting_for: str | None
    next: str
    steps: list[WorkflowStepOut]
    links: dict[str, str]


def workflow_out(workflow: Workflow) -> WorkflowOut:
    summary = workflow_summary(workflow)
    return WorkflowOut(
        **summary, links={"self": reverse("api-v1:workflow", kwargs={"workflow_id": workflow.workflow_id})}
    )


def _require_scopes(agent: Agent, template_name: str) -> None:
    template = template_for(template_name)
    if template is None:
        return  # the service names the unknown template (422)
    needed = sorted({_SCOPE_FOR_KIND.get(step.kind, step.kind) for step in template.steps if step.kind != READ})
    missing = [scope for scope in needed if not agent.may_propose(scope)]
    if missing:
        raise ApiProblem(
            "forbidden",
            code="scope_missing",
            detail=f"The agent {agent.name!r} may not propose {template_name}: it lacks the scopes "
            f"{', '.join(missing)}. Ask its owner.",
        )


@api.post(
    "/workflows",
    response={200: WorkflowOut, 201: WorkflowOut, 409: Problem, 422: Problem},
    url_name="workflows",
    summary="Propose a workflow (several effects from one decision)",
    tags=["workflows"],
)
def propose_workflow(request: HttpRequest, payload: WorkflowProposal) -> Status[WorkflowOut]:
    """Propose a plan. 201 with the new workflow; 200 with the live one when the same plan was
    proposed before; 409 naming the live workflow when the case has one with a different plan;
    422 naming each invalid field."""
    _refuse_unknown_query(request)
    agent = _agent(request)
    _require_scopes(agent, payload.template)
    try:
        result = workflow_propose(
            template=payload.template, parameters=payload.parameters, proposer=Actor.for_agent(agent)
        )
    except ProposalInvalid as invalid:
        log_event("workflow.invalid", errors=[p.as_dict() for p in invalid.problems])
        raise _invalid(invalid) from None
    except WorkflowConflict as conflict:
        live = conflict.live
        mine = live.proposed_by_agent_id == agent.pk
        raise ApiProblem(
            "conflict",
            code="live_workflow",
            detail=str(conflict)
            if mine
            else "The case already has a live workflow by another proposer. Nothing was written. Ask a person.",
            **(
                {
                    "workflow_id": live.workflow_id,
                    "state": live.state,
                    "links": {"existing": reverse("api-v1:workflow", kwargs={"workflow_id": live.workflow_id})},
                }
                if mine
                else {}
            ),
        ) from None
    workflow = result.workflow
    bind(workflow_id=workflow.workflow_id)
    if workflow.proposed_by_agent_id != agent.pk:
        raise ApiProblem(
            "conflict",
            code="proposed_elsewhere",
            detail="The case already has this plan, proposed by another proposer. Nothing was written.",
        )
    log_event("workflow.proposed" if result.created else "workflow.replayed", state=workflow.state)
    return Status(201 if result.created else 200, workflow_out(workflow))


@api.get(
    "/workflows/{workflow_id}",
    response={200: WorkflowOut, 404: Problem, 422: Problem},
    url_name="workflow",
    summary="Read one workflow: its steps, their states, what happens next, whether it is final",
    tags=["workflows"],
)
def get_workflow(request: HttpRequest, workflow_id: str) -> WorkflowOut:
    _refuse_unknown_query(request)
    agent = _agent(request)
    # An id no column could hold (too long, or with a NUL, which PostgreSQL refuses in text)
    # cannot exist: the same 404 as any unknown id, never a database error.
    workflow = (
        Workflow.objects.filter(workflow_id=workflow_id, proposed_by_agent=agent).first()
        if len(workflow_id) <= 200 and storable_text(workflow_id)
        else None
    )
    if workflow is None:
        raise ApiProblem(
            "not-found",
            code="workflow_not_found",
            detail="There is no such workflow for this agent.",
            # No echo of the path: the body is byte for byte the same for every unknown id.
            instance=None,
        )
    return workflow_out(workflow)
