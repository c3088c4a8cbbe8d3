"""The workflow coordinator: runs a plan's steps in order and walks completed ones back in reverse.

The coordinator is the console, not the agent. It never calls a receiver itself (except a read
step's read): each effect step is a child action that goes through the same claim, lease, send,
record and reconcile path as any action. The coordinator only decides, from the children's
recorded states, what comes next:

- step k+1 is created (AUTHORIZED under the plan's approval) only once step k is SUCCEEDED
  (invariant 12); creating it is one transaction under the workflow's row lock, and its key
  ``<workflow id>:<step>`` is UNIQUE, so two coordinators create it once;
- a child in UNKNOWN, NEEDS_REVIEW or STALE pauses the workflow with a named owner; nothing is
  compensated while an outcome is unknown (invariant 14);
- a child that failed for good starts compensation: every completed step that has one, in
  reverse completion order, each as a child with the key ``<workflow id>:<step>:compensate``,
  created at most once and only after the one after it succeeded (invariant 13);
- a compensation that cannot complete leaves the workflow with a named owner (NEEDS_REVIEW of
  the compensation, then FAILED if it fails for good).

Every workflow state change writes a WorkflowEvent in the same transaction. The coordinator is
woken by the trail when a child changes (``actions.trail``), and by the sweep for a nudge lost
on the way; running it again is always safe: it only acts on what is recorded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from actions.engine.faults import fault_point
from actions.foundation.owners import owner_pick
from actions.foundation.publish import workflow_advance_enqueue_on_commit
from actions.kinds import kind_for
from actions.models import (
    Action,
    ActionStatus,
    Workflow,
    WorkflowEvent,
    WorkflowState,
    WorkflowStep,
)
from actions.models.actions import ActorKind
from actions.trail import Actor, event_record
from actions.workflows.templates import READ, child_action, compensation_key, step_key, template_for
from approvals.models import Decision, WorkflowApproval
from approvals.policy import approval_record

log = logging.getLogger(__name__)
S = ActionStatus
W = WorkflowState

COORDINATOR = Actor.system("workflow-coordinator")
IN_FLIGHT = frozenset({S.AUTHORIZED, S.SUBMITTING, S.SETTLING})
UNRESOLVED = frozenset({S.SUBMITTING, S.UNKNOWN, S.SETTLING, S.NEEDS_REVIEW})
NEEDS_DECISION = frozenset({S.STALE, S.PROPOSED})
DID_NOT_HAPPEN = frozenset({S.FAILED_FINAL, S.CANCELLED, S.REJECTED})

# Named fault points (tests/faults kill a real worker here): between a step's record and the
# next step's claim, and in the middle of compensation.
FAULT_BEFORE_NEXT_STEP = "workflow_before_next_step"
FAULT_AFTER_NEXT_STEP = "workflow_after_next_step"
FAULT_DURING_COMPENSATION = "workflow_during_compensation"


# --- the trail -------------------------------------------------------------------------------


def workflow_event(
    *,
    workflow: Workflow,
    transition: str,
    from_state: str,
    actor: Actor,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> WorkflowEvent:
    return WorkflowEvent.objects.create(
        workflow=workflow,
        transition=transition,
        from_state=from_state,
        to_state=workflow.state,
        actor_kind=actor.kind,
        actor_user=actor.user if actor.kind == ActorKind.USER else None,
        actor_agent=actor.agent,
        actor_label=actor.label,
        reason=reason,
        evidence=evidence or {},
        created_at=now or timezone.now(),
    )


def workflow_transition(
    *,
    workflow: Workflow,
    transition: str,
    actor: Actor,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    now: datetime | None = None,
    **kwargs: Any,
) -> WorkflowEvent:
    """One FSM transition of the workflow, saved (WHERE state = <old>) with its event."""
    now = now or timezone.now()
    from_state = workflow.state
    getattr(workflow, transition)(**kwargs)
    workflow.state_changed_at = now
    workflow.save()
    return workflow_event(
        workflow=workflow,
        transition=transition,
        from_state=from_state,
        actor=actor,
        reason=reason,
        evidence=evidence,
        now=now,
    )


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
    (a child left by an earlier run), the existing one, never a second one."""
    try:
        with transaction.atomic():
            return _child_create(
                workflow=workflow,
                step=step,
                action=action,
                plan_approval=plan_approval,
                order_version=order_version,
                expires_at=expires_at,
                reason=reason,
                now=now,
            )
    except IntegrityError:
        return Action.objects.get(action_id=action.action_id)


def _child_create(
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
    """Record a child: PROPOSED (by the workflow's proposer) then AUTHORIZED under an approval
    derived from the plan's, in the caller's transaction; its dispatch publishes on commit.
    Without ``plan_approval`` (none covers it any more) it stays PROPOSED, for a manager."""
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


def _step_start(*, workflow: Workflow, step: WorkflowStep, plan_step: dict[str, Any], now: datetime) -> str:
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
    if workflow.state == W.PAUSED:
        workflow_transition(workflow=workflow, transition="resume", actor=COORDINATOR, reason="Resuming.", now=now)
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
    workflow_event(
        workflow=workflow,
        transition="step_started",
        from_state=workflow.state,
        actor=COORDINATOR,
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
    workflow_event(
        workflow=workflow,
        transition="step_proposed",
        from_state=workflow.state,
        actor=COORDINATOR,
        reason=f"Step {step.position} ({step.name}) waits for a manager's decision: {problem}",
        evidence={"step": step.name, "action_id": action.action_id, "problem": problem},
        now=now,
    )
    _pause(workflow=workflow, owner=None, kind=step.kind, waiting_for=_waiting_in_inbox(step, problem), now=now)


def _waiting_in_inbox(step: WorkflowStep, problem: str) -> str:
    return (
        f"{problem} Step {step.name} waits in the managers' inbox for a new decision: approving it goes on, "
        "rejecting it walks back the completed steps."
    ).strip()


def _proposal_problem(workflow: Workflow, step: WorkflowStep) -> str:
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


def _compensation_start(*, workflow: Workflow, step: WorkflowStep, plan_step: dict[str, Any], now: datetime) -> None:
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
    workflow_event(
        workflow=workflow,
        transition="compensation_started",
        from_state=workflow.state,
        actor=COORDINATOR,
        reason=f"Compensating step {step.name} ({step.compensation_kind}).",
        evidence={"step": step.name, "action_id": key, "completion_order": step.completion_order},
        now=now,
    )


# --- pausing, failing ------------------------------------------------------------------------


def _owner_for(action: Action | None, kind: str) -> Any:
    if action is not None and action.owner_id is not None:
        return action.owner
    return owner_pick(kind=kind, default_group=kind_for(kind).owner_group if kind != READ else "finance")


def _pause(*, workflow: Workflow, owner: Any, kind: str, waiting_for: str, now: datetime) -> None:
    owner = owner or _owner_for(None, kind)
    if workflow.state == W.PAUSED:
        if workflow.owner_id != getattr(owner, "pk", None) or workflow.waiting_for != waiting_for:
            workflow.owner = owner
            workflow.waiting_for = waiting_for
            workflow.save(update_fields=["owner", "waiting_for", "updated_at"])
        return
    workflow_transition(
        workflow=workflow,
        transition="pause",
        actor=COORDINATOR,
        reason=f"{waiting_for} Owner: {owner.get_username() if owner else 'nobody (empty owner group)'}.",
        evidence={"owner": owner.get_username() if owner else None},
        now=now,
        owner=owner,
        waiting_for=waiting_for,
    )


def _fail(*, workflow: Workflow, owner: Any, waiting_for: str, now: datetime) -> None:
    workflow_transition(
        workflow=workflow,
        transition="fail",
        actor=COORDINATOR,
        reason=f"{waiting_for} Owner: {owner.get_username() if owner else 'nobody (empty owner group)'}.",
        evidence={"owner": owner.get_username() if owner else None},
        now=now,
        owner=owner,
        waiting_for=waiting_for,
    )


# --- the coordinator -------------------------------------------------------------------------


@dataclass
class _Next:
    state: str
    read_step: int | None = None  # the pk of a read step to perform outside the transaction


def workflow_advance(*, workflow_id: str, now: datetime | None = None) -> str:
    """Do whatever the workflow's recorded state calls for next. Safe to run at any time, twice,
    or in two processes at once (the workflow's row lock serialises them)."""
    for _ in range(20):
        step = _advance_locked(workflow_id=workflow_id, now=now)
        if step.read_step is None:
            return step.state
        _read_perform(step_pk=step.read_step)
    return step.state


def _advance_locked(*, workflow_id: str, now: datetime | None) -> _Next:
    with transaction.atomic(durable=True):
        workflow = Workflow.objects.select_for_update().filter(workflow_id=workflow_id).first()
        # The time is read once the lock is held: a coordinator that waited for another one
        # must not stamp its events earlier than the changes it waited for.
        now = now or timezone.now()
        if workflow is None:
            return _Next(state="missing")
        if workflow.state == W.AUTHORIZED:
            workflow_transition(
                workflow=workflow,
                transition="start",
                actor=COORDINATOR,
                reason="The plan is approved: running it.",
                now=now,
            )
        if workflow.state in (W.RUNNING, W.PAUSED):
            return _run(workflow=workflow, now=now)
        if workflow.state == W.COMPENSATING:
            return _compensate(workflow=workflow, now=now)
        return _Next(state=workflow.state)


def _plan_step(workflow: Workflow, step: WorkflowStep) -> dict[str, Any]:
    return next(plan for plan in workflow.plan["steps"] if plan["name"] == step.name)


def _mark_completed(workflow: Workflow, step: WorkflowStep, steps: list[WorkflowStep], now: datetime) -> None:
    if step.completion_order is not None:
        return
    step.completion_order = 1 + max((s.completion_order or 0 for s in steps), default=0)
    step.completed_at = now
    step.save(update_fields=["completion_order", "completed_at"])
    workflow_event(
        workflow=workflow,
        transition="step_succeeded",
        from_state=workflow.state,
        actor=COORDINATOR,
        reason=f"Step {step.position} ({step.name}) is recorded as succeeded.",
        evidence={"step": step.name, "completion_order": step.completion_order},
        now=now,
    )


def _run(*, workflow: Workflow, now: datetime) -> _Next:
    steps = list(WorkflowStep.objects.filter(workflow=workflow).select_related("action").order_by("position"))
    for step in steps:
        if step.kind == READ:
            if step.result is None:
                return _Next(state=workflow.state, read_step=step.pk)
            _mark_completed(workflow, step, steps, now)
            continue
        child = step.action
        if child is None:
            fault_point(FAULT_BEFORE_NEXT_STEP)
            _step_start(workflow=workflow, step=step, plan_step=_plan_step(workflow, step), now=now)
            return _Next(state=workflow.state)
        if child.status == S.SUCCEEDED:
            _mark_completed(workflow, step, steps, now)
            continue
        if child.status in IN_FLIGHT:
            if workflow.state == W.PAUSED:
                workflow_transition(
                    workflow=workflow,
                    transition="resume",
                    actor=COORDINATOR,
                    reason=f"Step {step.name} is being sent again ({child.get_status_display().lower()}).",
                    now=now,
                )
            return _Next(state=workflow.state)
        if child.status in (S.UNKNOWN, S.NEEDS_REVIEW):
            _pause(
                workflow=workflow,
                owner=_owner_for(child, child.kind),
                kind=child.kind,
                waiting_for=f"Step {step.name}'s outcome is {child.get_status_display().lower()}: nothing runs or "
                "is compensated until it is known.",
                now=now,
            )
            return _Next(state=workflow.state)
        if child.status == S.PROPOSED:
            # Proposed on its own (the plan's approval no longer covered it): the same words
            # as when it was proposed, however often the workflow is advanced meanwhile.
            waiting_for = _waiting_in_inbox(step, _proposal_problem(workflow, step))
            _pause(workflow=workflow, owner=None, kind=child.kind, waiting_for=waiting_for, now=now)
            return _Next(state=workflow.state)
        if child.status in NEEDS_DECISION:
            _pause(
                workflow=workflow,
                owner=None,
                kind=child.kind,
                waiting_for=f"Step {step.name} needs a new decision ({child.get_status_display().lower()}): "
                "its approval no longer holds.",
                now=now,
            )
            return _Next(state=workflow.state)
        if child.status in DID_NOT_HAPPEN:
            workflow_transition(
                workflow=workflow,
                transition="begin_compensation",
                actor=COORDINATOR,
                reason=f"Step {step.name} ended {child.get_status_display().lower()}: walking back the completed "
                "steps in reverse.",
                evidence={"failed_step": step.name, "action_id": child.action_id},
                now=now,
            )
            return _compensate(workflow=workflow, now=now)
        raise AssertionError(f"unhandled child status {child.status}")
    if workflow.state == W.PAUSED:
        # The last step was paused on an unknown outcome that has since been settled as
        # succeeded (by reconciliation or by a person): nothing is left to run.
        workflow_transition(
            workflow=workflow,
            transition="resume",
            actor=COORDINATOR,
            reason="The paused step's outcome is known now: it succeeded.",
            now=now,
        )
    workflow_transition(
        workflow=workflow, transition="complete", actor=COORDINATOR, reason="Every step succeeded.", now=now
    )
    return _Next(state=workflow.state)


def _compensate(*, workflow: Workflow, now: datetime) -> _Next:
    steps = list(
        WorkflowStep.objects.filter(workflow=workflow).select_related("action", "compensation").order_by("position")
    )
    # Invariant 14: never while any step's outcome is unknown.
    unknown = [s for s in steps if s.action is not None and s.action.status in UNRESOLVED]
    if unknown:
        child = unknown[0].action
        assert child is not None
        workflow.owner = _owner_for(child, child.kind)
        workflow.waiting_for = f"Step {unknown[0].name}'s outcome is unknown: compensation waits for it."
        workflow.save(update_fields=["owner", "waiting_for", "updated_at"])
        return _Next(state=workflow.state)
    completed = sorted((s for s in steps if s.completion_order is not None), key=lambda s: -(s.completion_order or 0))
    for step in completed:
        if not step.compensation_kind:
            continue  # "none", with its reason in the plan
        comp = step.compensation
        if comp is None:
            fault_point(FAULT_DURING_COMPENSATION)
            _compensation_start(workflow=workflow, step=step, plan_step=_plan_step(workflow, step), now=now)
            return _Next(state=workflow.state)
        if comp.status == S.SUCCEEDED:
            continue
        if comp.status in IN_FLIGHT or comp.status == S.UNKNOWN:
            return _Next(state=workflow.state)
        if comp.status == S.NEEDS_REVIEW:
            owner = _owner_for(comp, comp.kind)
            text = f"The compensation of {step.name} needs review: its outcome is unknown."
            if workflow.owner_id != getattr(owner, "pk", None) or workflow.waiting_for != text:
                workflow.owner = owner
                workflow.waiting_for = text
                workflow.save(update_fields=["owner", "waiting_for", "updated_at"])
                workflow_event(
                    workflow=workflow,
                    transition="owner_named",
                    from_state=workflow.state,
                    actor=COORDINATOR,
                    reason=f"{text} Owner: {owner.get_username() if owner else 'nobody'}.",
                    now=now,
                )
            return _Next(state=workflow.state)
        # Failed for good, stale, cancelled: it cannot complete by itself.
        _fail(
            workflow=workflow,
            owner=_owner_for(comp, comp.kind),
            waiting_for=f"The compensation of {step.name} could not complete "
            f"({comp.get_status_display().lower()}): a person settles it.",
            now=now,
        )
        return _Next(state=workflow.state)
    none = [s.name for s in completed if not s.compensation_kind and s.kind != READ]
    workflow_transition(
        workflow=workflow,
        transition="finish_compensation",
        actor=COORDINATOR,
        reason="Every completed step with a compensation was walked back."
        + (f" Without one, as planned: {', '.join(none)}." if none else ""),
        now=now,
    )
    return _Next(state=workflow.state)


# --- the read step ---------------------------------------------------------------------------


def _read_perform(*, step_pk: int) -> None:
    """Read the documents outside any transaction, then save the result once: a result already
    saved (by a run that got there first) wins and is reused, never replaced."""
    step = WorkflowStep.objects.select_related("workflow").get(pk=step_pk)
    if step.result is not None:
        return
    plan_step = _plan_step(step.workflow, step)
    template = template_for(step.workflow.template)
    read = template.spec(step.name).read if template is not None else None
    if read is None:
        raise ValueError(f"{step.workflow.template}.{step.name} is not a read step of a registered template")
    result = read(plan_step["payload"])
    with transaction.atomic(durable=True):
        WorkflowStep.objects.filter(pk=step_pk, result__isnull=True).update(result=result)


# --- the sweep -------------------------------------------------------------------------------


def sweep_workflows(*, now: datetime | None = None, limit: int = 100) -> int:
    """Advance workflows whose next move was never made: an approval whose nudge was lost, a
    step recorded by a worker that died before the coordinator ran, a compensation not started.

    A grace period leaves fresh changes to their own nudge. Each workflow is advanced under its
    own lock, so running this next to the coordinators is safe.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS / 2)
    ids = list(
        Workflow.objects.filter(state__in=[W.AUTHORIZED, W.RUNNING, W.PAUSED, W.COMPENSATING], updated_at__lt=cutoff)
        .order_by("updated_at")
        .values_list("workflow_id", flat=True)[:limit]
    )
    advanced = 0
    for workflow_id in ids:
        before = Workflow.objects.filter(workflow_id=workflow_id).values_list("state", "updated_at").first()
        workflow_advance(workflow_id=workflow_id)
        after = Workflow.objects.filter(workflow_id=workflow_id).values_list("state", "updated_at").first()
        if before != after:
            advanced += 1
        else:
            # Nothing to do now (a step in flight): touch it so the sweep moves on to others.
            Workflow.objects.filter(workflow_id=workflow_id, updated_at=before[1] if before else None).update(
                updated_at=now
            )
    return advanced


def workflow_nudge_on_commit(workflow: Workflow) -> None:
    workflow_advance_enqueue_on_commit(workflow.workflow_id)
