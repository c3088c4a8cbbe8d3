"""The ledger audit: the answer to "has it already happened twice?".

For every kind whose receiver can list its effects, it reads them all and compares them with the
console's actions, storing a Discrepancy for each of these (docs/architecture.md section 7):

- an effect with no action (one whose metadata names no action we know);
- two effects for one action;
- an amount or currency that differs from the action's;
- a SUCCEEDED action with no effect (or whose recorded reference is not the effect's);
- an effect for an action the console holds as not succeeded (failed for good, rejected,
  cancelled, stale, or never submitted): a remedy may be paying the customer twice.

Failed and canceled records are not effects: they count for none of the above.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from actions.foundation.trail import RESEND_TRANSITION, trail_events
from actions.kinds import all_kinds
from actions.kinds.base import Effect, EffectKind, LedgerUnavailable, Receiver
from actions.models import Action, ActionStatus, Discrepancy, DiscrepancyKind, LedgerAuditRun

# Statuses in which the console holds that no effect happened, or not yet by our hand.
NOT_SUCCEEDED_STATUSES = frozenset(
    {
        ActionStatus.FAILED_FINAL,
        ActionStatus.REJECTED,
        ActionStatus.CANCELLED,
        ActionStatus.STALE,
        ActionStatus.PROPOSED,
        ActionStatus.AUTHORIZED,
    }
)


@dataclass(frozen=True)
class Finding:
    kind: str
    action_id: str | None
    provider_reference: str
    details: dict[str, Any]


@dataclass
class LedgerComparison:
    effects_seen: int = 0
    actions_checked: int = 0
    findings: list[Finding] = field(default_factory=list)


def repeat_allowances(action_ids: Iterable[str]) -> dict[str, int]:
    """How many "send again" decisions a person recorded per action: each allows one more
    effect at a receiver that can neither deduplicate nor be asked (invariant 16)."""
    decisions = trail_events(
        transition=RESEND_TRANSITION, action__action_id__in=list(action_ids), order=("id",), select_related=("action",)
    )
    return dict(Counter(event.action.action_id for event in decisions))


def ledger_compare(*, kind: EffectKind, effects: list[Effect], now: datetime, grace: timedelta) -> LedgerComparison:
    """Compare one kind's effects at its receiver with the console's actions. Reads only."""
    result = LedgerComparison(effects_seen=len(effects))
    effects_by_action: dict[str, list[Effect]] = defaultdict(list)
    for effect in effects:
        if effect.is_effect:
            effects_by_action[effect.action_id or ""].append(effect)

    known = {
        action.action_id: action
        for action in Action.objects.filter(action_id__in=[k for k in effects_by_action if k]).only(
            "action_id", "amount", "currency", "status", "provider_reference"
        )
    }
    decisions = repeat_allowances(known.keys())
    explained = kind.explained_effects()
    for action_id, effects in effects_by_action.items():
        action = known.get(action_id)
        if action is None:
            result.findings.extend(_effects_without_action(action_id, effects, explained))
            continue
        result.actions_checked += 1
        result.findings.extend(_effects_against_their_action(kind, action, effects, decisions.get(action_id, 0)))

    # A SUCCEEDED action younger than the receiver's visibility delay may not be listed yet.
    succeeded = Action.objects.filter(kind=kind.name, status=ActionStatus.SUCCEEDED, status_changed_at__lt=now - grace)
    for action_id, reference in succeeded.values_list("action_id", "provider_reference").iterator(chunk_size=2000):
        result.actions_checked += 1
        if action_id not in effects_by_action:
            result.findings.append(
                Finding(
                    DiscrepancyKind.SUCCEEDED_WITHOUT_EFFECT, action_id, reference, {"recorded_reference": reference}
                )
            )
    return result


def _effects_without_action(action_id: str, effects: list[Effect], explained: dict[str, str]) -> list[Finding]:
    """Effects that name no action of the console's, except those a kind booked on its target by
    other means (an outside refund from a webhook): finance already sees those there."""
    return [
        Finding(
            DiscrepancyKind.EFFECT_WITHOUT_ACTION,
            None,
            effect.reference,
            {
                "metadata_action_id": action_id or None,
                "amount_minor": effect.amount_minor,
                "currency": effect.currency.upper(),
            },
        )
        for effect in effects
        if effect.reference not in explained
    ]


def _effects_against_their_action(
    kind: EffectKind, action: Action, effects: list[Effect], send_again_decisions: int
) -> list[Finding]:
    """What one action's effects at the receiver contradict in its record: an effect for an action
    that did not succeed, a recorded reference the receiver does not show, more effects than
    decisions allow, an amount or currency that differs."""
    action_id = action.action_id
    findings: list[Finding] = []
    if action.status in NOT_SUCCEEDED_STATUSES:
        findings.extend(
            Finding(
                DiscrepancyKind.EFFECT_FOR_UNSUCCESSFUL_ACTION,
                action_id,
                effect.reference,
                {"console_status": action.status, "effect_status": effect.status},
            )
            for effect in effects
        )
    elif (
        action.status == ActionStatus.SUCCEEDED
        and len(effects) == 1
        and action.provider_reference
        and action.provider_reference != effects[0].reference
    ):
        findings.append(
            Finding(
                DiscrepancyKind.SUCCEEDED_WITHOUT_EFFECT,
                action_id,
                action.provider_reference,
                {"recorded_reference": action.provider_reference, "effect_at_provider": effects[0].reference},
            )
        )
    if len(effects) > 1:
        findings.append(
            Finding(
                DiscrepancyKind.REPEAT_BY_DECISION
                if len(effects) <= 1 + send_again_decisions
                else DiscrepancyKind.DUPLICATE_EFFECT,
                action_id,
                effects[0].reference,
                {
                    "effects": sorted(e.reference for e in effects),
                    "count": len(effects),
                    "send_again_decisions": send_again_decisions,
                },
            )
        )
    expected_minor = kind.expected_amount_minor(action)
    for effect in effects:
        if (expected_minor is not None and effect.amount_minor != expected_minor) or (
            effect.currency and effect.currency.upper() != action.currency
        ):
            findings.append(
                Finding(
                    DiscrepancyKind.AMOUNT_MISMATCH,
                    action_id,
                    effect.reference,
                    {
                        "expected": {"amount_minor": expected_minor, "currency": action.currency},
                        "found": {"amount_minor": effect.amount_minor, "currency": effect.currency.upper()},
                    },
                )
            )
    return findings


def ledger_audit_run(*, receivers: dict[str, Receiver] | None = None, now: datetime | None = None) -> LedgerAuditRun:
    """Run the audit over every kind with a ledger and store what it finds. A finding already on
    record is not stored twice. ``receivers`` replaces a kind's configured receiver (tests)."""
    now = now or timezone.now()
    run = LedgerAuditRun.objects.create(started_at=now)
    comparisons: list[LedgerComparison] = []
    try:
        for kind in all_kinds():
            if not kind.ledger_enabled():
                continue
            receiver = (receivers or {}).get(kind.name) or kind.receiver()
            # The whole ledger is read before any transaction opens: it is network I/O.
            effects = list(receiver.ledger())
            grace = receiver.contract.lookup_visibility_delay + timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS)
            comparisons.append(ledger_compare(kind=kind, effects=effects, now=now, grace=grace))
    except LedgerUnavailable as error:
        run.error = f"Could not read the receiver's ledger: {error}"
        run.finished_at = timezone.now()
        run.save(update_fields=["error", "finished_at"])
        return run

    findings = [finding for comparison in comparisons for finding in comparison.findings]
    new = 0
    with transaction.atomic():
        actions = {a.action_id: a for a in Action.objects.filter(action_id__in={f.action_id for f in findings})}
        for finding in findings:
            action = actions.get(finding.action_id or "")
            _, created = Discrepancy.objects.get_or_create(
                kind=finding.kind,
                action=action,
                provider_reference=finding.provider_reference,
                defaults={"details": finding.details},
            )
            new += int(created)
        run.effects_seen = sum(comparison.effects_seen for comparison in comparisons)
        run.actions_checked = sum(comparison.actions_checked for comparison in comparisons)
        run.discrepancies_found = len(findings)
        run.discrepancies_new = new
        run.finished_at = timezone.now()
        run.save()
    return run
