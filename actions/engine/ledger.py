"""The ledger audit: the answer to "has it already happened twice?".

For every kind whose receiver can list its effects, it reads them one window of creation times
at a time, from where the last run stopped, and compares them with the console's actions,
storing a Discrepancy for each of these (docs/architecture.md section 7):

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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from actions.foundation.clock import database_clock_now
from actions.foundation.trail import RESEND_TRANSITION, trail_events
from actions.kinds import all_kinds
from actions.kinds.base import Effect, EffectKind, LedgerUnavailable, LedgerWindow, LookupVerdict, Receiver
from actions.models import (
    Action,
    ActionStatus,
    Discrepancy,
    DiscrepancyKind,
    LedgerAuditCursor,
    LedgerAuditRun,
)

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


# Action ids per IN (...) list: PostgreSQL takes at most 65,535 parameters in one statement, and
# a busy window (or a window as long as the history) names more actions than that.
ACTION_IDS_PER_QUERY = 5000


def duplicate_key(references: list[str]) -> str:
    """The reference a duplicate is stored under, the same whichever window of the audit or
    whichever reconciliation's lookup saw its copies, and in whatever order the receiver listed
    them: one row per duplicate (Discrepancy's unique key)."""
    return min(references)


def in_chunks(action_ids: Iterable[str]) -> Iterator[list[str]]:
    ids = list(action_ids)
    for start in range(0, len(ids), ACTION_IDS_PER_QUERY):
        yield ids[start : start + ACTION_IDS_PER_QUERY]


def actions_named(action_ids: Iterable[str], *fields: str) -> Iterator[Action]:
    """The console's actions with these ids (those it has), a chunk of ids per query."""
    for chunk in in_chunks(action_ids):
        actions = Action.objects.filter(action_id__in=chunk)
        yield from actions.only(*fields) if fields else actions


def repeat_allowances(action_ids: Iterable[str]) -> dict[str, int]:
    """How many "send again" decisions a person recorded per action: each allows one more
    effect at a receiver that can neither deduplicate nor be asked (invariant 16)."""
    allowances: Counter[str] = Counter()
    for chunk in in_chunks(action_ids):
        decisions = trail_events(
            transition=RESEND_TRANSITION, action__action_id__in=chunk, order=("id",), select_related=("action",)
        )
        allowances.update(event.action.action_id for event in decisions)
    return dict(allowances)


def ledger_compare(
    *,
    kind: EffectKind,
    effects: list[Effect],
    window: LedgerWindow,
    judged_before: datetime,
    ask: Callable[[list[Action]], dict[str, list[Effect]]] | None = None,
) -> LedgerComparison:
    """Compare one window of a kind's effects with the console's actions. Reads only.

    Effects are judged in the window of their creation at the receiver. A SUCCEEDED action is
    judged in the window in which it became SUCCEEDED, once it is older than the receiver's
    visibility delay (``judged_before``). Its effect was created before that, often in the same
    window, but a refund that settled for days, or one found by reconciliation, has its effect
    in an earlier one. So where the window does not hold an action's recorded effect, the
    action is judged on what the receiver says about it (``ask``: its lookup, or where it has
    none its ledger before the window), never on one window's part of the story: no false
    finding at a window's edge, and a duplicate whose copies straddle two windows is still two
    effects for one action.
    """
    in_window = [effect for effect in effects if effect.created is None or window.holds(effect.created)]
    result = LedgerComparison(effects_seen=len(in_window))
    effects_by_action: dict[str, list[Effect]] = defaultdict(list)
    for effect in in_window:
        if effect.is_effect:
            effects_by_action[effect.action_id or ""].append(effect)
    known = {
        action.action_id: action
        for action in actions_named(
            [k for k in effects_by_action if k],
            "action_id", "kind", "amount", "currency", "status", "provider_reference", "payload",
        )
    }
    succeeded = _succeeded_in_window(kind=kind, window=window, judged_before=judged_before)
    result.actions_checked += len(succeeded)
    unmatched = [(action_id, reference) for action_id, reference in succeeded if action_id not in effects_by_action]
    asked = _ask_about_partial_stories(ask, known, effects_by_action, [action_id for action_id, _ in unmatched])

    decisions = repeat_allowances([*known.keys(), *asked.keys()])
    explained = kind.explained_effects()
    for action_id, effects_of_action in effects_by_action.items():
        action = known.get(action_id)
        if action is None:
            result.findings.extend(_effects_without_action(action_id, effects_of_action, explained))
            continue
        result.actions_checked += 1
        told = asked.get(action_id, (action, []))[1] or effects_of_action
        result.findings.extend(_effects_against_their_action(kind, action, told, decisions.get(action_id, 0)))
    for action_id, reference in unmatched:
        if action_id in asked and asked[action_id][1]:
            action, found = asked[action_id]
            result.findings.extend(_effects_against_their_action(kind, action, found, decisions.get(action_id, 0)))
            continue
        result.findings.append(
            Finding(DiscrepancyKind.SUCCEEDED_WITHOUT_EFFECT, action_id, reference, {"recorded_reference": reference})
        )
    return result


def _succeeded_in_window(*, kind: EffectKind, window: LedgerWindow, judged_before: datetime) -> list[tuple[str, str]]:
    """(action id, recorded reference) of the kind's actions that became SUCCEEDED in the window,
    leaving out those younger than the visibility delay: the receiver may not list them yet."""
    succeeded = Action.objects.filter(
        kind=kind.name, status=ActionStatus.SUCCEEDED, status_changed_at__lt=min(window.end, judged_before)
    )
    if window.start is not None:
        succeeded = succeeded.filter(status_changed_at__gte=window.start)
    return list(succeeded.values_list("action_id", "provider_reference").iterator(chunk_size=2000))


def _ask_about_partial_stories(
    ask: Callable[[list[Action]], dict[str, list[Effect]]] | None,
    known: dict[str, Action],
    effects_by_action: dict[str, list[Effect]],
    unmatched: list[str],
) -> dict[str, tuple[Action, list[Effect]]]:
    """What the receiver has for each action this window holds only part of: a SUCCEEDED action
    with no effect here, or whose recorded effect is not among those here. Network I/O."""
    if ask is None:
        return {}
    partial = [
        action
        for action_id, action in known.items()
        if action.status == ActionStatus.SUCCEEDED
        and action.provider_reference
        and action.provider_reference not in {e.reference for e in effects_by_action[action_id]}
    ]
    partial += actions_named(unmatched)
    if not partial:
        return {}
    told = ask(partial)
    return {action.action_id: (action, told.get(action.action_id, [])) for action in partial}


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
                duplicate_key([e.reference for e in effects]),
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


def ledger_audit_run(
    *,
    receivers: dict[str, Receiver] | None = None,
    now: datetime | None = None,
    window_length: timedelta | None = None,
) -> LedgerAuditRun:
    """Run the audit over every kind with a ledger, from where the last run stopped, one window
    at a time, and store what it finds. A finding already on record is not stored twice.
    ``receivers`` replaces a kind's configured receiver (tests); ``window_length`` replaces
    LEDGER_AUDIT_WINDOW_SECONDS (a window as long as the history reads it all at once)."""
    now = now or database_clock_now()
    window_length = window_length or timedelta(seconds=settings.LEDGER_AUDIT_WINDOW_SECONDS)
    run = LedgerAuditRun.objects.create(started_at=now)
    try:
        for kind in all_kinds():
            if not kind.ledger_enabled():
                continue
            receiver = (receivers or {}).get(kind.name) or kind.receiver()
            ledger_audit_kind(kind=kind, receiver=receiver, run=run, now=now, window_length=window_length)
    except LedgerUnavailable as error:
        LedgerAuditRun.objects.filter(pk=run.pk).update(
            error=f"Could not read the receiver's ledger: {error}", finished_at=timezone.now()
        )
        run.refresh_from_db()
        return run
    LedgerAuditRun.objects.filter(pk=run.pk).update(finished_at=timezone.now())
    run.refresh_from_db()
    return run


def ledger_audit_kind(
    *, kind: EffectKind, receiver: Receiver, run: LedgerAuditRun, now: datetime, window_length: timedelta
) -> None:
    """Audit one kind's receiver from its cursor up to ``now``, one window at a time. Each
    window's findings are stored with the cursor's advance in one transaction: a run that dies
    mid-way has lost nothing, and the next one starts at the first window not stored."""
    grace = receiver.contract.lookup_visibility_delay + timedelta(seconds=settings.SWEEP_INTERVAL_SECONDS)
    # The cursor only passes what the clock says the receiver has listed in full. A ``now`` in
    # the future (a test, a what-if) judges as of then, but proves nothing about those seconds.
    listed_in_full = min(now, database_clock_now()) - grace
    cursor = LedgerAuditCursor.objects.filter(kind=kind.name).values_list("audited_until", flat=True).first()
    # Read again behind the cursor (LEDGER_AUDIT_OVERLAP_SECONDS): a finding is stored once.
    overlap = timedelta(seconds=settings.LEDGER_AUDIT_OVERLAP_SECONDS)
    window_start = cursor - overlap if cursor is not None else None
    cut = window_start if window_start is not None else ledger_audit_start(kind=kind, now=now)
    # Whole seconds: Stripe's created filter takes no fractions.
    reading_until = _whole_second(now) + timedelta(seconds=1)
    lookup_asker = _asker(receiver) if receiver.contract.supports_lookup else None
    while True:
        window = LedgerWindow(start=window_start, end=min(_whole_second(cut) + window_length, reading_until))
        # One window is read before any transaction opens: it is network I/O.
        effects = list(receiver.ledger(window))
        ask = lookup_asker or ledger_reader_before(receiver, window, effects, margin=overlap)
        comparison = ledger_compare(kind=kind, effects=effects, window=window, judged_before=now - grace, ask=ask)
        del effects
        ledger_window_store(
            kind=kind.name,
            comparison=comparison,
            run=run,
            audited_until=_whole_second(min(window.end, listed_in_full)),
        )
        if window.end >= reading_until:
            return
        window_start = cut = window.end


def ledger_audit_start(*, kind: EffectKind, now: datetime) -> datetime:
    """Where a kind's first audit cuts its first window: LEDGER_AUDIT_START, else the kind's
    earliest action (no effect of ours is older), else now."""
    if settings.LEDGER_AUDIT_START:
        start = datetime.fromisoformat(settings.LEDGER_AUDIT_START)
        return start if timezone.is_aware(start) else timezone.make_aware(start, UTC)
    earliest = Action.objects.filter(kind=kind.name).order_by("created_at").values_list("created_at", flat=True).first()
    return earliest or now


@transaction.atomic
def ledger_window_store(
    *, kind: str, comparison: LedgerComparison, run: LedgerAuditRun, audited_until: datetime
) -> None:
    """Store one window's findings, count them on the run and move the kind's cursor, together."""
    findings = comparison.findings
    actions = {a.action_id: a for a in actions_named({f.action_id for f in findings if f.action_id})}
    new = 0
    for finding in findings:
        # The unique constraint makes this safe against a second audit storing the same finding
        # at the same moment: the loser's insert fails and it reads the winner's row.
        _, created = Discrepancy.objects.get_or_create(
            kind=finding.kind,
            action=actions.get(finding.action_id or ""),
            provider_reference=finding.provider_reference,
            defaults={"details": finding.details},
        )
        new += int(created)
    LedgerAuditRun.objects.filter(pk=run.pk).update(
        effects_seen=F("effects_seen") + comparison.effects_seen,
        actions_checked=F("actions_checked") + comparison.actions_checked,
        discrepancies_found=F("discrepancies_found") + len(findings),
        discrepancies_new=F("discrepancies_new") + new,
    )
    LedgerAuditCursor.objects.get_or_create(kind=kind, defaults={"audited_until": audited_until})
    # Forward only: a slower run that read an older window must not move the cursor back.
    LedgerAuditCursor.objects.filter(kind=kind, audited_until__lt=audited_until).update(audited_until=audited_until)


def _whole_second(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


def _asker(receiver: Receiver) -> Callable[[list[Action]], dict[str, list[Effect]]]:
    def ask(actions: list[Action]) -> dict[str, list[Effect]]:
        """Every effect the receiver has for each action, by its lookup (network I/O, one each)."""
        told: dict[str, list[Effect]] = {}
        for action in actions:
            lookup = receiver.lookup(action)
            if lookup.verdict == LookupVerdict.INCONCLUSIVE and not lookup.target_missing:
                # The run stops here, its cursor before this window: the next run asks again.
                raise LedgerUnavailable(f"the receiver could not be asked about {action.action_id}: {lookup.error}")
            told[action.action_id] = lookup.live_effects
        return told

    return ask


def ledger_reader_before(
    receiver: Receiver, window: LedgerWindow, listed: list[Effect], *, margin: timedelta
) -> Callable[[list[Action]], dict[str, list[Effect]]]:
    """For a receiver that cannot be asked about one action (a mail relay): each action's
    effects as a lookup would give them, from its ledger before the window (read once for all
    of them, from the first attempt of the oldest, less ``margin`` for the clocks of the worker
    and the receiver: network I/O) and from the window's own, already ``listed``."""

    def ask(actions: list[Action]) -> dict[str, list[Effect]]:
        wanted = {action.action_id for action in actions}
        earliest = min((action.first_attempt_at or action.created_at) for action in actions) - margin
        before: list[Effect] = []
        # Nothing is before a window that reaches back to the receiver's first record.
        if window.start is not None and earliest < window.start:
            before = list(receiver.ledger(LedgerWindow(start=_whole_second(earliest), end=window.start)))
        told: dict[str, list[Effect]] = defaultdict(list)
        for effect in [*before, *listed]:
            if effect.is_effect and effect.action_id in wanted:
                told[effect.action_id].append(effect)
        return dict(told)

    return ask
