"""The audit trail's writers: who acted, one transition with its event, one event.

The lowest layer of the engine's vocabulary: the engine, the approval policy and the services
all change an action through ``action_transition``, which writes the audit event in the caller's
transaction (invariant 9).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from actions import publish
from actions.models import Action, ActionEvent, ActionStatus, ActorKind, Agent, Attempt
from actions.outbox import webhook_outbox_write

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser


@dataclass(frozen=True)
class Actor:
    """Who caused a change: a console user, an agent, or the system (a worker or a policy)."""

    kind: ActorKind
    label: str
    user: Any = None
    agent: Agent | None = None

    @classmethod
    def for_user(cls, user: AbstractBaseUser | AnonymousUser) -> Actor:
        return cls(kind=ActorKind.USER, label=user.get_username(), user=user)

    @classmethod
    def for_agent(cls, agent: Agent) -> Actor:
        return cls(kind=ActorKind.AGENT, label=f"agent:{agent.name}", agent=agent)

    @classmethod
    def system(cls, name: str) -> Actor:
        return cls(kind=ActorKind.SYSTEM, label=f"system:{name}")

    @property
    def accountable_user(self) -> Any:
        """The person four eyes compare with: the user, or the agent's owner."""
        if self.user is not None:
            return self.user
        if self.agent is not None:
            return self.agent.owner
        return None


# --- the audit trail ----------------------------------------------------------------------


@dataclass
class _RowsTogether:
    events: list[ActionEvent] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)


# Inside a transaction that changes many actions at once (the batched claim, the grouped record):
# their audit events and attempts, inserted together at the end of the block.
_together: ContextVar[_RowsTogether | None] = ContextVar("rows_written_together", default=None)


@contextmanager
def rows_written_together() -> Iterator[None]:
    """Within this block, insert the audit events and attempts it writes together when it ends:
    one INSERT for all the events and one for all the attempts, instead of one per row.

    Use it inside the transaction that makes the changes, and end it before that transaction
    ends: the rows are written when the block ends without an error, so they still commit or
    roll back with the changes they record (invariant 9). Nothing inside the block may read
    them back: they have no primary key until it ends. Each event's webhook outbox row is
    written after the events (it names the event's key).
    """
    together = _RowsTogether()
    token = _together.set(together)
    try:
        yield
        if together.events:
            ActionEvent.objects.bulk_create(together.events)
            for event in together.events:
                webhook_outbox_write(event)
        if together.attempts:
            Attempt.objects.bulk_create(together.attempts)
    finally:
        _together.reset(token)


def attempt_write(attempt: Attempt) -> Attempt:
    """Insert one attempt now, or with the others at the end of ``rows_written_together``."""
    together = _together.get()
    if together is not None:
        together.attempts.append(attempt)
    else:
        attempt.save(force_insert=True)
    return attempt


def event_record(
    *,
    action: Action,
    transition: str,
    from_state: str,
    actor: Actor,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> ActionEvent:
    """Append one audit event. Call it inside the transaction that made the change.

    A state change of an agent's action also writes the agent's webhook outbox row, in the same
    transaction (actions.outbox). Inside ``rows_written_together`` both are written when the
    block ends.
    """
    event = ActionEvent(
        action=action,
        transition=transition,
        from_state=from_state,
        to_state=action.status,
        actor_kind=actor.kind,
        actor_user=actor.user if actor.kind == ActorKind.USER else None,
        actor_agent=actor.agent,
        actor_label=actor.label,
        reason=reason,
        evidence=evidence or {},
        created_at=now or timezone.now(),
    )
    together = _together.get()
    if together is not None:
        together.events.append(event)
        return event
    event.save(force_insert=True)
    webhook_outbox_write(event)
    return event


def action_transition(
    *,
    action: Action,
    transition: str,
    actor: Actor,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    now: datetime | None = None,
    **kwargs: Any,
) -> ActionEvent:
    """Run one FSM transition, save it and write its audit event.

    Must run inside a transaction. The save is the conditional UPDATE of
    ConcurrentTransitionMixin (``WHERE status = <old>``): if another process moved the action
    first it raises ConcurrentTransition and the caller's transaction rolls back.
    """
    now = now or timezone.now()
    from_state = action.status
    getattr(action, transition)(**kwargs)
    action.status_changed_at = now
    changed = action.changed_fields()
    if changed is None:
        action.save()
    else:
        # Only the columns that differ from the row as loaded or last saved (what the transition
        # and the caller changed), plus the auto_now timestamp: a full save rewrites some 30
        # columns and copies the payload for the immutability check.
        action.save(update_fields=[*changed, "updated_at"])
    event = event_record(
        action=action,
        transition=transition,
        from_state=from_state,
        actor=actor,
        reason=reason,
        evidence=evidence,
        now=now,
    )
    _workflow_nudge(action, from_state)
    return event


# The child states a workflow's coordinator acts on: an outcome (next step, pause, compensate),
# a new decision needed, or a paused step taken up again by a retry or a person's resolution.
_WORKFLOW_WAKING_STATES = frozenset(
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


def _workflow_nudge(action: Action, from_state: str) -> None:
    """A workflow's child changed: wake the coordinator once the change commits. The payload
    names the workflow (material, set when the coordinator created the child), so no query."""
    workflow_id = action.payload.get("workflow") if isinstance(action.payload, dict) else None
    if not workflow_id:
        return
    resumed = action.status == ActionStatus.SUBMITTING and from_state in (
        ActionStatus.UNKNOWN,
        ActionStatus.NEEDS_REVIEW,
    )
    if action.status in _WORKFLOW_WAKING_STATES or resumed:
        publish.workflow_advance_enqueue_on_commit(str(workflow_id))


# The transition by which a person decides to send again to a receiver that can neither
# deduplicate nor be asked. Each such event allows one more effect at the receiver (the audits
# count them) and tells the kind to mark the repeat in what it sends.
RESEND_TRANSITION = "resolve_resend"


def resend_decisions(action: Action) -> list[ActionEvent]:
    return list(ActionEvent.objects.filter(action=action, transition=RESEND_TRANSITION).order_by("created_at", "id"))
