"""The audit trail's writers: who acted, one transition with its event, one event.

The lowest layer of the engine's vocabulary: the engine, the approval policy and the services
all change an action through ``action_transition``, which writes the audit event in the caller's
transaction (invariant 9).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from actions.foundation import sql
from actions.foundation.chain import GENESIS, chain_link, content_hash, event_content
from actions.foundation.outbox import webhook_outbox_write
from actions.foundation.sql.trail_events import event_chain_heads, trail_snapshot
from actions.models import Action, ActionEvent, ActorKind, Agent, ArchivedActionEvent, Attempt
from actions.models.actions import AuditEvent

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
class Writes:
    """The rows a transaction that changes many actions at once writes together at its end.

    The batched claim, the record (of one answer or a group) and the proposal make one, pass it
    to the writers below (``writes=``), which then add their row here instead of writing it at
    once, and call ``write()`` before their transaction commits: all the audit events in one
    INSERT (and each one's webhook outbox row), all the attempts in one INSERT and all the
    answers on attempts in one UPDATE (actions.foundation.sql). The rows still commit or roll back with the
    changes they record (invariant 9). Nothing may read them back before ``write()``: they have
    no key until then.

    ``action_transition(writes=...)`` runs the transition and records its event, but does not
    write the action's row: the caller writes it, with the compare-and-set of its own (the
    claim's ``actions.foundation.sql.actions_claim``, the record's lease fence ``actions_record``).

    ``webhooks``: each agent's active webhook by the agent's key (None: none), as the caller
    read it with its actions; the outbox reads an agent missing from it once, and adds it.
    """

    events: list[ActionEvent] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    answers: list[Attempt] = field(default_factory=list)
    webhooks: dict[int, int | None] = field(default_factory=dict)
    # Actions inserted by the caller's transaction: their trails are empty, and not read.
    new_actions: set[int] = field(default_factory=set)

    def write(self) -> None:
        events, attempts, answers = self.events, self.attempts, self.answers
        self.events, self.attempts, self.answers = [], [], []
        if events:
            events_chain(events, new_actions=self.new_actions)
            sql.events_insert(events)
            # Each outbox row names its event's key: written once the events have theirs.
            for event in events:
                webhook_outbox_write(event, webhooks=self.webhooks)
        if attempts:
            sql.attempts_insert(attempts)
        if answers:
            sql.attempt_answers(answers)


def events_chain(events: list[ActionEvent], *, new_actions: set[int] | frozenset[int] = frozenset()) -> None:
    """Give each new event its place in its action's hash chain (actions.foundation.chain): its
    sequence, content hash and chain hash, after the action's last event, in the order given.

    Called by the writers below just before the INSERT, in the transaction that writes the
    events, while that transaction holds the actions' row locks (the claim's and the record's
    locked reads and fenced UPDATEs, a service's ``select_for_update``; a new action is seen by
    no one else). The previous chain hashes come in one read for all the events' actions. A
    writer that breaks that rule and races another finds the unique (action, sequence) in its
    way: its transaction fails rather than fork the chain.

    ``new_actions``: actions the caller's transaction inserted, whose trails start here.
    """
    heads = event_chain_heads(action_pks=sorted({event.action_id for event in events} - new_actions))
    for event in events:
        sequence, previous = heads.get(event.action_id, (0, GENESIS))
        event.sequence = sequence + 1
        event.content_hash = content_hash(event_content_of(event))
        event.chain_hash = chain_link(previous, event.content_hash)
        heads[event.action_id] = (event.sequence, event.chain_hash)


def event_content_of(event: AuditEvent, *, action_ref: str | None = None) -> dict[str, Any]:
    """The fields of ``event`` its content hash covers; ``action_ref``: its action's business id,
    when the caller read it without the action."""
    return event_content(
        action=action_ref if action_ref is not None else event.action.action_id,
        sequence=event.sequence or 0,
        transition=event.transition,
        from_state=event.from_state,
        to_state=event.to_state,
        actor_kind=event.actor_kind,
        actor_label=event.actor_label,
        actor_user=event.actor_user_id,
        actor_agent=event.actor_agent_id,
        reason=event.reason,
        evidence=event.evidence,
        created_at=event.created_at,
    )


def attempt_answer_write(answer: Attempt, *, writes: Writes | None = None) -> None:
    """Write what the receiver said on an attempt (``answer`` carries the attempt's pk and the
    fields of ``actions.foundation.sql.ATTEMPT_ANSWER_FIELDS``): now, or with ``writes``."""
    if writes is not None:
        writes.answers.append(answer)
        return
    Attempt.objects.filter(pk=answer.pk).update(**{name: getattr(answer, name) for name in sql.ATTEMPT_ANSWER_FIELDS})


def attempt_write(attempt: Attempt, *, writes: Writes | None = None) -> Attempt:
    """Insert one attempt now, or with ``writes``."""
    if writes is not None:
        writes.attempts.append(attempt)
    else:
        attempt.save(force_insert=True)
    return attempt


def trail_columns(
    transition: str,
    from_state: str,
    to_state: str,
    actor: Actor,
    reason: str,
    evidence: dict[str, Any] | None,
    now: datetime | None,
) -> dict[str, Any]:
    """The columns every trail event has (``TrailEvent``: an action's or a workflow's): the move,
    who made it, why, on what evidence, and when."""
    return {
        "transition": transition,
        "from_state": from_state,
        "to_state": to_state,
        "actor_kind": actor.kind,
        "actor_user": actor.user if actor.kind == ActorKind.USER else None,
        "actor_agent": actor.agent,
        "actor_label": actor.label,
        "reason": reason,
        "evidence": evidence or {},
        "created_at": now or timezone.now(),
    }


def event_record(
    *,
    action: Action,
    transition: str,
    from_state: str,
    actor: Actor,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    now: datetime | None = None,
    to_state: str | None = None,
    writes: Writes | None = None,
) -> ActionEvent:
    """Append one audit event. Call it inside the transaction that made the change.

    ``to_state``: the state the event moved to, when the action is already past it (a proposal
    the policy approved before its INSERT is inserted AUTHORIZED; its "propose" event ends in
    PROPOSED). By default the action's status.

    A state change of an agent's action also writes the agent's webhook outbox row, in the same
    transaction (actions.foundation.outbox). With ``writes``, both are written by ``writes.write()``.
    """
    event = ActionEvent(
        action=action, **trail_columns(transition, from_state, to_state or action.status, actor, reason, evidence, now)
    )
    if writes is not None:
        writes.events.append(event)
        return event
    events_chain([event])
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
    writes: Writes | None = None,
    **kwargs: Any,
) -> ActionEvent:
    """Run one FSM transition, save it and write its audit event.

    Must run inside a transaction. The save is the conditional UPDATE of
    ConcurrentTransitionMixin (``WHERE status = <old>``): if another process moved the action
    first it raises ConcurrentTransition and the caller's transaction rolls back.

    ``writes``: the transition runs in memory only, and its event goes to ``writes``; the
    caller writes the action's row with its own compare-and-set (see ``Writes``).
    """
    now = now or timezone.now()
    from_state = action.status
    getattr(action, transition)(**kwargs)
    action.status_changed_at = now
    changed = action.changed_fields()
    if writes is not None:
        action.updated_at = now  # auto_now is applied by save(), not by the caller's UPDATE
    elif changed is None:
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
        writes=writes,
    )
    for listener in _state_change_listeners:
        listener(action, from_state)
    return event


# Who is told of each action's state change, inside its transaction, once its event is written:
# functions that layers above register (the workflows wake their coordinator this way), so that
# the trail, at the bottom, needs to know none of them.
StateChangeListener = Callable[[Action, str], None]
_state_change_listeners: list[StateChangeListener] = []


def state_change_listen(listener: StateChangeListener) -> StateChangeListener:
    """Register ``listener(action, from_state)``, called after every state change is recorded. It
    runs inside the change's transaction: it may publish on commit, never call out."""
    if listener not in _state_change_listeners:
        _state_change_listeners.append(listener)
    return listener


# The transition by which a person decides to send again to a receiver that can neither
# deduplicate nor be asked. Each such event allows one more effect at the receiver (the audits
# count them) and tells the kind to mark the repeat in what it sends.
RESEND_TRANSITION = "resolve_resend"


# --- reading the trail, live and archived ---------------------------------------------------------


def trail_events(
    *, order: tuple[str, ...] = ("created_at", "id"), select_related: tuple[str, ...] = (), **filters: Any
) -> list[AuditEvent]:
    """The audit events that match ``filters`` (ORM lookups), from the live trail and from its
    archive (the closed actions moved there after the hot window, actions.engine.retention),
    merged in ``order``. Every reader of whole trails (an action's page, its evidence bundle,
    the exports, the audits) reads through this, so that an archived action reads as before."""
    found: list[AuditEvent] = []
    with trail_snapshot():  # an archive batch committing between the two reads shows nowhere
        for model in (ActionEvent, ArchivedActionEvent):
            found.extend(model.objects.filter(**filters).select_related(*select_related).order_by(*order))
    found.sort(key=lambda event: tuple(_ordered(getattr(event, name)) for name in order))
    return found


def _ordered(value: Any) -> Any:
    # A sequence may be NULL on events older than the chain: those sort first, as the ORM does.
    return (0, 0) if value is None else (1, value)


def resend_decisions(action: Action) -> list[ActionEvent]:
    return list(ActionEvent.objects.filter(action=action, transition=RESEND_TRANSITION).order_by("created_at", "id"))
