"""Recording approvals, and the auto-approval policy.

Below the engine: the engine's claim asks the policy to decide again when an approval it gave
went stale, and the services record a manager's approval through ``approval_record``. An
approval binds what the decider saw: the target's version (as the kind defines it), amount,
currency, payload hash and an expiry (docs/architecture.md section 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings

from actions.foundation import sql
from actions.foundation.publish import dispatch_enqueue_on_commit
from actions.foundation.trail import Actor, Writes, action_transition, event_record
from actions.kinds import kind_for
from actions.models import Action, ActionStatus
from approvals.caps import auto_approval_cap_lock, auto_approval_cap_refusal, auto_approval_held_record
from approvals.models import Approval, ApprovalGroup, ApprovalPolicy, Decision

S = ActionStatus


def approval_binding(action: Action) -> dict[str, Any]:
    """What an approval (or a rejection) of ``action`` binds, as of now."""
    return {
        "order_version": kind_for(action.kind).target_version(action),
        "amount": action.amount,
        "currency": action.currency,
        "payload_hash": action.payload_hash,
    }


class NowVersion:
    """The default of ``approval_record``'s ``bound_version``: the target's version as it is now
    (None is a version a plan can bind: a step whose target has none)."""


NOW_VERSION = NowVersion()


def approval_record(
    *,
    action: Action,
    approver: Any,
    label: str,
    policy: str,
    policy_detail: dict[str, Any],
    note: str,
    now: datetime,
    actor: Actor,
    group: ApprovalGroup | None = None,
    transitioned: bool = False,
    bound_version: int | NowVersion | None = NOW_VERSION,
    expires_at: datetime | None = None,
    reason: str = "",
    evidence_extra: dict[str, Any] | None = None,
    writes: Writes | None = None,
) -> Approval:
    """PROPOSED -> AUTHORIZED with an approval bound to the action and its target as they are now.

    Runs inside the caller's transaction; the dispatch is published once it commits.
    ``transitioned``: the action was inserted AUTHORIZED in this transaction (a proposal the
    policy approved before its INSERT, ``auto_policy_decide``): the approval and its "approve"
    event are written, the transition is not run again. ``writes``: the proposal's, which
    inserts that event with its own (only with ``transitioned``: the action's row is written).
    ``bound_version`` and ``expires_at``: a step of a workflow's plan is approved under the
    plan's approval, so it binds the target's version and the expiry that approval bound, not
    the ones of the moment the coordinator creates it. ``now``: the database's clock, as a lease's.
    """
    if writes is not None and not transitioned:
        raise ValueError("only the event of a transition already written goes with the proposal's rows")
    if transitioned and action.status != S.AUTHORIZED:
        raise ValueError(f"{action.action_id} is {action.status}, not inserted AUTHORIZED")
    expires_at = expires_at or now + timedelta(seconds=settings.APPROVAL_TTL_SECONDS)
    binding = approval_binding(action)
    if not isinstance(bound_version, NowVersion):
        binding["order_version"] = bound_version
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
        group=group,
        **binding,
    )
    evidence = {
        "approval_id": approval.pk,
        "policy": policy,
        "binding": {
            "order_version": binding["order_version"],
            "amount": str(action.amount),
            "currency": action.currency,
            "payload_hash": action.payload_hash,
        },
        "expires_at": expires_at.isoformat(),
        **({"group_id": group.pk, "group_size": group.size} if group is not None else {}),
        **(evidence_extra or {}),
    }
    reason = reason or note or "Approved."
    if transitioned:
        event_record(
            action=action,
            transition="approve",
            from_state=S.PROPOSED,
            actor=actor,
            reason=reason,
            evidence=evidence,
            now=now,
            writes=writes,
        )
    else:
        action_transition(action=action, transition="approve", actor=actor, reason=reason, evidence=evidence, now=now)
    dispatch_enqueue_on_commit(action.pk)
    return approval


@dataclass(frozen=True)
class AutoPolicyDecision:
    """What the auto-approval policy decided for one action, before it wrote anything."""

    threshold: Decimal
    held: str | None  # why a cap leaves the action to a manager (the card shows it); None: approve


def auto_policy_decide(
    *, action: Action, now: datetime, writes: Writes | None = None
) -> AutoPolicyDecision | None:
    """Whether the auto-approval policy approves ``action``; None where it does not apply (a
    person decides). Writes nothing, and needs no row of the action: a proposal asks before its
    INSERT, so that an approved one is inserted AUTHORIZED. Locks the target and the agent
    (``auto_approval_cap_lock``) until the caller's transaction ends; with ``writes``, the
    agent's webhook read with its row is kept there for the events' outbox rows."""
    kind = kind_for(action.kind)
    if not kind.moves_money:
        return None  # the threshold is about money; a kind without it is always a person's call
    # The threshold is the kind's: an invoice adjustment has its own, a refund the global one.
    threshold = kind.auto_approval_threshold(action.currency)
    if not settings.AUTO_APPROVAL_ENABLED or threshold is None or action.amount > threshold:
        return None
    if kind.auto_approval_refusal(action) is not None:
        return None  # a manager must look
    # Caps on autonomy: past any cap (per target, per agent) a manager decides, and the card
    # says why. The lock serialises concurrent auto-approvals on one target or by one agent.
    auto_approval_cap_lock(action=action, writes=writes)
    return AutoPolicyDecision(threshold=threshold, held=auto_approval_cap_refusal(action=action, now=now))


def auto_policy_apply(
    *,
    action: Action,
    decision: AutoPolicyDecision,
    now: datetime,
    transitioned: bool = False,
    writes: Writes | None = None,
) -> Approval | None:
    """Write what ``auto_policy_decide`` decided: the approval, or the cap's hold. Inside the
    transaction that decided it. ``transitioned`` and ``writes``: see ``approval_record``."""
    if decision.held is not None:
        auto_approval_held_record(action=action, reason=decision.held, now=now, writes=writes)
        return None
    label = f"policy:auto-approval (<= {decision.threshold} {action.currency})"
    return approval_record(
        action=action,
        approver=None,
        label=label,
        policy=ApprovalPolicy.AUTO,
        policy_detail={"threshold": str(decision.threshold), "currency": action.currency},
        note=f"Auto-approved: {action.amount} {action.currency} is at or below {decision.threshold} {action.currency}.",
        now=now,
        actor=Actor.system("auto-approval"),
        transitioned=transitioned,
        writes=writes,
    )


def approval_apply_auto_policy(*, action: Action, now: datetime) -> Approval | None:
    """Approve by policy when the amount is at or below the currency's threshold and the kind
    sees no reason to leave it to a manager (an action in PROPOSED, e.g. one reopened).

    Runs inside the caller's transaction, so the decision and what it writes are one commit.
    """
    decision = auto_policy_decide(action=action, now=now)
    return None if decision is None else auto_policy_apply(action=action, decision=decision, now=now)


def latest_approval(action: Action) -> Approval | None:
    # The newest row is the one in force; pk order is insertion order, immune to clock skew.
    return Approval.objects.filter(action=action, decision=Decision.APPROVE).order_by("-pk").first()


def approvals_in_force(*, action_pks: list[int]) -> dict[int, Approval]:
    """The approval in force (the newest APPROVE row) of each of these actions, in one read.

    Without DISTINCT ON, which SQLite (the embedded default) lacks: an action has one approval
    unless it was decided again, so reading every APPROVE row of the batch costs next to nothing.
    """
    in_force: dict[int, Approval] = {}
    for approval in sql.approve_rows(action_pks=action_pks):
        in_force[approval.action_id] = approval  # pk order is insertion order: the last one wins
    return in_force


def latest_approval_with_locked_action(*, action_pk: int, skip_locked: bool = False) -> Approval | None:
    """The approval in force and, as ``approval.action``, its action locked FOR UPDATE: one read.

    None when the action has no approval, or (``skip_locked``) when another transaction holds
    the action's row: the caller then reads the action on its own to tell which.
    """
    return (
        Approval.objects.select_related("action")
        .select_for_update(skip_locked=skip_locked, of=("action",))
        .filter(action_id=action_pk, decision=Decision.APPROVE)
        .order_by("-pk")
        .first()
    )


def approval_redecide_by_policy(*, action: Action, now: datetime) -> Approval | None:
    """A STALE action that the auto-approval policy approved gets a new decision by that policy.

    Runs in the transaction that made the action STALE, so a crash cannot leave a policy's
    action STALE with nobody asked to decide (invariant 8). The old approval is not
    re-interpreted: the policy decides again, from scratch, against the target as it is now
    (STALE -> PROPOSED -> AUTHORIZED, each step audited, with a new approval). Where the policy
    no longer applies, the action waits in PROPOSED for a manager. Actions a manager approved
    stay STALE until a manager asks for a new decision.
    """
    approval = latest_approval(action)
    if action.status != S.STALE or approval is None or approval.policy != ApprovalPolicy.AUTO:
        return None
    action_transition(
        action=action,
        transition="reopen",
        actor=Actor.system("auto-approval"),
        reason="The target changed since the policy approved this action: the policy decides again.",
        now=now,
    )
    return approval_apply_auto_policy(action=action, now=now)


# --- grouped decisions: the version chain -------------------------------------------------------


def group_chain_version(approval: Approval) -> int | None:
    """The target version this approval's reservation must find.

    A lone approval: the version the manager saw. A member of a grouped decision: the version
    its group has reached, read under the group's row lock so that siblings reserve one at a
    time; the lock is held until the caller's transaction ends.
    """
    if approval.group_id is None:
        return approval.order_version
    group = ApprovalGroup.objects.select_for_update().get(pk=approval.group_id)
    return group.next_version


def group_chain_advance(approval: Approval, *, reserved_at: int | None) -> None:
    """After a member reserved at ``reserved_at`` (which raised the target's version by one), the
    next sibling expects the version after it. Runs in the reservation's transaction, so a
    rollback of the reservation rolls this back too."""
    if approval.group_id is None or reserved_at is None:
        return
    advanced = ApprovalGroup.objects.filter(pk=approval.group_id, next_version=reserved_at).update(
        next_version=reserved_at + 1
    )
    # The group's row is locked by group_chain_version in this transaction: nobody else moved it.
    assert advanced == 1, "the group's version chain moved under its lock"
