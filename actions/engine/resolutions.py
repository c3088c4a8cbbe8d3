"""Finance's live lookups and resolutions of actions that need review, for every kind.

Every function checks permission itself (a view's check is a courtesy, this one is the rule),
refuses bad input before writing anything, and makes its change and its audit record in one
transaction. A call to the receiver never runs inside a transaction. Each resolution has one
skeleton (``_resolve``): ask the receiver (outside), then in one short transaction record the
lookup, check the action again, and apply the resolution's policy, which refuses when the
receiver's live answer contradicts the person (docs/architecture.md section 7: only the receiver's record
proves an effect). The lookup is kept even when the resolution is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_fsm import has_transition_perm

from actions import permissions as perms
from actions.engine.dispatch import submission_send_and_record
from actions.engine.leases import Lease, lease_take
from actions.engine.outcomes import outcome_book
from actions.engine.reconcile import receiver_lookup
from actions.engine.resolution_checks import (
    ReviewRefused,
    checked_expected_amount,
    checked_failure_choice,
    checked_reason,
    checked_reference,
    conflict_with_not_executed,
    conflict_with_succeeded,
    failed_timing_refusal,
    retry_timing_refusal,
    review_action,
    review_may_work,
    review_require,
    review_resolver_rule,
    review_stamp,
    review_text,
)
from actions.engine.send import receiver_for
from actions.foundation.trail import RESEND_TRANSITION, Actor, action_transition
from actions.kinds import kind_for
from actions.kinds.base import Lookup, LookupVerdict, Receiver, ReceiverContract
from actions.models import Action, ActionStatus, Attempt, AttemptKind
from actions.review.rules import retry_evidence_from_attempt

S = ActionStatus


@dataclass(frozen=True)
class LookupResult:
    action: Action
    attempt: Attempt
    lookup: Lookup


@dataclass(frozen=True)
class Resolution:
    """What a resolution did, and what the receiver said when it was checked."""

    action: Action
    message: str
    check: Attempt | None = None
    remedy: Any = None  # the follow-up the kind opened, if any
    outcome: str = ""


# --- the live lookup -----------------------------------------------------------------------------


def _ask_receiver(action: Action, receiver: Receiver) -> Lookup | None:
    """Ask the receiver about the action. Outside any transaction; None if it offers no lookup."""
    if not receiver.contract.supports_lookup:
        return None
    return receiver_lookup(action=action, receiver=receiver)


def _record_lookup(
    *, action: Action, lookup: Lookup | None, user: Any, purpose: str, started_at: datetime, now: datetime
) -> Attempt:
    """The lookup as an attempt row: every call to the receiver is on record. Call inside a transaction."""
    return Attempt.objects.create(
        action=action,
        kind=AttemptKind.LOOKUP,
        idempotency_key=action.idempotency_key,
        request={
            **kind_for(action.kind).lookup_request(action),
            "requested_by": user.get_username(),
            "purpose": purpose,
        },
        response=lookup.response_json() if lookup is not None else None,
        error=lookup.error_json()
        if lookup is not None
        else {"type": "NoLookup", "code": None, "message": "The receiver offers no lookup."},
        outcome=lookup.verdict if lookup is not None else "no_lookup",
        started_at=started_at,
        finished_at=now,
    )


def action_lookup(*, action_pk: int, user: Any, receiver: Receiver | None = None) -> LookupResult:
    """Ask the receiver now what it has for the action, and keep the answer as a lookup attempt.

    The call runs outside any transaction; the record is one short transaction after it.
    """
    review_require(user, perms.RESOLVE, "Only finance may look actions up at the receiver.")
    action = review_action(action_pk)
    review_may_work(user, kind=action.kind, owner=action.owner)
    if action.attempt_count == 0:
        raise ReviewRefused(
            f"{action.action_id} has never been sent: there is nothing to look up.",
            code="never_sent",
        )
    receiver = receiver or receiver_for(action)
    started_at = timezone.now()
    lookup = _ask_receiver(action, receiver)
    if lookup is None:
        raise ReviewRefused(
            f"The {receiver.contract.receiver} offers no lookup: only its own records can tell.", code="no_lookup"
        )
    with transaction.atomic(durable=True):
        attempt = _record_lookup(
            action=action, lookup=lookup, user=user, purpose="lookup", started_at=started_at, now=timezone.now()
        )
    return LookupResult(action=action, attempt=attempt, lookup=lookup)


# --- the skeleton ---------------------------------------------------------------------------------


def _check_resolvable(action: Action, user: Any, transition: str) -> None:
    if action.status != S.NEEDS_REVIEW:
        raise ReviewRefused(
            f"{action.action_id} is {action.get_status_display().lower()} now, not waiting for review. "
            "Reload the page to see what happened.",
            code="not_needs_review",
        )
    if not has_transition_perm(getattr(action, transition), user):
        raise ReviewRefused("Only finance may resolve an action that needs review.", code="not_allowed", status=403)
    review_may_work(user, kind=action.kind, owner=action.owner)


@dataclass(frozen=True)
class _Checked:
    """What the policy sees: the locked action, the lookup and its attempt row, the time."""

    action: Action
    lookup: Lookup | None
    check: Attempt
    contract: ReceiverContract
    now: datetime


# A policy returns why the receiver's answer forbids the resolution, or applies it and returns None.
_Policy = Callable[[_Checked], str | None]


# Why each resolution asked the receiver, as its lookup's attempt records it.
_LOOKUP_PURPOSES = {
    "resolve_succeeded": "check before resolving as succeeded",
    "resolve_failed": "check before resolving as failed",
    "resolve_retry": "check before retrying",
    RESEND_TRANSITION: "before sending again",
}


def _resolve(*, action_pk: int, user: Any, transition: str, receiver: Receiver | None, policy: _Policy) -> _Checked:
    """Ask the receiver, then record the lookup and apply ``policy`` (the resolution's
    ``transition``) in one transaction."""
    purpose = _LOOKUP_PURPOSES[transition]
    action = review_action(action_pk)
    _check_resolvable(action, user, transition)
    receiver = receiver or receiver_for(action)
    started_at = timezone.now()
    lookup = _ask_receiver(action, receiver)
    refusal: ReviewRefused | None = None
    with transaction.atomic(durable=True):
        now = timezone.now()
        action = review_action(action_pk, lock=True)
        check = _record_lookup(action=action, lookup=lookup, user=user, purpose=purpose, started_at=started_at, now=now)
        checked = _Checked(action=action, lookup=lookup, check=check, contract=receiver.contract, now=now)
        try:
            _check_resolvable(action, user, transition)
        except ReviewRefused as refused:
            refusal = refused
        else:
            conflict = policy(checked)
            if conflict is not None:
                refusal = ReviewRefused(conflict, code="provider_disagrees")
    # The lookup is kept even when the resolution is refused: it is what the receiver said.
    if refusal is not None:
        raise refusal
    return checked


def _evidence(checked: _Checked, **extra: Any) -> dict[str, Any]:
    return {**extra, "check_attempt_id": checked.check.pk, "provider_answer": checked.check.outcome}


# --- the three resolutions -------------------------------------------------------------------------


def action_resolve_succeeded(
    *,
    action_pk: int,
    user: Any,
    provider_reference: object,
    reason: object,
    evidence: object = "",
    receiver: Receiver | None = None,
) -> Resolution:
    """NEEDS_REVIEW -> SUCCEEDED: the receiver confirms the effect under ``provider_reference``.

    The kind books it on its target in the same transaction, as when the worker records a
    success (invariant 5). Where the receiver issues no reference of its own, the kind's
    (``EffectKind.default_reference``) is used; where it cannot be asked at all, the kind may require the
    person's written evidence (the recipient's reply, the receiver's log line), kept on the event.
    """
    action = _resolvable_by(user, action_pk)
    kind = kind_for(action.kind)
    noun = kind.explanations.noun
    default = kind.default_reference(action)
    reference = checked_reference(provider_reference if str(provider_reference or "").strip() else default, noun)
    reason_text = checked_reason(reason)
    evidence_text = review_text(
        evidence,
        name="evidence",
        required=kind.confirmation_needs_evidence,
        label=f"Quote the evidence that the {noun} arrived (a reply, a relay's log line).",
    )

    def confirm(checked: _Checked) -> str | None:
        conflict = conflict_with_succeeded(checked.action, checked.lookup, reference)
        if conflict is not None:
            return conflict
        action_transition(
            action=checked.action,
            transition="resolve_succeeded",
            actor=Actor.for_user(user),
            reason=reason_text,
            evidence=_evidence(
                checked,
                resolution="succeeded",
                provider_reference=reference,
                **({"evidence": evidence_text} if evidence_text else {}),
            ),
            now=checked.now,
            provider_reference=reference,
        )
        outcome_book(checked.action)
        return None

    checked = _resolve(
        action_pk=action_pk, user=user, transition="resolve_succeeded", receiver=receiver, policy=confirm
    )
    action = checked.action
    return Resolution(
        action=action,
        check=checked.check,
        outcome=action.status,
        message=f"{action.action_id} is recorded as succeeded with the {checked.contract.receiver}'s {noun} "
        f"{reference}; {action.amount} {action.currency} is booked on {kind_for(action.kind).target_label(action)}.",
    )


def _resolvable_by(user: Any, action_pk: int) -> Action:
    """The action a resolution names, once ``user`` may resolve actions at all and this one (its
    kind and owner): the checks every resolution starts with."""
    review_require(user, perms.RESOLVE, "Only finance may resolve an action that needs review.")
    action = review_action(action_pk)
    review_resolver_rule(user, kind=action.kind, owner=action.owner)
    return action


def action_resolve_failed(
    *,
    action_pk: int,
    user: Any,
    reason: object,
    remedy_kind: object = "",
    expected_amount: object = None,
    receiver: Receiver | None = None,
) -> Resolution:
    """NEEDS_REVIEW -> FAILED_FINAL: the receiver has no effect, and none will come.

    The reservation is released and the kind opens the chosen follow-up (with what the person
    affected still expects, owned by the person who resolved it).
    """
    action = _resolvable_by(user, action_pk)
    reason_text = checked_reason(reason)
    choice = checked_failure_choice(remedy_kind, action)
    _check_resolvable(action, user, "resolve_failed")
    amount = checked_expected_amount(expected_amount, action)
    followups: list[Any] = []

    def fail(checked: _Checked) -> str | None:
        conflict = conflict_with_not_executed(checked.action, checked.lookup, retry=False)
        if conflict is None and checked.lookup is not None and checked.lookup.verdict == LookupVerdict.NOT_FOUND:
            conflict = failed_timing_refusal(checked.action, checked.contract, checked.now)
        if conflict is not None:
            return conflict
        action_transition(
            action=checked.action,
            transition="resolve_failed",
            actor=Actor.for_user(user),
            reason=reason_text,
            evidence=_evidence(checked, resolution="failed_final", remedy_kind=choice, expected_amount=str(amount)),
            now=checked.now,
        )
        kind = kind_for(checked.action.kind)
        kind.release(checked.action)
        label = dict(kind.failure_choices).get(choice, choice)
        followups.append(
            kind.failure_resolved(
                checked.action,
                owner=user,
                choice=choice,
                amount=amount,
                note=review_stamp(checked.now, user, f"opened as {label.lower()}", reason_text),
            )
        )
        return None

    checked = _resolve(action_pk=action_pk, user=user, transition="resolve_failed", receiver=receiver, policy=fail)
    action = checked.action
    remedy = followups[0] if followups else None
    followup = (
        f" and a remedy ({remedy.get_kind_display().lower()}, {amount} {action.currency}) is open for "
        f"{user.get_username()}"
        if remedy is not None
        else ""
    )
    return Resolution(
        action=action,
        check=checked.check,
        remedy=remedy,
        outcome=action.status,
        message=f"{action.action_id} is recorded as failed for good; the reservation is released{followup}.",
    )


def action_resolve_retry(*, action_pk: int, user: Any, reason: object, receiver: Receiver | None = None) -> Resolution:
    """NEEDS_REVIEW -> SUBMITTING with the same key and a new lease, then send once more.

    Allowed only when a lookup from the last few minutes (REVIEW_RETRY_LOOKUP_MAX_AGE_SECONDS)
    said not found and the receiver still says so now (invariant 7: no retry without evidence).
    The send happens after the commit, outside any transaction, by the lease holder (invariant 3).
    """
    action = _resolvable_by(user, action_pk)
    reason_text = checked_reason(reason)
    _check_resolvable(action, user, "resolve_retry")
    latest = (
        Attempt.objects.filter(action_id=action.pk, kind=AttemptKind.LOOKUP, finished_at__isnull=False)
        .order_by("-finished_at", "-pk")
        .first()
    )
    allowed, why = retry_evidence_from_attempt(latest, now=timezone.now())
    if not allowed:
        raise ReviewRefused(why, code="no_recent_not_found")
    leases: list[Lease] = []

    def retry(checked: _Checked) -> str | None:
        conflict = conflict_with_not_executed(checked.action, checked.lookup, retry=True) or retry_timing_refusal(
            checked.action, checked.contract, checked.now
        )
        if conflict is not None:
            return conflict
        leases.append(
            lease_take(
                action=checked.action,
                transition="resolve_retry",
                actor=Actor.for_user(user),
                reason=reason_text,
                evidence=_evidence(
                    checked,
                    resolution="retry",
                    idempotency_key=checked.action.idempotency_key,
                    evidence_attempt_id=latest.pk if latest else None,
                ),
                now=checked.now,
            )
        )
        return None

    receiver = receiver or receiver_for(action)
    checked = _resolve(action_pk=action_pk, user=user, transition="resolve_retry", receiver=receiver, policy=retry)
    # Committed: the SUBMITTING row and its attempt exist before the receiver hears of it.
    return _send_leased(
        checked,
        leases[0],
        receiver,
        lambda action: f"{action.action_id} was sent again with the same key {action.idempotency_key}. ",
    )


def action_resolve_resend(*, action_pk: int, user: Any, reason: object, receiver: Receiver | None = None) -> Resolution:
    """NEEDS_REVIEW -> SUBMITTING for a receiver that can neither deduplicate nor be asked, then
    send once more: a person's explicit new decision (invariant 16).

    Nothing can prove the first send did not arrive, so the decision is recorded as accepting
    that a duplicate may reach the receiver; the kind marks what it sends as a possible repeat,
    and the audits allow one more effect per such decision. Refused for a receiver that has keys
    or a lookup: there, "retry with the same key" asks it first.
    """
    action = _resolvable_by(user, action_pk)
    reason_text = checked_reason(reason)
    _check_resolvable(action, user, RESEND_TRANSITION)
    receiver = receiver or receiver_for(action)
    if receiver.contract.can_be_asked:
        raise ReviewRefused(
            f"The {receiver.contract.receiver} can be asked: look it up and retry with the same key instead.",
            code="receiver_can_be_asked",
        )
    leases: list[Lease] = []

    def resend(checked: _Checked) -> str | None:
        leases.append(
            lease_take(
                action=checked.action,
                transition=RESEND_TRANSITION,
                actor=Actor.for_user(user),
                reason=f"Send again, knowing a duplicate may reach the {checked.contract.receiver}: {reason_text}",
                evidence=_evidence(
                    checked,
                    resolution="resend",
                    possible_duplicate=True,
                    earlier_attempts=checked.action.attempt_count,
                ),
                now=checked.now,
            )
        )
        return None

    checked = _resolve(action_pk=action_pk, user=user, transition=RESEND_TRANSITION, receiver=receiver, policy=resend)
    # Committed: the decision, the SUBMITTING row and its attempt exist before the send.
    return _send_leased(
        checked, leases[0], receiver, lambda action: f"{action.action_id} was sent again, marked as a possible repeat. "
    )


def _send_leased(checked: _Checked, lease: Lease, receiver: Receiver, said: Callable[[Action], str]) -> Resolution:
    """Send the leased action once, record what the receiver answered and say what happened:
    ``said`` names the send, the action's status now follows."""
    outcome = submission_send_and_record(
        action=lease.action, attempt=lease.attempt, lease_token=lease.token, receiver=receiver
    )
    action = checked.action
    action.refresh_from_db()
    return Resolution(
        action=action,
        check=checked.check,
        outcome=outcome,
        message=f"{said(action)}It is {action.get_status_display().lower()} now.",
    )


def action_escalate_to_user(*, action_pk: int, user: Any, reason: object = "") -> Action:
    """UNKNOWN -> NEEDS_REVIEW now, owned by ``user``, instead of waiting for the escalation policy.

    Reconciliation stops polling; a reconciler that is mid-lookup loses its lease and records
    only its attempt.
    """
    review_require(user, perms.RESOLVE, "Only finance may take an action over for review.")
    note = review_text(reason, name="reason", required=False, label="")
    now = timezone.now()
    with transaction.atomic(durable=True):
        action = review_action(action_pk, lock=True)
        if action.status != S.UNKNOWN:
            raise ReviewRefused(
                f"{action.action_id} is {action.get_status_display().lower()}, not unknown: only an unknown action "
                "can be taken over before the escalation policy hands it on.",
                code="not_unknown",
            )
        review_may_work(user, kind=action.kind, owner=action.owner)
        due_at = now + timedelta(hours=settings.REVIEW_DUE_HOURS)
        action_transition(
            action=action,
            transition="escalate",
            actor=Actor.for_user(user),
            reason=f"Taken over by {user.get_username()} from the review queue"
            + (f": {note}" if note else " before the escalation policy's limit."),
            evidence={"owner": user.get_username(), "due_at": due_at.isoformat(), "source": "review queue"},
            now=now,
            owner=user,
            due_at=due_at,
        )
    return action
