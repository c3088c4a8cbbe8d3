"""Decisions on proposals, and the atomic reservation that starts a submission.

An approval is permission for one exact action against one exact state of the order. The
reservation (``submission_begin``) re-checks that binding inside the same transaction that
reserves the money and moves the action to SUBMITTING, so nobody and nothing re-interprets an
approval against new data (DESIGN.md section 5).
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django_fsm import ConcurrentTransition, has_transition_perm

from actions.execution import submission_request_body
from actions.models import Action, ActionKind, ActionStatus, Attempt, AttemptKind, Order
from actions.services import Actor, action_transition
from approvals.models import Approval, ApprovalLimit, ApprovalPolicy, Decision

S = ActionStatus


class DecisionRefused(Exception):
    """A decision the rules do not allow. The message is shown to the person as it is."""

    def __init__(self, message: str, *, code: str, status: int = 403) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


# --- who may decide ------------------------------------------------------------------------


def approval_limit_for(*, user: Any, currency: str) -> Decimal | None:
    limit = ApprovalLimit.objects.filter(user=user, currency=currency).values_list("max_amount", flat=True).first()
    return limit


def approval_refusal_reason(*, action: Action, user: Any, limit: Decimal | None) -> tuple[str, str] | None:
    """Why ``user`` may not approve ``action``, as (code, message), or None if they may.

    The inbox uses this to grey out buttons; ``approval_decide`` uses it to refuse. One
    function, so the page and the rule cannot disagree.
    """
    if not has_transition_perm(action.approve, user):
        if action.status != S.PROPOSED:
            return ("not_waiting", f"This action is {action.get_status_display().lower()}, not waiting for a decision.")
        return ("not_a_manager", "Only managers may approve or reject proposals.")
    if action.proposed_by_user_id is not None and action.proposed_by_user_id == user.pk:
        return ("four_eyes", "You proposed this action (or own the agent that did): someone else must approve it.")
    if limit is None:
        return ("no_limit", f"You have no approval limit in {action.currency}.")
    if action.amount > limit:
        return (
            "over_limit",
            f"{action.amount} {action.currency} is above your approval limit of {limit} {action.currency}.",
        )
    order = action.order
    if order is not None and action.kind == ActionKind.REFUND and action.amount > order.refundable_amount:
        # Approving would only produce a STALE action at reservation: say so now.
        return (
            "over_refundable_balance",
            f"Order {order.number} has only {order.refundable_amount} {order.currency} left to refund.",
        )
    return None


# --- decisions -----------------------------------------------------------------------------


def _binding(action: Action, order: Order) -> dict[str, Any]:
    return {
        "order_version": order.version,
        "amount": action.amount,
        "currency": action.currency,
        "payload_hash": action.payload_hash,
    }


def _record_approval(
    *,
    action: Action,
    order: Order,
    approver: Any,
    label: str,
    policy: str,
    policy_detail: dict[str, Any],
    note: str,
    now: datetime,
    actor: Actor,
) -> Approval:
    expires_at = now + timedelta(seconds=settings.APPROVAL_TTL_SECONDS)
    approval = Approval.objects.create(
        action=action,
        approver=approver,
        decided_by_label=label,
        policy=policy,
        policy_detail=policy_detail,
        decision=Decision.APPROVE,
        note=note,
        decided_at=now,
        expires_at=expires_at,
        **_binding(action, order),
    )
    action_transition(
        action=action,
        transition="approve",
        actor=actor,
        reason=note or "Approved.",
        evidence={
            "approval_id": approval.pk,
            "policy": policy,
            "binding": {
                "order_version": order.version,
                "amount": str(action.amount),
                "currency": action.currency,
                "payload_hash": action.payload_hash,
            },
            "expires_at": expires_at.isoformat(),
        },
        now=now,
    )
    _enqueue_dispatch_on_commit(action.pk)
    return approval


def _enqueue_dispatch_on_commit(action_pk: int) -> None:
    # The task is only published once the authorization is committed; a publish lost between
    # commit and broker is picked up by the AUTHORIZED sweep.
    def publish() -> None:
        from actions.tasks import dispatch_enqueue

        dispatch_enqueue(action_pk)

    transaction.on_commit(publish)


def approval_apply_auto_policy(*, action: Action, order: Order, now: datetime) -> Approval | None:
    """Approve by policy when the amount is at or below the currency's threshold.

    Runs inside the proposal's transaction, so intent and authorization are one commit.
    """
    threshold = settings.AUTO_APPROVAL_THRESHOLDS.get(action.currency)
    if not settings.AUTO_APPROVAL_ENABLED or threshold is None or action.amount > threshold:
        return None
    if action.amount > order.refundable_amount:
        return None  # a manager must look: the order no longer covers it
    label = f"policy:auto-approval (<= {threshold} {action.currency})"
    return _record_approval(
        action=action,
        order=order,
        approver=None,
        label=label,
        policy=ApprovalPolicy.AUTO,
        policy_detail={"threshold": str(threshold), "currency": action.currency},
        note=f"Auto-approved: {action.amount} {action.currency} is at or below {threshold} {action.currency}.",
        now=now,
        actor=Actor.system("auto-approval"),
    )


def approval_decide(
    *, action_pk: int, user: Any, decision: str, note: str = "", now: datetime | None = None
) -> Approval:
    """A manager approves or rejects a proposal. Raises DecisionRefused with a clear message."""
    now = now or timezone.now()
    if decision not in Decision.values:
        raise DecisionRefused(f"Unknown decision {decision!r}.", code="invalid_decision", status=400)
    with transaction.atomic(durable=True):
        # Locked so that two managers deciding at once are serialised: the second one sees
        # the first one's decision and is refused cleanly.
        action = Action.objects.select_for_update(of=("self",)).select_related("order").get(pk=action_pk)
        if action.status != S.PROPOSED:
            raise DecisionRefused(
                f"{action.action_id} is {action.get_status_display().lower()} now, no longer waiting for a decision. "
                "Nothing was changed.",
                code="not_waiting",
                status=409,
            )
        order = Order.objects.get(pk=action.order_id)
        actor = Actor.for_user(user)
        if decision == Decision.APPROVE:
            refusal = approval_refusal_reason(
                action=action, user=user, limit=approval_limit_for(user=user, currency=action.currency)
            )
            if refusal is not None:
                raise DecisionRefused(refusal[1], code=refusal[0])
            return _record_approval(
                action=action,
                order=order,
                approver=user,
                label=user.get_username(),
                policy=ApprovalPolicy.MANAGER,
                policy_detail={},
                note=note,
                now=now,
                actor=actor,
            )
        if not has_transition_perm(action.reject, user):
            raise DecisionRefused("Only managers may approve or reject proposals.", code="not_a_manager")
        approval = Approval.objects.create(
            action=action,
            approver=user,
            decided_by_label=user.get_username(),
            policy=ApprovalPolicy.MANAGER,
            decision=Decision.REJECT,
            note=note,
            decided_at=now,
            **_binding(action, order),
        )
        action_transition(
            action=action,
            transition="reject",
            actor=actor,
            reason=note or "Rejected by a manager.",
            evidence={"approval_id": approval.pk},
            now=now,
            note=note or "Rejected by a manager.",
        )
        return approval


def action_reopen(*, action_pk: int, user: Any, note: str = "") -> Action:
    """STALE -> PROPOSED: ask for a new decision on the same, unchanged action."""
    with transaction.atomic(durable=True):
        action = Action.objects.select_for_update().get(pk=action_pk)
        if action.status != S.STALE:
            raise DecisionRefused(
                f"{action.action_id} is {action.get_status_display().lower()}, not stale.", code="not_stale", status=409
            )
        if not has_transition_perm(action.reopen, user):
            raise DecisionRefused("Only managers may ask for a new decision.", code="not_a_manager")
        action_transition(
            action=action,
            transition="reopen",
            actor=Actor.for_user(user),
            reason=note or "A new decision was requested.",
        )
    return action


# --- the atomic reservation ----------------------------------------------------------------


class ClaimOutcome(enum.Enum):
    CLAIMED = "claimed"
    TAKEN = "taken"  # someone else got there first; nothing changed
    STALE = "stale"  # the world changed; the action went to STALE in its own transaction


@dataclass
class Claim:
    outcome: ClaimOutcome
    action: Action | None = None
    attempt: Attempt | None = None
    lease_token: uuid.UUID | None = None
    failures: list[dict[str, str]] = field(default_factory=list)


class _BindingFailed(Exception):
    def __init__(self, failures: list[dict[str, str]]) -> None:
        self.failures = failures


def latest_approval(action: Action) -> Approval | None:
    # The newest row is the one in force; pk order is insertion order, immune to clock skew.
    return Approval.objects.filter(action=action, decision=Decision.APPROVE).order_by("-pk").first()


def _binding_failures(action: Action, approval: Approval | None, now: datetime) -> list[dict[str, str]]:
    if approval is None:
        return [{"binding": "approval", "message": "There is no approval for this action."}]
    failures = []
    if approval.expires_at is None or approval.expires_at <= now:
        expired_at = f"{approval.expires_at:%Y-%m-%d %H:%M:%S}" if approval.expires_at else "(no expiry recorded)"
        failures.append({"binding": "expiry", "message": f"The approval expired at {expired_at}."})
    for name in ("amount", "currency", "payload_hash"):
        approved, current = getattr(approval, name), getattr(action, name)
        if approved != current:
            failures.append({"binding": name, "message": f"Approved {name} {approved} differs from {current}."})
    return failures


def submission_begin(
    *, action_pk: int, now: datetime | None = None, actor: Actor | None = None, skip_locked: bool = False
) -> Claim:
    """Reserve the amount and move AUTHORIZED -> SUBMITTING in one transaction.

    1. A conditional UPDATE reserves the amount on the order only if the order is still at the
       approved version and the refundable balance covers it, and bumps the version.
    2. The action's conditional UPDATE (ConcurrentTransitionMixin: WHERE status='AUTHORIZED')
       moves it to SUBMITTING with a fresh lease.
    The attempt row (the request the worker is about to send) is written in the same commit.
    Either UPDATE changing no row rolls everything back.

    ``skip_locked``: the sweep's claim. A row another worker has locked is skipped (TAKEN)
    instead of waited for.
    """
    now = now or timezone.now()
    actor = actor or Actor.system("dispatcher")
    try:
        with transaction.atomic(durable=True):
            # The row lock serialises claimers: a second worker waits here, then sees
            # SUBMITTING and leaves without touching the order.
            action = Action.objects.select_for_update(skip_locked=skip_locked).filter(pk=action_pk).first()
            if action is None or action.status != S.AUTHORIZED:
                return Claim(outcome=ClaimOutcome.TAKEN, action=action)
            approval = latest_approval(action)
            failures = _binding_failures(action, approval, now)
            if failures:
                raise _BindingFailed(failures)
            assert approval is not None
            reserved = Order.objects.filter(
                pk=action.order_id,
                version=approval.order_version,
                captured_amount__gte=F("refunded_amount") + F("reserved_amount") + action.amount,
            ).update(reserved_amount=F("reserved_amount") + action.amount, version=F("version") + 1)
            if reserved == 0:
                order = Order.objects.get(pk=action.order_id)
                if order.version != approval.order_version:
                    raise _BindingFailed(
                        [
                            {
                                "binding": "order_version",
                                "message": f"The order changed since the approval (approved at version "
                                f"{approval.order_version}, now {order.version}).",
                            }
                        ]
                    )
                raise _BindingFailed(
                    [
                        {
                            "binding": "balance",
                            "message": f"The refundable balance {order.refundable_amount} {order.currency} "
                            f"no longer covers {action.amount}.",
                        }
                    ]
                )
            lease_token = uuid.uuid4()
            lease_expires_at = now + timedelta(seconds=settings.LEASE_SECONDS)
            action_transition(
                action=action,
                transition="begin_submission",
                actor=actor,
                reason="Amount reserved; submitting to the receiver.",
                evidence={
                    "approval_id": approval.pk,
                    "order_version": approval.order_version,
                    "lease_expires_at": lease_expires_at.isoformat(),
                    "attempt": action.attempt_count + 1,
                },
                now=now,
                lease_token=lease_token,
                lease_expires_at=lease_expires_at,
                started_at=now,
            )
            attempt = Attempt.objects.create(
                action=action,
                kind=AttemptKind.SUBMIT,
                lease_token=lease_token,
                idempotency_key=action.idempotency_key,
                request=submission_request_body(action),
                started_at=now,
            )
            return Claim(outcome=ClaimOutcome.CLAIMED, action=action, attempt=attempt, lease_token=lease_token)
    except ConcurrentTransition:
        return Claim(outcome=ClaimOutcome.TAKEN)
    except _BindingFailed as stale:
        return _invalidate(action_pk=action_pk, failures=stale.failures, actor=actor, now=now)


def _invalidate(*, action_pk: int, failures: list[dict[str, str]], actor: Actor, now: datetime) -> Claim:
    with transaction.atomic(durable=True):
        action = Action.objects.select_for_update().get(pk=action_pk)
        if action.status != S.AUTHORIZED:
            return Claim(outcome=ClaimOutcome.TAKEN, action=action)
        action_transition(
            action=action,
            transition="invalidate",
            actor=actor,
            reason="The approval no longer holds: " + " ".join(f["message"] for f in failures),
            evidence={"failed_bindings": failures},
            now=now,
        )
    approval_redecide_by_policy(action_pk=action_pk, now=now)
    return Claim(outcome=ClaimOutcome.STALE, action=action, failures=failures)


def approval_redecide_by_policy(*, action_pk: int, now: datetime | None = None) -> Approval | None:
    """A STALE action that the auto-approval policy approved gets a new decision by that policy.

    The old approval is not re-interpreted: the policy decides again, from scratch, against
    the order as it is now (STALE -> PROPOSED -> AUTHORIZED, each step audited, with a new
    approval bound to the new version). Where the policy no longer applies (the amount is over
    the threshold or the balance), the action waits in PROPOSED for a manager. Actions a
    manager approved stay STALE until a manager asks for a new decision.
    """
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        action = Action.objects.select_for_update().get(pk=action_pk)
        approval = latest_approval(action)
        if action.status != S.STALE or approval is None or approval.policy != ApprovalPolicy.AUTO:
            return None
        action_transition(
            action=action,
            transition="reopen",
            actor=Actor.system("auto-approval"),
            reason="The order changed since the policy approved this action: the policy decides again.",
            now=now,
        )
        order = Order.objects.get(pk=action.order_id)
        return approval_apply_auto_policy(action=action, order=order, now=now)
