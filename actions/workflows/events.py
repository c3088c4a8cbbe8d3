"""A workflow's states and its trail: every workflow state change writes a WorkflowEvent in the
same transaction, as every action's change writes its ActionEvent."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from actions.foundation.trail import Actor
from actions.models import (
    ActionStatus,
    Workflow,
    WorkflowEvent,
    WorkflowState,
)
from actions.models.actions import ActorKind

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
