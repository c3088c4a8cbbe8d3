"""The claim: reserve and move AUTHORIZED -> SUBMITTING in one transaction (docs/architecture.md section 5).

An approval is permission for one exact action against one exact state of its target. The claim
re-checks that binding inside the transaction that reserves (through the kind's hook) and takes
the lease, so nobody and nothing re-interprets an approval against new data.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django_fsm import ConcurrentTransition

from actions.engine.faults import fault_point
from actions.engine.leases import lease_take
from actions.foundation import sql
from actions.foundation.clock import database_clock_now
from actions.foundation.tracing import traced
from actions.foundation.trail import Actor, Writes, action_transition
from actions.kinds import kind_for
from actions.kinds.base import BindingFailure
from actions.models import Action, ActionStatus, Attempt
from approvals.models import Approval
from approvals.policy import (
    approval_redecide_by_policy,
    approvals_in_force,
    group_chain_advance,
    group_chain_version,
    latest_approval_with_locked_action,
)

log = logging.getLogger(__name__)
S = ActionStatus


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
    def __init__(self, failures: list[BindingFailure]) -> None:
        self.failures = [failure.as_dict() for failure in failures]


def binding_failures(action: Action, approval: Approval | None, now: datetime) -> list[BindingFailure]:
    """What no longer matches between the approval and the action (the target is the kind's)."""
    if approval is None:
        return [BindingFailure("approval", "There is no approval for this action.")]
    failures = []
    if approval.expires_at is None or approval.expires_at <= now:
        expired_at = f"{approval.expires_at:%Y-%m-%d %H:%M:%S}" if approval.expires_at else "(no expiry recorded)"
        failures.append(BindingFailure("expiry", f"The approval expired at {expired_at}."))
    for name in ("amount", "currency", "payload_hash"):
        approved, current = getattr(approval, name), getattr(action, name)
        if approved != current:
            failures.append(BindingFailure(name, f"Approved {name} {approved} differs from {current}."))
    return failures


@traced("action.claim", outcome=lambda claim: claim.outcome.value)
def submission_begin(
    *, action_pk: int, now: datetime | None = None, actor: Actor | None = None, skip_locked: bool = False
) -> Claim:
    """Reserve and move AUTHORIZED -> SUBMITTING in one transaction.

    1. The kind's ``reserve`` makes its conditional UPDATE on its target (reserve only at the
       approved version and while the balance covers it, bumping the version).
    2. The action's conditional UPDATE (``actions.foundation.sql.ACTIONS_CLAIM``: WHERE status =
       'AUTHORIZED') moves it to SUBMITTING with a fresh lease.
    The attempt row (the request the worker is about to send) is written in the same commit.
    Either UPDATE changing no row rolls everything back.

    ``skip_locked``: the sweep's claim. A row another worker has locked is skipped (TAKEN)
    instead of waited for.
    """
    now = now or database_clock_now()
    actor = actor or Actor.system("dispatcher")
    try:
        with transaction.atomic(durable=True):
            # The row lock serialises claimers: a second worker waits here, then sees
            # SUBMITTING and leaves without touching the target. The approval in force comes
            # in the same read; an action without one (or one skipped as locked) is read alone.
            approval = latest_approval_with_locked_action(action_pk=action_pk, skip_locked=skip_locked)
            if approval is not None:
                action = approval.action
            else:
                action = Action.objects.select_for_update(skip_locked=skip_locked).filter(pk=action_pk).first()
            if action is None or action.status != S.AUTHORIZED:
                return Claim(outcome=ClaimOutcome.TAKEN, action=action)
            writes = Writes()
            claim = _claim_locked(action=action, approval=approval, actor=actor, now=now, writes=writes)
            _claims_write([claim], writes)
            return claim
    except ConcurrentTransition:
        return Claim(outcome=ClaimOutcome.TAKEN)
    except _BindingFailed as stale:
        return _invalidate(action_pk=action_pk, failures=stale.failures, actor=actor, now=now)


def submission_begin_batch(
    *,
    limit: int,
    now: datetime | None = None,
    actor: Actor | None = None,
    authorized_before: datetime | None = None,
    action_pks: Sequence[int] | None = None,
) -> list[Claim]:
    """Claim up to ``limit`` AUTHORIZED actions in ONE transaction: one commit for all of them.

    Each action is claimed exactly as ``submission_begin`` claims it (its binding checked, its
    target reserved by its kind, its own lease, event and attempt), so intent is committed
    before any of their calls and each call records under its own lease. Rows another worker
    holds are skipped (SKIP LOCKED), never waited for. An action whose approval no longer holds
    is left out of the batch and invalidated afterwards in its own transaction, exactly as a
    single claim would: a kind's ``reserve`` that fails writes nothing, so the others' claims
    are unaffected. Any other error rolls the whole batch back; nothing was sent yet.

    ``authorized_before``: only actions authorized before then (the sweep's grace period, which
    leaves fresh approvals to their own publish). ``action_pks``: only these (those whose
    receivers had a token, when rate limits are on).
    """
    if limit <= 0 or (action_pks is not None and not action_pks):
        return []  # before the clock: an empty batch asks the database nothing
    now = now or database_clock_now()
    actor = actor or Actor.system("dispatcher")
    claims: list[Claim] = []
    stale: list[tuple[int, list[dict[str, str]]]] = []
    candidate_pks: list[int] = []
    try:
        with transaction.atomic(durable=True):
            # Locked and each found AUTHORIZED, with its agent's webhook (for the events' outbox).
            actions = sql.claimable_actions(limit=limit, authorized_before=authorized_before, action_pks=action_pks)
            candidate_pks = [action.pk for action in actions]
            writes = Writes(
                webhooks={
                    action.proposed_by_agent_id: getattr(action, "agent_webhook_pk")  # noqa: B009 -- an annotation, unknown to mypy
                    for action in actions
                    if action.proposed_by_agent_id is not None
                }
            )
            approvals = approvals_in_force(action_pks=candidate_pks)
            # Reserve in one fixed order of targets (order, bill, supplier): two batches that hold
            # actions on the same targets lock those rows in the same order. A wait between a
            # batch and a grouped claim (the group's row, then the order) can still deadlock;
            # PostgreSQL then aborts one of them, which claims nothing and is tried again.
            actions.sort(key=target_lock_order)
            for action in actions:
                try:
                    claims.append(
                        _claim_locked(
                            action=action, approval=approvals.get(action.pk), actor=actor, now=now, writes=writes
                        )
                    )
                except _BindingFailed as failed:
                    stale.append((action.pk, failed.failures))
            # The batch's transitions in one UPDATE, its events and its attempts in one INSERT each.
            _claims_write(claims, writes)
    except Exception:
        if not candidate_pks:
            raise  # the batch's read itself failed (a dropped connection): nothing to fall back on
        # One action's claim failed for a reason that is no binding (a kind's hook raising, a
        # missing row): the batch rolled back whole. Claim its actions one by one instead, so
        # that one bad action holds up only itself, not every batch after it (oldest first, it
        # would be in all of them).
        log.exception("batch claim of %d actions failed; claiming them one by one", len(candidate_pks))
        return _claim_one_by_one(candidate_pks, actor=actor, now=now)
    for action_pk, failures in stale:
        try:
            claims.append(_invalidate(action_pk=action_pk, failures=failures, actor=actor, now=now))
        except Exception:
            # The batch's claims are committed and must reach their sender; this action stays
            # AUTHORIZED (its invalidation rolled back) and the next claim invalidates it.
            log.exception("action %s: invalidation after a batch claim failed; it stays AUTHORIZED", action_pk)
    return claims


def target_lock_order(action: Action) -> tuple[int, int, str, int]:
    """The order in which a transaction that writes several actions' targets locks them (the
    batched claim, the grouped record): two such transactions then never wait on each other in
    a cycle over the same orders or bills."""
    supplier = action.payload.get("supplier") if isinstance(action.payload, dict) else None
    return (action.order_id or 0, action.bill_id or 0, str(supplier or ""), action.pk)


def _claim_one_by_one(action_pks: list[int], *, actor: Actor, now: datetime) -> list[Claim]:
    claims = []
    for action_pk in action_pks:
        try:
            claims.append(submission_begin(action_pk=action_pk, now=now, actor=actor, skip_locked=True))
        except Exception:
            log.exception("action %s: its claim failed; it stays AUTHORIZED, tried again by the next claim", action_pk)
    return claims


def _claim_locked(
    *, action: Action, approval: Approval | None, actor: Actor, now: datetime, writes: Writes
) -> Claim:
    """The claim of one AUTHORIZED action whose row the caller's transaction holds locked: its
    target reserved now, its transition, event and attempt left to ``_claims_write``.

    Raises _BindingFailed, having written nothing, when the approval no longer holds.
    """
    failures = binding_failures(action, approval, now)
    if failures:
        raise _BindingFailed(failures)
    assert approval is not None
    # A member of a grouped decision reserves at the version its group has reached:
    # the approved version plus one for each sibling that reserved before it.
    approved_version = group_chain_version(approval)
    failures = kind_for(action.kind).reserve(action, approved_version=approved_version)
    if failures:
        raise _BindingFailed(failures)
    group_chain_advance(approval, reserved_at=approved_version)
    lease = lease_take(
        action=action,
        transition="begin_submission",
        actor=actor,
        reason="Reserved; submitting to the receiver.",
        evidence={
            "approval_id": approval.pk,
            "order_version": approved_version,
            "approved_version": approval.order_version,
            "group_id": approval.group_id,
            "attempt": action.attempt_count + 1,
        },
        now=now,
        writes=writes,
    )
    return Claim(outcome=ClaimOutcome.CLAIMED, action=action, attempt=lease.attempt, lease_token=lease.token)


def _claims_write(claims: list[Claim], writes: Writes) -> None:
    """Write the claims made in this transaction, before it commits: the actions' rows in one
    UPDATE, a compare-and-set on each one's status (``actions.foundation.sql.ACTIONS_CLAIM``; the rows are
    locked, so another writer can only have moved one through a bug), then their events and
    attempts."""
    actions = [claim.action for claim in claims if claim.action is not None]
    written = sql.actions_claim(actions) if actions else 0
    if written != len(actions):
        raise ConcurrentTransition(
            f"{len(actions) - written} of {len(actions)} claimed actions left AUTHORIZED before their claims "
            "were written"
        )
    writes.write()


def _invalidate(*, action_pk: int, failures: list[dict[str, str]], actor: Actor, now: datetime) -> Claim:
    """AUTHORIZED -> STALE, and in the same transaction the policy's new decision where the
    policy gave the old one: a crash between the two cannot strand the action."""
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
        # A worker killed here rolls back the STALE with it: the action stays AUTHORIZED and the
        # next claim (a redelivery, the AUTHORIZED sweep) invalidates and re-decides again.
        fault_point("during_invalidation")
        approval_redecide_by_policy(action=action, now=now)
    return Claim(outcome=ClaimOutcome.STALE, action=action, failures=failures)
