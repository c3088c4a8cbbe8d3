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
woken by the trail when a child changes (``actions.foundation.trail``), and by the sweep for a nudge lost
on the way; running it again is always safe: it only acts on what is recorded.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from actions.engine.faults import fault_point
from actions.engine.sweeps import sweep_budget_seconds
from actions.foundation.clock import database_clock_now
from actions.foundation.publish import workflow_advance_enqueue_on_commit
from actions.models import (
    ActionStatus,
    Workflow,
    WorkflowStep,
)
from actions.workflows.children import (
    compensation_start,
    owner_for,
    proposal_problem,
    step_start,
    waiting_in_inbox,
    workflow_fail,
    workflow_owner_name,
    workflow_pause,
)
from actions.workflows.events import (
    DID_NOT_HAPPEN,
    FAULT_BEFORE_NEXT_STEP,
    FAULT_DURING_COMPENSATION,
    IN_FLIGHT,
    NEEDS_DECISION,
    UNRESOLVED,
    W,
    coordinator_event,
    coordinator_resume,
    coordinator_transition,
)
from actions.workflows.templates import READ, template_for

log = logging.getLogger(__name__)
S = ActionStatus


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
        now = now or database_clock_now()
        if workflow is None:
            return _Next(state="missing")
        if workflow.state == W.AUTHORIZED:
            coordinator_transition(workflow, "start", reason="The plan is approved: running it.", now=now)
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
    coordinator_event(
        workflow,
        "step_succeeded",
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
            step_start(workflow=workflow, step=step, plan_step=_plan_step(workflow, step), now=now)
            return _Next(state=workflow.state)
        if child.status == S.SUCCEEDED:
            _mark_completed(workflow, step, steps, now)
            continue
        if child.status in IN_FLIGHT:
            coordinator_resume(
                workflow,
                reason=f"Step {step.name} is being sent again ({child.get_status_display().lower()}).",
                now=now,
            )
            return _Next(state=workflow.state)
        if child.status in (S.UNKNOWN, S.NEEDS_REVIEW):
            workflow_pause(
                workflow=workflow,
                owner=owner_for(child, child.kind),
                kind=child.kind,
                waiting_for=f"Step {step.name}'s outcome is {child.get_status_display().lower()}: nothing runs or "
                "is compensated until it is known.",
                now=now,
            )
            return _Next(state=workflow.state)
        if child.status == S.PROPOSED:
            # Proposed on its own (the plan's approval no longer covered it): the same words
            # as when it was proposed, however often the workflow is advanced meanwhile.
            waiting_for = waiting_in_inbox(step, proposal_problem(workflow, step))
            workflow_pause(workflow=workflow, owner=None, kind=child.kind, waiting_for=waiting_for, now=now)
            return _Next(state=workflow.state)
        if child.status in NEEDS_DECISION:
            workflow_pause(
                workflow=workflow,
                owner=None,
                kind=child.kind,
                waiting_for=f"Step {step.name} needs a new decision ({child.get_status_display().lower()}): "
                "its approval no longer holds.",
                now=now,
            )
            return _Next(state=workflow.state)
        if child.status in DID_NOT_HAPPEN:
            coordinator_transition(
                workflow,
                "begin_compensation",
                reason=f"Step {step.name} ended {child.get_status_display().lower()}: walking back the completed "
                "steps in reverse.",
                evidence={"failed_step": step.name, "action_id": child.action_id},
                now=now,
            )
            return _compensate(workflow=workflow, now=now)
        raise AssertionError(f"unhandled child status {child.status}")
    # The last step may have been paused on an unknown outcome that has since been settled as
    # succeeded (by reconciliation or by a person): nothing is left to run.
    coordinator_resume(workflow, reason="The paused step's outcome is known now: it succeeded.", now=now)
    coordinator_transition(workflow, "complete", reason="Every step succeeded.", now=now)
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
        workflow.owner = owner_for(child, child.kind)
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
            compensation_start(workflow=workflow, step=step, plan_step=_plan_step(workflow, step), now=now)
            return _Next(state=workflow.state)
        if comp.status == S.SUCCEEDED:
            continue
        if comp.status in IN_FLIGHT or comp.status == S.UNKNOWN:
            return _Next(state=workflow.state)
        if comp.status == S.NEEDS_REVIEW:
            owner = owner_for(comp, comp.kind)
            text = f"The compensation of {step.name} needs review: its outcome is unknown."
            if workflow_owner_name(workflow, owner=owner, waiting_for=text):
                coordinator_event(
                    workflow,
                    "owner_named",
                    reason=f"{text} Owner: {owner.get_username() if owner else 'nobody'}.",
                    now=now,
                )
            return _Next(state=workflow.state)
        # Failed for good, stale, cancelled: it cannot complete by itself.
        workflow_fail(
            workflow=workflow,
            owner=owner_for(comp, comp.kind),
            waiting_for=f"The compensation of {step.name} could not complete "
            f"({comp.get_status_display().lower()}): a person settles it.",
            now=now,
        )
        return _Next(state=workflow.state)
    none = [s.name for s in completed if not s.compensation_kind and s.kind != READ]
    coordinator_transition(
        workflow,
        "finish_compensation",
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
    # The database's clock: a host whose own runs ahead would find every workflow overdue, and
    # touch each one into the future, hiding it from the other hosts' sweeps.
    now = now or database_clock_now()
    cutoff = now - timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS / 2)
    started = time.monotonic()
    ids = list(
        Workflow.objects.filter(state__in=[W.AUTHORIZED, W.RUNNING, W.PAUSED, W.COMPENSATING], updated_at__lt=cutoff)
        .order_by("updated_at")
        .values_list("workflow_id", flat=True)[:limit]
    )
    advanced = 0
    for workflow_id in ids:
        if time.monotonic() - started > sweep_budget_seconds():
            break  # the rest waits for the next period, oldest first
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
