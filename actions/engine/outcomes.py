"""What each receiver's answer does to an action, decided in one place for every kind.

What an answer means is the kind's answer table (actions.kinds); which transition it proves,
when the receiver is asked again, and what a final outcome books on the target are here
(docs/architecture.md section 6). The record of a send, the reconciler and the resolutions
all apply answers through ``outcome_transition`` and ``outcome_book``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from actions.engine.escalation import action_escalate
from actions.engine.throttle import throttle_pause
from actions.foundation.trail import Actor, Writes, action_transition
from actions.kinds import kind_for
from actions.kinds.base import Answer, Outcome, ReceiverContract
from actions.models import Action, ActionStatus

S = ActionStatus


def next_reconcile_time(*, action: Action, now: datetime, contract: ReceiverContract | None = None) -> datetime:
    """When to ask the receiver next: after its lookup visibility delay, with backoff and jitter."""
    contract = contract or kind_for(action.kind).contract()
    base = settings.RECONCILE_BASE_BACKOFF_SECONDS * (2 ** min(action.reconcile_failures, 6))
    jitter = random.uniform(0, base * 0.25)
    delay = max(contract.lookup_visibility_delay.total_seconds(), 0) + base + jitter
    return now + timedelta(seconds=delay)


def not_before_retry_after(*, action: Action, error: Exception | None, due: datetime, now: datetime) -> datetime:
    """A receiver that answered 429 with Retry-After is not asked again about this action before
    then; with rate limits configured, its bucket is paused too, so no new dispatch to it starts
    before then either, nor any reconciliation lookup (actions.engine.throttle)."""
    retry_after = getattr(error, "retry_after", None)
    if not retry_after:
        return due
    throttle_pause(kind_for(action.kind).contract().receiver, retry_after)
    return max(due, now + timedelta(seconds=retry_after))


def settle_poll_time(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.RECONCILE_BASE_BACKOFF_SECONDS)


def outcome_book(action: Action, *, from_status: str | None = None) -> None:
    """Book a final outcome on the action's target and open its follow-ups (same transaction).

    ``from_status``: the status the outcome moved the action from. Back to AUTHORIZED from
    SUBMITTING (nothing was sent), the reservation is released: the next claim reserves anew.
    """
    kind = kind_for(action.kind)
    if action.status == S.SUCCEEDED:
        kind.book_success(action)
        kind.on_success(action)
    elif action.status == S.FAILED_FINAL:
        kind.release(action)
        kind.on_failure(action)
    elif action.status == S.AUTHORIZED and from_status == S.SUBMITTING:
        kind.release(action)


def apply_outcome(
    *,
    action: Action,
    answer: Answer,
    actor: Actor,
    now: datetime,
    source: str,
    evidence: dict[str, Any] | None = None,
) -> str:
    """Move a SUBMITTING, UNKNOWN or SETTLING action to the state the answer proves.

    Runs inside the caller's transaction, with the action row locked, and books the target's
    money and any follow-up in that same transaction.
    """
    from_status = action.status
    status = outcome_transition(action=action, answer=answer, actor=actor, now=now, source=source, evidence=evidence)
    outcome_book(action, from_status=from_status)
    return status


def outcome_transition(
    *,
    action: Action,
    answer: Answer,
    actor: Actor,
    now: datetime,
    source: str,
    evidence: dict[str, Any] | None = None,
    writes: Writes | None = None,
) -> str:
    """The transitions of ``apply_outcome``, without the booking: the caller books
    (``outcome_book``) once the action's row is written.

    ``writes``: a record's (of a SUBMITTING action), which writes the action's row (its lease
    fence), the events and the answers at its end (actions.foundation.trail.Writes).

    The answers every status treats alike (a person is needed, nothing was sent) are decided
    here; the others by the status the answer finds the action in: a send's record
    (``_from_submitting``), reconciliation (``_from_unknown``) or the settlement poll
    (``_from_settling``).
    """
    evidence = {"answer": answer.summary(), "source": source, **(evidence or {})}
    outcome = answer.outcome
    status = action.status

    if writes is not None and status != S.SUBMITTING:
        raise ValueError("only the record of a send writes its transitions with the record's rows")
    if outcome == Outcome.UNKNOWN and status != S.SUBMITTING:
        raise ValueError("an inconclusive answer for an action that is not submitting belongs to the reconciler")
    if outcome == Outcome.NEEDS_REVIEW:
        action_escalate(
            action=action,
            actor=actor,
            now=now,
            reason=f"Needs a person: {answer.summary()}.",
            evidence=evidence,
            writes=writes,
        )
        return action.status

    applying = _Applying(action=action, answer=answer, actor=actor, now=now, evidence=evidence, writes=writes)
    if outcome == Outcome.NOT_SENT:
        if status != S.SUBMITTING:
            raise ValueError("only a send can prove that nothing was sent")
        return _not_sent(applying)

    if status == S.SUBMITTING:
        _from_submitting(applying)
    elif status == S.UNKNOWN:
        _from_unknown(applying)
    elif status == S.SETTLING:
        if outcome == Outcome.PENDING:
            return status  # still pending: the settlement poller keeps asking
        _transition(
            applying,
            "settle",
            reason=f"The receiver settled it: {answer.summary()}.",
            succeeded=outcome == Outcome.SUCCEEDED,
        )
    else:
        raise ValueError(f"cannot apply a receiver's answer to an action in {status}")
    return action.status


@dataclass(frozen=True)
class _Applying:
    """An answer being applied to an action: by whom, when, on what evidence, and (for the record
    of a send) the record's ``writes``."""

    action: Action
    answer: Answer
    actor: Actor
    now: datetime
    evidence: dict[str, Any]
    writes: Writes | None


# A send's answer that says what happened: its transition and the kind's words for it
# (Explanations' attribute); anything else is unknown.
_RECORDED = {
    Outcome.SUCCEEDED: ("record_success", "succeeded"),
    Outcome.PENDING: ("record_pending", "pending"),
    Outcome.FAILED_FINAL: ("record_failure", "failed"),
}


def _from_submitting(applying: _Applying) -> None:
    """A send's answer (succeeded, pending, failed or unknown), recorded by the lease holder.

    Without ``writes``, a pending answer's next poll is saved here; with it, the record writes
    it with the transition.
    """
    action, answer, now, writes = applying.action, applying.answer, applying.now, applying.writes
    words = kind_for(action.kind).explanations
    outcome = answer.outcome
    if outcome in _RECORDED:
        transition, said = _RECORDED[outcome]
        reason: str = getattr(words, said)
        if outcome == Outcome.FAILED_FINAL:
            reason = f"{reason}: {answer.summary()}."
        _transition(applying, transition, reason=reason, provider_reference=answer.reference)
        if outcome == Outcome.PENDING:
            action.next_reconcile_at = settle_poll_time(now)
            if writes is None:  # otherwise written with the transition, by the record
                action.save(update_fields=["next_reconcile_at"])
    else:
        _transition(
            applying,
            "mark_unknown",
            reason=f"The outcome is unknown ({answer.summary()}); reconciliation will ask the receiver.",
            next_reconcile_at=not_before_retry_after(
                action=action, error=answer.error, due=next_reconcile_time(action=action, now=now), now=now
            ),
        )


def _from_unknown(applying: _Applying) -> None:
    """Reconciliation found the receiver's record of an UNKNOWN action: it moves to what the
    record proves, and a pending one is polled until it settles."""
    action, answer = applying.action, applying.answer
    target = {Outcome.SUCCEEDED: S.SUCCEEDED, Outcome.PENDING: S.SETTLING, Outcome.FAILED_FINAL: S.FAILED_FINAL}
    _transition(
        applying,
        "reconcile_found",
        reason=f"Reconciliation found the receiver's record: {answer.summary()}.",
        outcome=target[answer.outcome],
        provider_reference=answer.reference,
    )
    if action.status == S.SETTLING:
        action.next_reconcile_at = settle_poll_time(applying.now)
        action.save(update_fields=["next_reconcile_at"])


def _not_sent(applying: _Applying) -> str:
    """The receiver proved it was never handed the request: back to AUTHORIZED for another send.

    Not a retry from UNKNOWN and not a re-send (invariants 7 and 16): the receiver has nothing,
    so the next send is the first it sees. The approval still holds and the next claim checks
    it again (expiry, binding); whatever the claim reserved is released, because that claim
    reserves it anew. The sweep of AUTHORIZED rows picks it up after its grace period, which
    spaces the sends out. A receiver that keeps refusing goes to a named person instead of
    being asked for ever (invariant 8). The release is ``outcome_book``'s.
    """
    action, answer = applying.action, applying.answer
    if action.attempt_count >= settings.NOT_SENT_MAX_ATTEMPTS:
        action_escalate(
            action=action,
            actor=applying.actor,
            now=applying.now,
            reason=f"The {kind_for(action.kind).contract().receiver} refused it {action.attempt_count} times without "
            f"taking it ({answer.summary()}); nothing was sent. A person decides whether to send it again.",
            evidence=applying.evidence,
            writes=applying.writes,
        )
        return action.status
    _transition(
        applying,
        "record_not_sent",
        reason=f"Nothing was sent ({answer.summary()}): the receiver refused before taking it. "
        "It will be sent again under the same approval.",
    )
    return action.status


def _transition(applying: _Applying, transition: str, *, reason: str, **kwargs: Any) -> None:
    """The answer's transition of the action, by the applying actor on its evidence (with the
    record's ``writes``, if any); ``kwargs`` go to the transition."""
    action_transition(
        action=applying.action,
        transition=transition,
        actor=applying.actor,
        reason=reason,
        evidence=applying.evidence,
        now=applying.now,
        writes=applying.writes,
        **kwargs,
    )
