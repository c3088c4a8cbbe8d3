"""How a workflow hears that one of its children changed: a state-change listener registered with
the audit trail (``actions.foundation.trail.state_change_listen``) when the app starts."""

from __future__ import annotations

from actions.foundation import publish
from actions.foundation.trail import state_change_listen
from actions.models import Action, ActionStatus

# The child states a workflow's coordinator acts on: an outcome (next step, pause, compensate),
# a new decision needed, or a paused step taken up again by a retry or a person's resolution.
WAKING_STATES = frozenset(
    {
        ActionStatus.SUCCEEDED,
        ActionStatus.FAILED_FINAL,
        ActionStatus.UNKNOWN,
        ActionStatus.NEEDS_REVIEW,
        ActionStatus.STALE,
        ActionStatus.CANCELLED,
        ActionStatus.REJECTED,
        ActionStatus.PROPOSED,
    }
)


@state_change_listen
def workflow_wake_on_child_change(action: Action, from_state: str) -> None:
    """A workflow's child changed: wake the coordinator once the change commits. The payload
    names the workflow (material, set when the coordinator created the child), so no query."""
    workflow_id = action.payload.get("workflow") if isinstance(action.payload, dict) else None
    if not workflow_id:
        return
    resumed = action.status == ActionStatus.SUBMITTING and from_state in (
        ActionStatus.UNKNOWN,
        ActionStatus.NEEDS_REVIEW,
    )
    if action.status in WAKING_STATES or resumed:
        publish.workflow_advance_enqueue_on_commit(str(workflow_id))
