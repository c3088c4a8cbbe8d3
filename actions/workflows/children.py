"""A workflow's children: creating a step's child action under the plan's approval (or leaving
it for a manager when the approval no longer binds it), starting a compensation, and pausing or
failing the workflow with a named owner."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction

from actions.engine.faults import fault_point
from actions.foundation.owners import owner_pick
from actions.foundation.trail import event_record
from actions.kinds import kind_for
from actions.models import (
    Action,
    ActionStatus,
    Workflow,
    WorkflowEvent,
    WorkflowStep,
)
from actions.workflows.events import (
    COORDINATOR,
    FAULT_AFTER_NEXT_STEP,
    W,
    coordinator_event,
    coordinator_resume,
    coordinator_transition,
)
from actions.workflows.templates import READ, child_action, compensation_key, step_key
from approvals.models import Decision, WorkflowApproval
from approvals.policy import approval_record

S = ActionStatus


# --- children --------------------------------------------------------------------------------


def latest_plan_approval(workflow: Workflow) -> WorkflowApproval | None:
    return WorkflowApproval.objects.filter(workflow=workflow, decision=Decision.APPROVE).order_by("-pk").first()


def _binding_for(plan_approval: WorkflowApproval, step_name: str) -> dict[str, Any] | None:
    return next((binding for binding in plan_approval.bindings if binding.get("step") == step_name), None)


def _child_create_or_link(
    *,
    workflow: Workflow,
    step: WorkflowStep,
    action: Action,
    plan_approval: WorkflowApproval | None,
    order_version: int | None,
    expires_at: datetime | None,
    reason: str,
    now: datetime,
) -> Action:
    """The child recorded under ``action``'s key: created now, or, when the key exists already
    (a child left by an earlier run), the existing one, never a second one.

    A new child is PROPOSED (by the workflow's proposer) then AUTHORIZED under an approval
    derived from the plan's, in the caller's transaction; its dispatch publishes on commit.
    Without ``plan_approval`` (none covers it any more) it stays PROPOSED, for a manager."""
    try:
        with transaction.atomic():
            action.proposed_by_agent = workflow.proposed_by_agent
            action.proposed_by_user = workflow.proposed_by_user
            action.propose()
            action.status_changed_at = now
            action.save()
            event_record(
                action=action,
                transition="propose",
                from_state="",
                actor=COORDINATOR,
                reason=reason,
                evidence={"workflow": workflow.workflow_id, "step": step.name, "payload_hash": action.payload_hash},
                now=now,
            )
            if plan_approval is None or expires_at is None:
                return action
            approval_record(
                action=action,
                approver=plan_approval.approver,
                label=f"{plan_approval.decided_by_label} (plan of {workflow.workflow_id})",
                policy=plan_approval.policy,
                policy_detail={"workflow": workflow.workflow_id, "workflow_approval": plan_approval.pk},
                note=f"Approved as step {step.name} of the plan {workflow.plan_hash}.",
                now=now,
                actor=COORDINATOR,
                bound_version=order_version,
                expires_at=expires_at,
                reason=f"Authorized by the approval of workflow {workflow.workflow_id}'s plan.",
                evidence_extra={"workflow_approval_id": plan_approval.pk},
            )
            return action
    except IntegrityError:
        return Action.objects.get(action_id=action.action_id)


def step_start(*, workflow: Workflow, step: WorkflowStep, plan_step: dict[str, Any], now: datetime) -> str:
    """Create step ``step``'s child under the plan's approval, if the binding still holds;
    otherwise pause (or stay paused) for a new decision."""
    plan_approval = latest_plan_approval(workflow)
    assert plan_approval is not None, "an authorized workflow has a plan approval"
    key = step_key(workflow.workflow_id, step.name)
    action = child_action(
        workflow_id=workflow.workflow_id, step=plan_step, key=key, payload=plan_step["payload"], kind=step.kind
    )
    binding = _binding_for(plan_approval, step.name)
    problem = None
    if binding is None or binding.get("payload_hash") != action.payload_hash:
        problem = f"The step {step.name}'s payload differs from what the plan's approval binds."
    elif plan_approval.expires_at is None:
        problem = "The plan's approval has no expiry, so it binds nothing in time."
    elif plan_approval.expires_at <= now:
        problem = f"The plan's approval expired at {plan_approval.expires_at:%Y-%m-%d %H:%M} UTC."
    if problem is not None or binding is None or plan_approval.expires_at is None:
        _step_propose(workflow=workflow, step=step, action=action, problem=problem or "", now=now)
        return workflow.state
    coordinator_resume(workflow, reason="Resuming.", now=now)
    # A worker killed here, after the child's commit and before its dispatch is published,
    # leaves an AUTHORIZED child: the AUTHORIZED sweep sends it (tests kill at this point).
    transaction.on_commit(lambda: fault_point(FAULT_AFTER_NEXT_STEP))
    step.action = _child_create_or_link(
        workflow=workflow,
        step=step,
        action=action,
        plan_approval=plan_approval,
        order_version=binding.get("version"),
        expires_at=plan_approval.expires_at,
        reason=f"Step {step.position} of workflow {workflow.workflow_id} ({step.name}).",
        now=now,
    )
    step.save(update_fields=["action"])
    coordinator_event(
        workflow,
        "step_started",
        reason=f"Step {step.position} ({step.name}) authorized; the engine sends it.",
        evidence={"step": step.name, "action_id": key},
        now=now,
    )
    return workflow.state


def _step_propose(*, workflow: Workflow, step: WorkflowStep, action: Action, problem: str, now: datetime) -> None:
    """The plan's approval no longer covers this step (it expired while an earlier step's
    outcome was being established, say). The step is proposed on its own, as any action is: it
    waits in the managers' inbox, counted in their badge and notified, for a decision bound to its
    target as it is now. Approving it runs it and the workflow resumes; rejecting it walks back
    the completed steps. Without this the workflow would wait for a decision nobody was asked
    to make."""
    step.action = _child_create_or_link(
        workflow=workflow,
        step=step,
        action=action,
        plan_approval=None,
        order_version=None,
        expires_at=None,
        reason=f"Step {step.position} of workflow {workflow.workflow_id} ({step.name}), proposed for a new "
        f"decision: {problem}",
        now=now,
    )
    step.save(update_fields=["action"])
    coordinator_event(
        workflow,
        "step_proposed",
        reason=f"Step {step.position} ({step.name}) waits for a manager's decision: {problem}",
        evidence={"step": step.name, "action_id": action.action_id, "problem": problem},
        now=now,
    )
    workflow_pause(workflow=workflow, owner=None, kind=step.kind, waiting_for=waiting_in_inbox(step, problem), now=now)


def waiting_in_inbox(step: WorkflowStep, problem: str) -> str:
    return (
        f"{problem} Step {step.name} waits in the managers' inbox for a new decision: approving it goes on, "
        "rejecting it walks back the completed steps."
    ).strip()


def proposal_problem(workflow: Workflow, step: WorkflowStep) -> str:
    """Why the step was proposed on its own (its 'step_proposed' event), for the paused workflow."""
    event = (
        WorkflowEvent.objects.filter(workflow=workflow, transition="step_proposed", evidence__step=step.name)
        .order_by("-pk")
        .first()
    )
    return str(event.evidence.get("problem", "")) if event is not None else ""


def _compensation_payload(step: WorkflowStep, plan_step: dict[str, Any]) -> dict[str, Any]:
    payload = dict(plan_step["compensation"]["payload"] or {})
    if payload.get("kind") == "credit-note-void":
        assert step.action is not None
        payload["credit_note"] = step.action.provider_reference
        payload["voids"] = step.action.action_id
    return payload


def compensation_start(*, workflow: Workflow, step: WorkflowStep, plan_step: dict[str, Any], now: datetime) -> None:
    plan_approval = latest_plan_approval(workflow)
    assert plan_approval is not None
    key = compensation_key(workflow.workflow_id, step.name)
    action = child_action(
        workflow_id=workflow.workflow_id,
        step=plan_step,
        key=key,
        payload=_compensation_payload(step, plan_step),
        kind=step.compensation_kind,
    )
    # The plan's approval listed this compensation; it binds its target as it is now (a void
    # binds none, a correction email the supplier's contacts) and gets a fresh expiry: walking
    # back must not wait for a manager who approved it already.
    step.compensation = _child_create_or_link(
        workflow=workflow,
        step=step,
        action=action,
        plan_approval=plan_approval,
        order_version=kind_for(action.kind).target_version(action),
        expires_at=now + timedelta(seconds=settings.APPROVAL_TTL_SECONDS),
        reason=f"Compensation of step {step.name} of workflow {workflow.workflow_id}.",
        now=now,
    )
    step.save(update_fields=["compensation"])
    coordinator_event(
        workflow,
        "compensation_started",
        reason=f"Compensating step {step.name} ({step.compensation_kind}).",
        evidence={"step": step.name, "action_id": key, "completion_order": step.completion_order},
        now=now,
    )


# --- pausing, failing ------------------------------------------------------------------------


def owner_for(action: Action | None, kind: str) -> Any:
    if action is not None and action.owner_id is not None:
        return action.owner
    return owner_pick(kind=kind, default_group=kind_for(kind).owner_group if kind != READ else "finance")


def workflow_owner_name(workflow: Workflow, *, owner: Any, waiting_for: str) -> bool:
    """Name ``owner`` and what the workflow waits for, where either changed (without a transition:
    the workflow already waits); whether they did."""
    if workflow.owner_id == getattr(owner, "pk", None) and workflow.waiting_for == waiting_for:
        return False
    workflow.owner = owner
    workflow.waiting_for = waiting_for
    workflow.save(update_fields=["owner", "waiting_for", "updated_at"])
    return True


def workflow_pause(*, workflow: Workflow, owner: Any, kind: str, waiting_for: str, now: datetime) -> None:
    owner = owner or owner_for(None, kind)
    if workflow.state == W.PAUSED:
        workflow_owner_name(workflow, owner=owner, waiting_for=waiting_for)
        return
    _hand_over(workflow, "pause", owner=owner, waiting_for=waiting_for, now=now)


def workflow_fail(*, workflow: Workflow, owner: Any, waiting_for: str, now: datetime) -> None:
    _hand_over(workflow, "fail", owner=owner, waiting_for=waiting_for, now=now)


def _hand_over(workflow: Workflow, transition: str, *, owner: Any, waiting_for: str, now: datetime) -> None:
    """The transition that leaves the workflow to a person (``owner``, nobody when the owner
    group is empty), saying what it waits for."""
    coordinator_transition(
        workflow,
        transition,
        reason=f"{waiting_for} Owner: {owner.get_username() if owner else 'nobody (empty owner group)'}.",
        evidence={"owner": owner.get_username() if owner else None},
        now=now,
        owner=owner,
        waiting_for=waiting_for,
    )
