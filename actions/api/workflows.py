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

from actions.api.logs import bind, log_event
from actions.api.problems import refusal_problem
from actions.api.schemas import Problem
from actions.api.views import agent_of, api, idempotent_post, refuse_unknown_query, served
from actions.models import Workflow
from actions.proposals.outcomes import AgentRefusal
from actions.proposals.workflows import agent_workflow_propose, agent_workflow_read
from actions.workflows.services import workflow_summary


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


@idempotent_post(
    "/workflows",
    WorkflowOut,
    url_name="workflows",
    summary="Propose a workflow (several effects from one decision)",
    tag="workflows",
)
def propose_workflow(request: HttpRequest, payload: WorkflowProposal) -> Status[WorkflowOut]:
    """Propose a plan. 201 with the new workflow; 200 with the live one when the same plan was
    proposed before; 409 naming the live workflow when the case has one with a different plan;
    422 naming each invalid field."""
    result = served(request, "workflow", agent_workflow_propose, payload)
    workflow = result.workflow
    bind(workflow_id=workflow.workflow_id)
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
    refuse_unknown_query(request)
    try:
        return workflow_out(agent_workflow_read(agent=agent_of(request), workflow_id=workflow_id))
    except AgentRefusal as refusal:
        raise refusal_problem(refusal) from None
