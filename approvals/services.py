"""A manager's decisions on proposals: approve, reject, ask again.

An approval is permission for one exact action against one exact state of its target. The
engine's claim (``actions.engine.claim.submission_begin``) re-checks that binding inside the
transaction that reserves and moves the action to SUBMITTING (DESIGN.md section 5).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone
from django_fsm import has_transition_perm

from actions.kinds import kind_for
from actions.models import Action, ActionStatus
from actions.refusals import Refused
from actions.trail import Actor, action_transition
from approvals.four_eyes import four_eyes_refusal
from approvals.models import Approval, ApprovalLimit, ApprovalPolicy, Decision
from approvals.policy import approval_binding, approval_record

S = ActionStatus


class DecisionRefused(Refused):
    """A decision the rules do not allow (a manager's approve, reject, ask again)."""

    default_status = 403


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
    four_eyes = four_eyes_refusal(action=action, user=user)
    if four_eyes is not None:
        return ("four_eyes", four_eyes)
    if limit is None:
        return ("no_limit", f"You have no approval limit in {action.currency}.")
    if action.amount > limit:
        return (
            "over_limit",
            f"{action.amount} {action.currency} is above your approval limit of {limit} {action.currency}.",
        )
    # The kind's target may not cover it any more (a refund's order balance): approving would
    # only produce a STALE action at the claim, so say so now.
    return kind_for(action.kind).approval_refusal(action)


# --- decisions -----------------------------------------------------------------------------


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
        actor = Actor.for_user(user)
        if decision == Decision.APPROVE:
            refusal = approval_refusal_reason(
                action=action, user=user, limit=approval_limit_for(user=user, currency=action.currency)
            )
            if refusal is not None:
                raise DecisionRefused(refusal[1], code=refusal[0])
            return approval_record(
                action=action,
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
            **approval_binding(action),
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
