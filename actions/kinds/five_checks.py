"""The five checks, per kind, computed from each kind's receiver contract and the live settings.

Every effect must pass them before an agent may cause it (docs/architecture.md section 10, seed 001). The
answers are derived, never written by hand, so a kind whose receiver changes its contract shows
the consequence at once: a red check says plainly what the console does instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count

from actions.kinds import all_kinds, owner_groups
from actions.kinds.base import EffectKind, ReceiverContract, StepClass
from actions.models import Discrepancy, DiscrepancyStatus, LedgerAuditRun
from actions.providers.base import validate_idempotency_key

OPEN_DISCREPANCY = (DiscrepancyStatus.OPEN, DiscrepancyStatus.IN_PROGRESS)


@dataclass(frozen=True)
class Check:
    number: int
    question: str
    ok: bool
    answer: str
    reason: str


@dataclass(frozen=True)
class KindCard:
    name: str
    label: str
    receiver: str
    step_class: StepClass
    consequence: str
    checks: list[Check] = field(default_factory=list)
    # The kind's answer table, where it declares one: (receiver's answer, what follows, ok).
    answers: tuple[tuple[str, str, bool], ...] = ()

    @property
    def all_green(self) -> bool:
        return all(check.ok for check in self.checks)


def _duration(delta: timedelta | float | None) -> str:
    if delta is None:
        return "for ever"
    seconds = int(delta.total_seconds() if isinstance(delta, timedelta) else delta)
    if seconds % 86400 == 0 and seconds >= 86400:
        return f"{seconds // 86400} d"
    if seconds % 3600 == 0 and seconds >= 3600:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def consequence_of(contract: ReceiverContract) -> str:
    """What the step class and the contract mean for an ambiguous send, in one sentence."""
    if not contract.can_be_asked:
        return (
            "No key and no lookup: an ambiguous send goes straight to a person; "
            "never resent automatically."
        )
    if contract.supports_lookup and contract.honours_keys:
        return (
            "Keys and a lookup: an ambiguous send is looked up first, and re-sent "
            "with the same key only inside key retention or after an authoritative not-found."
        )
    if contract.supports_lookup:
        return (
            "A lookup but no keys: an ambiguous send is looked up; it is re-sent only "
            "after an authoritative not-found."
        )
    return (
        "Keys but no lookup: an ambiguous send is re-sent with the same key only "
        "inside key retention; after that a person decides."
    )


def _same_operation(kind: EffectKind) -> Check:
    try:
        validate_idempotency_key(kind.example_action_id)
    except ValueError as error:
        return Check(1, "Same operation?", False, kind.id_pattern, f"The example id is not a usable key: {error}.")
    return Check(
        1,
        "Same operation?",
        True,
        f"One saved id across every attempt: {kind.id_pattern}, e.g. {kind.example_action_id}.",
        "The id is composed from business references by the console, stored before the first attempt and "
        "sent as the idempotency key by every attempt, retry and recovery.",
    )


def _safe_to_repeat(contract: ReceiverContract) -> Check:
    changed = (
        "A changed payload under the same id is refused at proposal (its payload hash differs: 409 naming the fields)"
    )
    if contract.honours_keys:
        return Check(
            2,
            "Safe to repeat?",
            True,
            f"The {contract.receiver} deduplicates the id for {_duration(contract.key_retention)}.",
            f"{changed}; a key reused with other parameters at the receiver goes to a person at once.",
        )
    return Check(
        2,
        "Safe to repeat?",
        False,
        f"The {contract.receiver} cannot deduplicate: sending again could repeat the effect.",
        f"{changed}. Nothing of this kind is re-sent without a person's recorded decision.",
    )


def _outcome_unknown(contract: ReceiverContract, owner_group: str) -> Check:
    policy = (
        f"after {settings.RECONCILE_MAX_FAILURES} inconclusive lookups within "
        f"{_duration(settings.RECONCILE_WINDOW_SECONDS)} it goes to a named member of {owner_group}, "
        f"due in {settings.REVIEW_DUE_HOURS} h"
    )
    if contract.supports_lookup:
        authoritative = "is authoritative" if contract.lookup_authoritative else "is not authoritative"
        return Check(
            3,
            "Outcome unknown?",
            True,
            f"The {contract.receiver} can be asked; a not-found {authoritative} after a visibility delay of "
            f"{_duration(contract.lookup_visibility_delay)}.",
            f"Reconciliation asks before anything is retried; {policy}.",
        )
    return Check(
        3,
        "Outcome unknown?",
        False,
        f"The {contract.receiver} cannot be asked what happened.",
        f"An ambiguous outcome is held for investigation at once, owned by a named member of {owner_group}, "
        f"due in {settings.REVIEW_DUE_HOURS} h.",
    )


def _same_decision(kind: EffectKind) -> Check:
    return Check(
        4,
        "Same decision?",
        True,
        f"The approval binds {kind.binds}; it expires after {_duration(settings.APPROVAL_TTL_SECONDS)}.",
        "Recovery reuses the saved action, its key and its approval; a changed target makes the action stale "
        "and asks for a new decision, never a reinterpretation.",
    )


def _twice(
    kind: EffectKind, contract: ReceiverContract, owner_group: str, last_run: LedgerAuditRun | None, open_count: int
) -> Check:
    schedule = f"every {_duration(settings.LEDGER_AUDIT_INTERVAL_SECONDS)}"
    if not kind.has_ledger:
        return Check(
            5,
            "Already happened twice?",
            False,
            f"The {contract.receiver} keeps no ledger the console can audit.",
            f"Correction: {contract.correction_path} Owner group: {owner_group}.",
        )
    when = _last_run_text(last_run)
    return Check(
        5,
        "Already happened twice?",
        last_run is not None and not last_run.error,
        f"The ledger audit compares the {contract.receiver}'s effects with the console {schedule}; {when}; "
        f"{open_count} open discrepanc{'y' if open_count == 1 else 'ies'}.",
        f"Correction: {contract.correction_path} Owner group: {owner_group}.",
    )


def _last_run_text(run: LedgerAuditRun | None) -> str:
    if run is None:
        return "it has not run yet"
    if run.error:
        return f"the last run failed ({run.error})"
    finished: datetime | None = run.finished_at
    return f"last run {finished:%Y-%m-%d %H:%M} UTC" if finished else "a run is in progress"


def kind_cards() -> list[KindCard]:
    """One card per registered kind, answering the five checks. Reads a constant number of rows."""
    last_run = LedgerAuditRun.objects.order_by("-started_at").first()
    open_by_kind = dict(
        Discrepancy.objects.filter(status__in=OPEN_DISCREPANCY)
        .values_list("action__kind")
        .annotate(count=Count("pk"))
        .order_by()
    )
    groups = owner_groups()
    cards = []
    for kind in all_kinds():
        contract = kind.contract()
        group = groups[kind.name]
        cards.append(
            KindCard(
                name=kind.name,
                label=kind.label,
                receiver=contract.receiver,
                step_class=contract.step_class,
                consequence=consequence_of(contract),
                checks=[
                    _same_operation(kind),
                    _safe_to_repeat(contract),
                    _outcome_unknown(contract, group),
                    _same_decision(kind),
                    _twice(kind, contract, group, last_run, open_by_kind.get(kind.name, 0)),
                ],
                answers=kind.answer_table,
            )
        )
    return cards

