"""The ledger audit: the answer to "has it already happened twice?".

It reads every refund the receiver has and compares them with the console's actions, storing a
Discrepancy for each of these (DESIGN.md section 7):

- an effect with no action (a refund whose metadata names no action we know);
- two effects for one action;
- an amount or currency that differs from the action's;
- a SUCCEEDED action with no effect (or whose recorded reference is not the effect's);
- an effect for an action the console holds as not succeeded (failed for good, rejected,
  cancelled, stale, or never submitted): a remedy may be paying the customer twice.

Failed and canceled refunds are records, not effects: they count for none of the above.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from actions.execution import provider_from_settings
from actions.models import Action, ActionStatus, Discrepancy, DiscrepancyKind, LedgerAuditRun
from actions.providers.base import Provider, ProviderError, ProviderRefund, RefundStatus
from actions.providers.money import to_minor_units

EFFECT_STATUSES = frozenset({RefundStatus.SUCCEEDED, RefundStatus.PENDING, RefundStatus.REQUIRES_ACTION})
# Statuses in which the console holds that no refund happened, or not yet by our hand.
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
    refunds_seen: int = 0
    actions_checked: int = 0
    findings: list[Finding] = field(default_factory=list)


def ledger_compare(*, refunds: list[ProviderRefund], now: datetime, grace: timedelta) -> LedgerComparison:
    """Compare the receiver's refunds with the console's actions. Reads only."""
    result = LedgerComparison(refunds_seen=len(refunds))
    effects_by_action: dict[str, list[ProviderRefund]] = defaultdict(list)
    for refund in refunds:
        if refund.status in EFFECT_STATUSES:
            effects_by_action[refund.action_id or ""].append(refund)

    known = {
        action.action_id: action
        for action in Action.objects.filter(action_id__in=[k for k in effects_by_action if k]).only(
            "action_id", "amount", "currency", "status", "provider_reference"
        )
    }
    for action_id, effects in effects_by_action.items():
        action = known.get(action_id)
        if action is None:
            for effect in effects:
                result.findings.append(
                    Finding(
                        DiscrepancyKind.EFFECT_WITHOUT_ACTION,
                        None,
                        effect.id,
                        {"metadata_action_id": action_id or None, "amount_minor": effect.amount_minor},
                    )
                )
            continue
        result.actions_checked += 1
        if action.status in NOT_SUCCEEDED_STATUSES:
            for effect in effects:
                result.findings.append(
                    Finding(
                        DiscrepancyKind.EFFECT_FOR_UNSUCCESSFUL_ACTION,
                        action_id,
                        effect.id,
                        {"console_status": action.status, "refund_status": str(effect.status)},
                    )
                )
        elif (
            action.status == ActionStatus.SUCCEEDED
            and len(effects) == 1
            and action.provider_reference
            and action.provider_reference != effects[0].id
        ):
            result.findings.append(
                Finding(
                    DiscrepancyKind.SUCCEEDED_WITHOUT_EFFECT,
                    action_id,
                    action.provider_reference,
                    {"recorded_reference": action.provider_reference, "effect_at_provider": effects[0].id},
                )
            )
        if len(effects) > 1:
            result.findings.append(
                Finding(
                    DiscrepancyKind.DUPLICATE_EFFECT,
                    action_id,
                    effects[0].id,
                    {"refunds": sorted(e.id for e in effects), "count": len(effects)},
                )
            )
        expected_minor = to_minor_units(action.amount, action.currency)
        for effect in effects:
            if effect.amount_minor != expected_minor or effect.currency.upper() != action.currency:
                result.findings.append(
                    Finding(
                        DiscrepancyKind.AMOUNT_MISMATCH,
                        action_id,
                        effect.id,
                        {
                            "expected": {"amount_minor": expected_minor, "currency": action.currency},
                            "found": {"amount_minor": effect.amount_minor, "currency": effect.currency.upper()},
                        },
                    )
                )

    # A SUCCEEDED action younger than the receiver's visibility delay may not be listed yet.
    succeeded = Action.objects.filter(status=ActionStatus.SUCCEEDED, status_changed_at__lt=now - grace)
    for action_id, reference in succeeded.values_list("action_id", "provider_reference").iterator(chunk_size=2000):
        result.actions_checked += 1
        if action_id not in effects_by_action:
            result.findings.append(
                Finding(
                    DiscrepancyKind.SUCCEEDED_WITHOUT_EFFECT, action_id, reference, {"recorded_reference": reference}
                )
            )
    return result


def ledger_audit_run(*, provider: Provider | None = None, now: datetime | None = None) -> LedgerAuditRun:
    """Run the audit and store what it finds. A finding already on record is not stored twice."""
    provider = provider or provider_from_settings()
    now = now or timezone.now()
    run = LedgerAuditRun.objects.create(started_at=now)
    try:
        # The whole ledger is read before any transaction opens: it is network I/O.
        refunds = list(provider.iter_ledger())
    except ProviderError as error:
        run.error = f"Could not read the receiver's ledger: {error}"
        run.finished_at = timezone.now()
        run.save(update_fields=["error", "finished_at"])
        return run

    grace = provider.guarantees.lookup_visibility_delay + timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS)
    comparison = ledger_compare(refunds=refunds, now=now, grace=grace)
    new = 0
    with transaction.atomic():
        actions = {
            a.action_id: a for a in Action.objects.filter(action_id__in={f.action_id for f in comparison.findings})
        }
        for finding in comparison.findings:
            action = actions.get(finding.action_id or "")
            _, created = Discrepancy.objects.get_or_create(
                kind=finding.kind,
                action=action,
                provider_reference=finding.provider_reference,
                defaults={"details": finding.details},
            )
            new += int(created)
        run.refunds_seen = comparison.refunds_seen
        run.actions_checked = comparison.actions_checked
        run.discrepancies_found = len(comparison.findings)
        run.discrepancies_new = new
        run.finished_at = timezone.now()
        run.save()
    return run
