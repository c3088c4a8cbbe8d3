"""A workflow's states and its trail: every workflow state change writes a WorkflowEvent in the
same transaction, as every action's change writes its ActionEvent."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from actions.foundation.trail import Actor, trail_columns
from actions.models import (
    ActionStatus,
    Workflow,
    WorkflowEvent,
    WorkflowState,
)

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
    workflow: Workflow,
    transition: str,
    from_state: str,
    actor: Actor,
    *,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> WorkflowEvent:
    return WorkflowEvent.objects.create(
        workflow=workflow, **trail_columns(transition, from_state, workflow.state, actor, reason, evidence, now)
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
    return workflow_event(workflow, transition, from_state, actor, reason=reason, evidence=evidence, now=now)


def coordinator_event(
    workflow: Workflow, transition: str, *, reason: str, now: datetime, evidence: dict[str, Any] | None = None
) -> WorkflowEvent:
    """What the coordinator did to a step, in the workflow's trail; the workflow's state stays."""
    return workflow_event(workflow, transition, workflow.state, COORDINATOR, reason=reason, evidence=evidence, now=now)


def coordinator_transition(
    workflow: Workflow,
    transition: str,
    *,
    reason: str,
    now: datetime,
    evidence: dict[str, Any] | None = None,
    **kwargs: Any,
) -> WorkflowEvent:
    """The coordinator moves the workflow on (start, pause, resume, compensate, complete, fail);
    ``kwargs`` go to the transition."""
    return workflow_transition(
        workflow=workflow, transition=transition, actor=COORDINATOR, reason=reason, evidence=evidence, now=now, **kwargs
    )


def coordinator_resume(workflow: Workflow, *, reason: str, now: datetime) -> None:
    """Resume the workflow if it is paused (its step goes on): a running one is left as it is."""
    if workflow.state == W.PAUSED:
        coordinator_transition(workflow, "resume", reason=reason, now=now)
