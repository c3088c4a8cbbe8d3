"""A manager's decisions on proposals: approve, reject, ask again.

An approval is permission for one exact action against one exact state of its target. The
engine's claim (``actions.engine.claim.submission_begin``) re-checks that binding inside the
transaction that reserves and moves the action to SUBMITTING (docs/architecture.md section 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_fsm import has_transition_perm

from actions.foundation import publish
from actions.foundation.clock import database_clock_now
from actions.foundation.refusals import Refused
from actions.foundation.trail import Actor, action_transition
from actions.kinds import kind_for
from actions.models import Action, ActionStatus
from approvals.four_eyes import four_eyes_refusal
from approvals.models import (
    Approval,
    ApprovalGroup,
    ApprovalLimit,
    ApprovalPolicy,
    Decision,
    PendingRejection,
    RejectionReason,
)
from approvals.policy import approval_binding, approval_record

S = ActionStatus


class DecisionRefused(Refused):
    """A decision the rules do not allow (a manager's approve, reject, ask again)."""

    default_status = 403


# The code of a refusal because the page the manager decided on is older than the proposal or
# its target: the pages offer to reload.
CHANGED_SINCE_SHOWN = "changed_since_shown"


@dataclass(frozen=True)
class Shown:
    """What the manager's page showed of a proposal when she decided on it: the version of its
    target (None for a kind that binds to no target), its amount and its payload hash.

    A decision is about what the manager saw: the service compares these with the locked row
    and refuses the decision when they differ, so an approval never binds a state of the order
    that no person looked at.
    """

    version: int | None
    amount: Decimal
    payload_hash: str


def _proposal_changes(action: Action, shown: Shown) -> list[str]:
    """How the proposal itself differs from what the page showed, in words (empty: it does not)."""
    changes = []
    if shown.amount != action.amount:
        changes.append(
            f"The amount changed since you opened this page: it showed {shown.amount} {action.currency}, the "
            f"proposal now asks for {action.amount} {action.currency}."
        )
    if shown.payload_hash != action.payload_hash:
        changes.append("The proposal's details changed since you opened this page.")
    return changes


def _refuse_if_changed_since_shown(action: Action, shown: Shown | None) -> None:
    """Refuse (409, writing nothing) a decision on ``action`` whose page showed another state of
    it or of its target. ``shown`` None: the caller shows no page (the harness, a test that
    decides directly), so there is nothing to compare; every page sends what it showed."""
    if shown is None:
        return
    kind = kind_for(action.kind)
    changes = []
    if shown.version != kind.target_version(action):
        changes.append(kind.target_changed_words(action, shown_version=shown.version))
    changes += _proposal_changes(action, shown)
    if changes:
        raise DecisionRefused(" ".join(changes), code=CHANGED_SINCE_SHOWN, status=409)


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
    if not kind_for(action.kind).moves_money:
        # No money moves (an email): no limit applies; the kind still says whether its target
        # allows it (the address is still one of the supplier's contacts).
        return kind_for(action.kind).approval_refusal(action)
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
    *,
    action_pk: int,
    user: Any,
    decision: str,
    note: str = "",
    reason_code: str = "",
    shown: Shown | None = None,
    now: datetime | None = None,
) -> Approval:
    """A manager approves or rejects a proposal. Raises DecisionRefused with a clear message.

    ``shown``: what the manager's page showed; a decision on a page older than the proposal or
    its target is refused (409) with what changed."""
    now = now or database_clock_now()
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
        pending = PendingRejection.objects.filter(action=action).first()
        if pending is not None:
            raise DecisionRefused(
                f"A rejection of {action.action_id} is about to take effect; undo it first to decide otherwise.",
                code="rejection_pending",
                status=409,
            )
        # Before the rules: a page that no longer shows the proposal as it is cannot be the
        # ground of a decision, and after a reload the rules show on the page themselves.
        _refuse_if_changed_since_shown(action, shown)
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
        return _rejection_record(action=action, user=user, reason_code=reason_code, note=note, now=now)


def _rejection_record(*, action: Action, user: Any, reason_code: str, note: str, now: datetime) -> Approval:
    """PROPOSED -> REJECTED with the decision recorded; inside the caller's transaction, with
    the action's row locked by the caller."""
    if reason_code and reason_code not in RejectionReason.values:
        raise DecisionRefused(f"Unknown rejection reason {reason_code!r}.", code="invalid_reason", status=400)
    label = RejectionReason(reason_code).label if reason_code else ""
    reason = ". ".join(part for part in (label, note) if part) or "Rejected by a manager."
    approval = Approval.objects.create(
        action=action,
        approver=user,
        decided_by_label=user.get_username(),
        policy=ApprovalPolicy.MANAGER,
        decision=Decision.REJECT,
        note=note,
        reason_code=reason_code,
        decided_at=now,
        **approval_binding(action),
    )
    action_transition(
        action=action,
        transition="reject",
        actor=Actor.for_user(user),
        reason=reason,
        evidence={"approval_id": approval.pk, "reason_code": reason_code},
        now=now,
        note=reason,
    )
    return approval


# --- several proposals on one target as one decision ------------------------------------------


@dataclass(frozen=True)
class GroupDecision:
    group: ApprovalGroup
    approvals: list[Approval]


def approval_decide_group(
    *,
    action_pks: list[int],
    user: Any,
    note: str = "",
    shown: dict[int, Shown] | None = None,
    now: datetime | None = None,
) -> GroupDecision:
    """Approve several proposals on one target (an order, a bill) as ONE decision.

    Every member passes the same checks as a lone approval (four eyes, the manager's limit, the
    target's balance), and together their sum must fit both the target's balance and the
    manager's limit. They are bound to the target's version as the manager saw it: ``shown``
    (per member, what the page showed) must match the locked rows, every member at the one
    version of their shared target. The group's version chain (ApprovalGroup) starts there and
    lets each member reserve after its siblings without going stale. All or nothing: one
    refusal refuses the whole decision and writes nothing.
    """
    now = now or database_clock_now()
    pks = sorted(set(action_pks))
    if len(pks) < 2:
        raise DecisionRefused("Choose at least two proposals to approve together.", code="group_too_small", status=400)
    if shown is not None and set(shown) != set(pks):
        raise DecisionRefused(
            "The page did not send what it showed of each ticked proposal. Reload the page and decide again.",
            code="shown_missing",
            status=400,
            field="shown",
        )
    with transaction.atomic(durable=True):
        # Locked in pk order, so two group decisions over the same proposals cannot deadlock.
        actions = list(
            Action.objects.select_for_update(of=("self",))
            .select_related("order", "bill", "proposed_by_agent")
            .filter(pk__in=pks)
            .order_by("pk")
        )
        if len(actions) != len(pks):
            raise Action.DoesNotExist("One of the proposals does not exist.")
        version = _group_version_if_decidable(actions)
        if shown is not None:
            _refuse_group_if_changed_since_shown(actions, shown, version=version)
        total = _group_total_within_limit_and_balance(actions, user=user)
        first = actions[0]
        group = ApprovalGroup.objects.create(
            approver=user,
            decided_at=now,
            approved_version=version,
            next_version=version,
            size=len(actions),
            total_amount=total,
            currency=first.currency,
            note=note,
        )
        approvals = [
            approval_record(
                action=action,
                approver=user,
                label=user.get_username(),
                policy=ApprovalPolicy.MANAGER,
                policy_detail={"group_id": group.pk},
                note=note or f"Approved together with {len(actions) - 1} other proposal(s) on the same target.",
                now=now,
                actor=Actor.for_user(user),
                group=group,
            )
            for action in actions
        ]
    return GroupDecision(group=group, approvals=approvals)


def _group_version_if_decidable(actions: list[Action]) -> int:
    """The shared target's version, once the proposals are of one kind on one target in one
    currency, all waiting, none about to be rejected; DecisionRefused otherwise."""
    first = actions[0]
    kind = kind_for(first.kind)
    targets = {(a.kind, a.order_id, a.bill_id, a.currency) for a in actions}
    if len(targets) != 1 or kind.target_version(first) is None:
        raise DecisionRefused(
            "Proposals can be approved together only when they are of one kind, on the same order or bill, "
            "in one currency.",
            code="group_mixed_targets",
            status=400,
        )
    busy = [a.action_id for a in actions if a.status != S.PROPOSED]
    if busy:
        raise DecisionRefused(f"{', '.join(busy)} no longer waiting for a decision.", code="not_waiting", status=409)
    if PendingRejection.objects.filter(action__in=actions).exists():
        raise DecisionRefused(
            "One of these proposals is about to be rejected; undo that rejection first.",
            code="rejection_pending",
            status=409,
        )
    version = kind.target_version(first)
    assert version is not None
    return version


def _group_total_within_limit_and_balance(actions: list[Action], *, user: Any) -> Decimal:
    """Every member passes a lone approval's checks, and their sum fits the manager's limit and
    the target's balance; returns the sum."""
    first = actions[0]
    limit = approval_limit_for(user=user, currency=first.currency)
    for action in actions:
        refusal = approval_refusal_reason(action=action, user=user, limit=limit)
        if refusal is not None:
            raise DecisionRefused(f"{action.action_id}: {refusal[1]}", code=refusal[0])
    total = sum((a.amount for a in actions), Decimal("0"))
    assert limit is not None  # approval_refusal_reason refuses a money kind without a limit
    if total > limit:
        raise DecisionRefused(
            f"Together these come to {total} {first.currency}, above your approval limit of "
            f"{limit} {first.currency}.",
            code="over_limit",
        )
    balance = kind_for(first.kind).target_balance(first)
    if balance is not None and total > balance[1]:
        raise DecisionRefused(
            f"Together these come to {total} {first.currency}, more than {balance[0]} of "
            f"{balance[1]} {first.currency}.",
            code="over_refundable_balance",
        )
    return total


def _refuse_group_if_changed_since_shown(actions: list[Action], shown: dict[int, Shown], *, version: int) -> None:
    """The grouped form of ``_refuse_if_changed_since_shown``. Every member was shown at the one
    version of the target the group card showed, and each is compared with the version now, not
    with the chain's later steps: the chain only begins once this decision is recorded."""
    first = actions[0]
    changes = []
    stale = [shown[a.pk].version for a in actions if shown[a.pk].version != version]
    if stale:
        # The oldest version any member showed: what changed since then covers them all.
        since = min((v for v in stale if v is not None), default=None)
        changes.append(kind_for(first.kind).target_changed_words(first, shown_version=since))
    for action in actions:
        changes += [f"{action.action_id}: {words}" for words in _proposal_changes(action, shown[action.pk])]
    if changes:
        raise DecisionRefused(" ".join(changes), code=CHANGED_SINCE_SHOWN, status=409)


# --- a rejection with an undo window ----------------------------------------------------------


def rejection_request(
    *,
    action_pk: int,
    user: Any,
    reason_code: str,
    note: str = "",
    shown: Shown | None = None,
    now: datetime | None = None,
) -> PendingRejection:
    """Ask for a rejection that takes effect after ``REJECTION_UNDO_SECONDS``.

    ``shown``: what the manager's page showed; as for an approval, a rejection decided on an
    older page is refused (409) with what changed, so a "no" is about what she saw too.

    Nothing about the action changes yet; while the rejection is pending nobody may approve it.
    The commit is published for the end of the window, and every page that lists proposals
    commits the due ones first, so a lost message delays a rejection but never loses it.
    """
    now = now or timezone.now()
    if reason_code not in RejectionReason.values:
        raise DecisionRefused("Choose a reason for the rejection.", code="invalid_reason", status=400)
    if reason_code == RejectionReason.OTHER and not note.strip():
        raise DecisionRefused(
            "Say in the note why you reject it, since the reason is 'Other'.", code="note_required", status=400
        )
    with transaction.atomic(durable=True):
        action = Action.objects.select_for_update(of=("self",)).get(pk=action_pk)
        if action.status != S.PROPOSED:
            raise DecisionRefused(
                f"{action.action_id} is {action.get_status_display().lower()} now, no longer waiting for a decision.",
                code="not_waiting",
                status=409,
            )
        if not has_transition_perm(action.reject, user):
            raise DecisionRefused("Only managers may approve or reject proposals.", code="not_a_manager")
        _refuse_if_changed_since_shown(action, shown)
        # Whoever may not approve it under four eyes may not reject it either: the card shows
        # both buttons disabled for them, and the rule says the same.
        four_eyes = four_eyes_refusal(action=action, user=user)
        if four_eyes is not None:
            raise DecisionRefused(four_eyes.replace("approve", "decide"), code="four_eyes")
        if PendingRejection.objects.filter(action=action).exists():
            raise DecisionRefused(
                f"A rejection of {action.action_id} is already about to take effect.",
                code="rejection_pending",
                status=409,
            )
        pending = PendingRejection.objects.create(
            action=action,
            requested_by=user,
            reason_code=reason_code,
            note=note,
            requested_at=now,
            commit_at=now + timedelta(seconds=settings.REJECTION_UNDO_SECONDS),
        )
        # Looked up at commit time, so a test's replacement is the one called.
        transaction.on_commit(lambda: publish.rejection_commit_enqueue(action.pk, settings.REJECTION_UNDO_SECONDS))
    return pending


def rejection_undo(*, action_pk: int, user: Any) -> Action:
    """Withdraw a pending rejection before it takes effect. The proposal waits again, unchanged."""
    with transaction.atomic(durable=True):
        action = Action.objects.select_for_update(of=("self",)).get(pk=action_pk)
        pending = PendingRejection.objects.filter(action=action).first()
        if pending is None:
            raise DecisionRefused(
                f"There is no rejection of {action.action_id} to undo: it has already taken effect.",
                code="nothing_to_undo",
                status=409,
            )
        if pending.requested_by_id != user.pk:
            raise DecisionRefused("Only the manager who rejected it may undo the rejection.", code="not_yours")
        pending.delete()
    return action


def rejection_commit(*, action_pk: int, now: datetime | None = None) -> Approval | None:
    """Turn a pending rejection into the decision, once its window has passed; None when there
    is nothing due (undone, already committed, or still inside the window)."""
    now = now or timezone.now()
    # Pages poll this for actions on their way: without a due rejection, take no row lock (the
    # worker's claim holds the action's row for a moment, and a poll must not queue behind it).
    if not PendingRejection.objects.filter(action_id=action_pk, commit_at__lte=now).exists():
        return None
    with transaction.atomic(durable=True):
        action = Action.objects.select_for_update(of=("self",)).select_related("order").filter(pk=action_pk).first()
        if action is None:
            return None
        pending = (
            PendingRejection.objects.select_related("requested_by").filter(action=action, commit_at__lte=now).first()
        )
        if pending is None:
            return None
        pending.delete()
        if action.status != S.PROPOSED:
            return None  # nothing else can move a PROPOSED action with a pending rejection; defensive
        return _rejection_record(
            action=action, user=pending.requested_by, reason_code=pending.reason_code, note=pending.note, now=now
        )


def rejections_commit_due(*, now: datetime | None = None) -> int:
    """Commit every pending rejection whose window has passed; the pages call this before
    listing, and the beat runs it, so a lost or late task never leaves one hanging."""
    now = now or timezone.now()
    due = list(PendingRejection.objects.filter(commit_at__lte=now).values_list("action_id", flat=True))
    return sum(1 for pk in due if rejection_commit(action_pk=pk, now=now) is not None)


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
