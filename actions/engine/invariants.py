"""An invariant checker for a live deployment: docs/architecture.md section 8, invariants 1, 2, 5 and 8.

It reads the console's database and every kind's ledger at its receiver and reports every
violation. Used by
``manage.py audit_effects``, the chaos run and the tests. It only reads.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.utils import timezone

from actions.engine.ledger import repeat_allowances
from actions.kinds import all_kinds
from actions.kinds.base import Effect, Outcome, Receiver
from actions.models import Action, ActionStatus, WorkflowStep
from actions.permissions import DECIDE
from approvals.models import Approval, ApprovalLimit, ApprovalPolicy, Decision

S = ActionStatus
DECIDE_CODENAME = DECIDE.split(".", 1)[1]


@dataclass(frozen=True)
class Violation:
    invariant: int
    subject: str
    message: str


@dataclass
class EffectsReport:
    checked_at: str
    actions: int = 0
    effects: int = 0
    targets: int = 0  # targets whose money was checked
    duplicates: int = 0
    repeats_by_decision: int = 0  # extra effects a person chose to send ("send again")
    lost: int = 0
    # The same two counts per kind (action kind name -> count), for runs that mix kinds.
    actions_by_kind: dict[str, int] = field(default_factory=dict)
    duplicates_by_kind: dict[str, int] = field(default_factory=dict)
    lost_by_kind: dict[str, int] = field(default_factory=dict)
    explained: int = 0  # effects without an action that a kind booked otherwise (outside refunds)
    decisions_due: int = 0  # PROPOSED or manager-STALE actions waiting for a person who may decide
    states: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        return data


def max_unknown_seconds() -> float:
    """How long an action may stay UNKNOWN under the escalation policy before it must escalate.

    The worst case of the reconciler's schedule: each failed attempt waits the visibility
    delay plus an exponential backoff with up to 25% jitter, and each pass can be late by a
    sweep interval and a reconciler lease.
    """
    total = 0.0
    for failures in range(settings.RECONCILE_MAX_FAILURES + 1):
        backoff = settings.RECONCILE_BASE_BACKOFF_SECONDS * (2 ** min(failures, 6)) * 1.25
        total += settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS + backoff
        total += settings.SWEEP_INTERVAL_SECONDS + settings.LEASE_SECONDS
    return total


ActionRows = dict[str, dict[str, Any]]
EffectsByAction = dict[str, list[Effect]]

# What the checks read of each action: one query for the whole table.
_ACTION_COLUMNS = (
    "pk",
    "action_id",
    "kind",
    "status",
    "provider_reference",
    "status_changed_at",
    "owner_id",
    "amount",
    "currency",
    "lease_expires_at",
    "next_reconcile_at",
    "proposed_by_user_id",
    "proposed_by_agent__owner_id",
)


def check_effects(
    *, ledger: list[Effect], now: datetime | None = None, stuck_grace_seconds: float = 0
) -> EffectsReport:
    """``ledger``: the effects of every kind's receiver, read before this call."""
    now = now or timezone.now()
    report = EffectsReport(checked_at=now.isoformat())
    effects_by_action = _effects_by_action(report, ledger)
    actions: ActionRows = {row["action_id"]: row for row in Action.objects.values(*_ACTION_COLUMNS)}
    _count_actions(report, actions)
    decisions = repeat_allowances(effects_by_action.keys())
    _check_at_most_one_effect(report, actions, effects_by_action, decisions)
    _check_each_success_has_its_effect(report, actions, effects_by_action, decisions)
    _check_money_adds_up(report)
    _check_nothing_is_stuck(report, actions, now=now, grace_seconds=stuck_grace_seconds)
    _check_liveness(report, actions)
    return report


def _effects_by_action(report: EffectsReport, ledger: list[Effect]) -> EffectsByAction:
    effects_by_action: EffectsByAction = defaultdict(list)
    for effect in ledger:
        if effect.is_effect:
            report.effects += 1
            effects_by_action[effect.action_id or ""].append(effect)
    return effects_by_action


def _count_actions(report: EffectsReport, actions: ActionRows) -> None:
    report.actions = len(actions)
    for row in actions.values():
        report.states[row["status"]] = report.states.get(row["status"], 0) + 1
        report.actions_by_kind[row["kind"]] = report.actions_by_kind.get(row["kind"], 0) + 1
    for kind in all_kinds():
        report.duplicates_by_kind.setdefault(kind.name, 0)
        report.lost_by_kind.setdefault(kind.name, 0)


def _check_at_most_one_effect(
    report: EffectsReport, actions: ActionRows, effects_by_action: EffectsByAction, decisions: dict[str, int]
) -> None:
    """Invariant 1: at most one effect per action (plus one per recorded "send again" decision,
    invariant 16); an effect must belong to an action."""
    # Effects that no action made but that a kind booked by other means (an outside refund
    # learnt from the receiver's webhook) are explained: counted, not reported.
    explained: dict[str, str] = {}
    for kind in all_kinds():
        explained.update(kind.explained_effects())
    for action_id, effects in effects_by_action.items():
        if action_id not in actions:
            for effect in effects:
                if effect.reference in explained:
                    report.explained += 1
                    continue
                report.violations.append(
                    Violation(
                        1,
                        effect.reference,
                        f"effect {effect.reference} names no known action ({action_id or 'no action id'})",
                    )
                )
            continue
        allowed = 1 + decisions.get(action_id, 0)
        if len(effects) > 1 and len(effects) <= allowed:
            # Each extra effect was a person's recorded "send again" (invariant 16): shown, allowed.
            report.repeats_by_decision += len(effects) - 1
        elif len(effects) > 1:
            report.duplicates += len(effects) - 1
            kind_name = actions[action_id]["kind"]
            report.duplicates_by_kind[kind_name] = report.duplicates_by_kind.get(kind_name, 0) + len(effects) - 1
            references = ", ".join(sorted(e.reference for e in effects))
            report.violations.append(Violation(1, action_id, f"{len(effects)} effects at the receiver: {references}"))


def _compensated_action_ids() -> set[str]:
    """Workflow steps walked back by their compensation (a credit note voided): they no longer
    show a live effect at their receiver, and the compensation accounts for it.

    That holds once the compensation succeeded, and also while its outcome is still being
    established (sent, not final): the receiver may have voided the note before the answer was
    lost, and the compensation itself is then owned by the reconciler or a person (invariant 8
    checks that). Only a compensation that failed for good, or was never sent, leaves a missing
    effect unexplained."""
    return set(
        WorkflowStep.objects.filter(
            action__isnull=False,
            # Sent, or being established: a send refused before the receiver took it (AUTHORIZED
            # again, for another send) proves the receiver did nothing, so it is not here.
            compensation__status__in=(S.SUCCEEDED, S.SUBMITTING, S.UNKNOWN, S.SETTLING, S.NEEDS_REVIEW),
        ).values_list("action__action_id", flat=True)
    )


def _check_each_success_has_its_effect(
    report: EffectsReport, actions: ActionRows, effects_by_action: EffectsByAction, decisions: dict[str, int]
) -> None:
    """Invariant 2: every SUCCEEDED action has exactly one effect, and its reference is recorded;
    and (invariant 1's other side) no action that ended without success has a succeeded effect,
    which would mean money moved without the console's record."""
    # Invariant 2 can only be checked where a ledger was read: a compensation's or a void's
    # effect is not a record its receiver lists.
    audited_kinds = {kind.name for kind in all_kinds() if kind.ledger_enabled()}
    compensated = _compensated_action_ids()
    for action_id, row in actions.items():
        effects = effects_by_action.get(action_id, [])
        succeeded = [e for e in effects if e.outcome == Outcome.SUCCEEDED]
        if row["status"] in (S.FAILED_FINAL, S.REJECTED, S.CANCELLED) and succeeded:
            report.violations.append(
                Violation(1, action_id, f"{row['status']} in the console but a succeeded effect at the receiver")
            )
        # A kind whose receiver keeps no ledger (a person is its receiver) has nothing to count.
        if row["status"] != S.SUCCEEDED or row["kind"] not in audited_kinds:
            continue
        if action_id in compensated and not succeeded:
            continue
        if not 1 <= len(succeeded) <= 1 + decisions.get(action_id, 0):
            report.violations.append(
                Violation(2, action_id, f"SUCCEEDED with {len(succeeded)} succeeded effects at the receiver")
            )
        elif row["provider_reference"] not in {effect.reference for effect in succeeded}:
            report.violations.append(
                Violation(
                    2,
                    action_id,
                    f"recorded reference {row['provider_reference'] or '(none)'} "
                    f"but the effect is {succeeded[0].reference}",
                )
            )


def _check_money_adds_up(report: EffectsReport) -> None:
    """Invariant 5: each kind's targets add up."""
    for kind in all_kinds():
        checked, problems = kind.money_violations()
        report.targets += checked
        report.violations.extend(Violation(5, subject, message) for subject, message in problems)


def _check_nothing_is_stuck(report: EffectsReport, actions: ActionRows, *, now: datetime, grace_seconds: float) -> None:
    """Invariant 8: nothing is lost. No action stays SUBMITTING beyond its lease and a sweep,
    none UNKNOWN beyond the escalation policy, none in NEEDS_REVIEW without a named owner."""
    lease_bound = timedelta(seconds=settings.LEASE_SECONDS + settings.SWEEP_INTERVAL_SECONDS + grace_seconds)
    unknown_bound = timedelta(seconds=max_unknown_seconds() + grace_seconds)
    for action_id, row in actions.items():
        since = row["status_changed_at"] or now
        if row["status"] == S.SUBMITTING and now - since > lease_bound:
            message = f"SUBMITTING for {_age(now - since)}, beyond lease + sweep interval"
        elif row["status"] == S.UNKNOWN and now - since > unknown_bound:
            message = f"UNKNOWN for {_age(now - since)}, beyond the escalation policy"
        elif row["status"] == S.NEEDS_REVIEW and row["owner_id"] is None:
            message = "NEEDS_REVIEW with no named owner"
        else:
            continue
        report.lost += 1
        report.lost_by_kind[row["kind"]] = report.lost_by_kind.get(row["kind"], 0) + 1
        report.violations.append(Violation(8, action_id, message))


def _check_liveness(report: EffectsReport, actions: dict[str, dict[str, Any]]) -> None:
    """Invariant 8, liveness: no action sits in a non-final state without an owner, a due time or
    a scheduled next step. What counts as each, per state:

    - AUTHORIZED: the next step is scheduled by the AUTHORIZED sweep, which claims every such row
      at each sweep interval (a lost dispatch message is covered by it).
    - SUBMITTING: the lease's expiry is the due time; the lease sweep moves an expired one on.
    - UNKNOWN and SETTLING: ``next_reconcile_at`` is the due time; the reconciliation sweep only
      picks rows that have one, so one without it would wait for ever.
    - NEEDS_REVIEW: a named owner (checked above).
    - PROPOSED, and STALE after a manager's approval: a person's decision is due. It is *named*
      when at least one active user may make it: one who holds the permission to decide and,
      for a kind that moves money, an approval limit in the action's currency that covers its
      amount (an email needs no limit). Nobody able to decide means nobody ever will.
    - STALE after the policy's approval must not exist: the policy decides again in the
      invalidation's own transaction (actions.engine.claim), so nobody is asked to decide.
    """
    live = {
        action_id: row
        for action_id, row in actions.items()
        if row["status"] in (S.PROPOSED, S.STALE, S.SUBMITTING, S.UNKNOWN, S.SETTLING)
    }
    if not live:
        return
    stale_pks = [row["pk"] for row in live.values() if row["status"] == S.STALE]
    policy_by_action: dict[int, str] = {}
    for action_pk, policy in (
        Approval.objects.filter(action_id__in=stale_pks, decision=Decision.APPROVE)
        .order_by("action_id", "pk")
        .values_list("action_id", "policy")
    ):
        policy_by_action[action_pk] = policy  # ordered by pk: the last one is the one in force
    money_kinds = {kind.name for kind in all_kinds() if kind.moves_money}
    # Read once, and only when some decision is due.
    deciders = decider_limits_by_user() if any(row["status"] in (S.PROPOSED, S.STALE) for row in live.values()) else {}
    for action_id, row in live.items():
        status = row["status"]
        problem = ""
        if status == S.SUBMITTING and row["lease_expires_at"] is None:
            problem = "SUBMITTING without a lease expiry: the lease sweep would never move it on"
        elif status in (S.UNKNOWN, S.SETTLING) and row["next_reconcile_at"] is None:
            problem = f"{status} with no reconciliation due: the reconciliation sweep would never pick it"
        elif status == S.STALE and policy_by_action.get(row["pk"]) == ApprovalPolicy.AUTO:
            problem = "STALE after the policy's approval, with no new decision by the policy and none due"
        elif status in (S.PROPOSED, S.STALE):
            report.decisions_due += 1
            # Four eyes: neither the person who proposed it nor the owner of the agent that did.
            barred = {row["proposed_by_user_id"], row["proposed_by_agent__owner_id"]}
            allowed = [limits for user_pk, limits in deciders.items() if user_pk not in barred]
            if row["kind"] not in money_kinds:
                if not allowed:
                    problem = (
                        f"{status} waiting for a decision, but no active user may decide it (its proposer "
                        "and its agent's owner may not)"
                    )
            elif not any(row["amount"] <= limits.get(row["currency"], -1) for limits in allowed):
                problem = (
                    f"{status} waiting for a decision, but no active user may decide {row['amount']} "
                    f"{row['currency']} (no approval limit covers it, its proposer and its agent's owner aside)"
                )
        if problem:
            report.lost += 1
            report.lost_by_kind[row["kind"]] = report.lost_by_kind.get(row["kind"], 0) + 1
            report.violations.append(Violation(8, action_id, problem))


def _may_decide(prefix: str = "") -> Q:
    return (
        Q(**{f"{prefix}is_superuser": True})
        | Q(**{f"{prefix}groups__permissions__codename": DECIDE_CODENAME})
        | Q(**{f"{prefix}user_permissions__codename": DECIDE_CODENAME})
    )


def decider_limits_by_user() -> dict[int, dict[str, Decimal]]:
    """Every active user allowed to decide, with their approval limit per currency (none: they
    may decide only what moves no money)."""
    deciders: dict[int, dict[str, Decimal]] = {
        pk: {}
        for pk in get_user_model().objects.filter(is_active=True).filter(_may_decide()).values_list("pk", flat=True)
    }
    for user_pk, currency, amount in ApprovalLimit.objects.filter(user_id__in=list(deciders)).values_list(
        "user_id", "currency", "max_amount"
    ):
        deciders[user_pk][currency] = amount
    return deciders


def _age(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def audit_effects(*, receivers: dict[str, Receiver] | None = None, stuck_grace_seconds: float = 0) -> EffectsReport:
    """Read every kind's whole ledger (network, before any query), then check.

    ``receivers`` replaces a kind's configured receiver (tests, the chaos run)."""
    ledger: list[Effect] = []
    for kind in all_kinds():
        if kind.ledger_enabled():
            receiver = (receivers or {}).get(kind.name) or kind.receiver()
            ledger.extend(receiver.ledger())
    return check_effects(ledger=ledger, stuck_grace_seconds=stuck_grace_seconds)
