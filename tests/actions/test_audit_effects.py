"""The audit's entry point (``actions.engine.invariants.audit_effects``), in memory.

``manage.py audit_effects`` and the chaos runs call it with the receivers' real ledgers; in the
mutation subset nothing reached it, nor the wording of a stuck action's age, nor the report as
the command prints it. Invariants 1 and 8 (docs/architecture.md section 8): an effect must belong to an
action, and nothing stays SUBMITTING beyond its lease and a sweep interval.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from actions.engine.invariants import EffectsReport, Violation, _age, audit_effects, check_effects
from actions.kinds import all_kinds
from actions.kinds.base import Effect, Outcome
from actions.models import Action, ActionStatus
from actions.services import Actor
from tests.actions.test_reconciliation import authorized_refund

S = ActionStatus


class Ledger:
    """A receiver as the audit sees it: its whole ledger, read once."""

    def __init__(self, *effects: Effect) -> None:
        self.effects = list(effects)
        self.reads = 0

    def ledger(self) -> list[Effect]:
        self.reads += 1
        return self.effects


class NotToBeRead:
    def ledger(self) -> list[Effect]:
        raise AssertionError("the audit read a ledger this deployment does not have")


def effect(reference: str, action_id: str | None, outcome: Outcome = Outcome.SUCCEEDED) -> Effect:
    return Effect(
        reference=reference,
        status=str(outcome).lower(),
        outcome=outcome,
        amount_minor=1000,
        currency="EUR",
        action_id=action_id,
        raw={},
    )


def receivers(settings: Any, **ledgers: Any) -> dict[str, Any]:
    """The receivers the audit is given: these ledgers, and no accounting system in this
    deployment (so the invoice adjustments' ledger must not be read)."""
    settings.ACCOUNTING_API_BASE = ""
    return {"invoice-adjustment": NotToBeRead(), **ledgers}


@pytest.mark.django_db
def test_the_audit_reads_each_ledger_it_is_given_once_and_only_the_kinds_that_have_one(settings: Any) -> None:
    refunds = Ledger(effect("re_stray", "refund:order-404:request-1"))
    emails = Ledger(effect("msg_stray", "supplier-email:nobody"))

    report = audit_effects(receivers=receivers(settings, refund=refunds, supplier_email=emails))

    assert (refunds.reads, emails.reads, report.effects) == (1, 1, 2)
    assert [(v.invariant, v.subject, v.message) for v in report.violations] == [
        (1, "re_stray", "effect re_stray names no known action (refund:order-404:request-1)"),
        (1, "msg_stray", "effect msg_stray names no known action (supplier-email:nobody)"),
    ]


@pytest.mark.django_db
def test_the_audit_gives_a_stuck_submission_the_grace_it_was_asked_for(
    agent_actor: Actor, settings: Any
) -> None:
    settings.LEASE_SECONDS, settings.SWEEP_INTERVAL_SECONDS = 60, 30
    action = authorized_refund(agent_actor)
    since = timezone.now() - timedelta(minutes=5, seconds=10)
    Action.objects.filter(pk=action.pk).update(
        status=S.SUBMITTING, status_changed_at=since, lease_expires_at=since + timedelta(seconds=60)
    )
    given = receivers(settings, refund=Ledger(), supplier_email=Ledger())

    def lost(report: EffectsReport) -> list[tuple[str, str]]:
        return [(v.subject, v.message) for v in report.violations if v.invariant == 8]

    assert lost(audit_effects(receivers=given, stuck_grace_seconds=300)) == []
    report = audit_effects(receivers=given)
    assert lost(report) == [(action.action_id, "SUBMITTING for 5 min, beyond lease + sweep interval")]
    assert report.lost == 1
    assert report.lost_by_kind == {**{kind.name: 0 for kind in all_kinds()}, "refund": 1}


@pytest.mark.django_db
def test_the_report_counts_effects_actions_and_states_as_of_the_time_it_was_asked(agent_actor: Actor) -> None:
    waiting, _also_waiting, done = (authorized_refund(agent_actor) for _ in range(3))
    Action.objects.filter(pk=done.pk).update(status=S.SUCCEEDED, provider_reference="re_done")
    asked = timezone.now() - timedelta(minutes=1)

    report = check_effects(
        ledger=[
            effect("re_done", done.action_id),
            effect("re_orphan", None),
            effect("re_refused", waiting.action_id, Outcome.FAILED_FINAL),  # not an effect
        ],
        now=asked,
    )

    assert report.checked_at == asked.isoformat()
    assert (report.effects, report.actions) == (2, 3)
    assert report.states == {S.AUTHORIZED: 2, S.SUCCEEDED: 1}
    assert report.actions_by_kind == {"refund": 3}
    # The succeeded action's recorded reference is its effect's: only the orphan is a violation.
    assert [(v.invariant, v.subject, v.message) for v in report.violations if v.invariant in (1, 2)] == [
        (1, "re_orphan", "effect re_orphan names no known action (no action id)")
    ]


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0, "0 s"), (119, "119 s"), (120, "2 min"), (7199, "119 min"), (7200, "2 h"), (90000, "25 h")],
)
def test_a_stuck_actions_age_is_told_in_seconds_then_minutes_then_hours(seconds: int, said: str) -> None:
    assert _age(timedelta(seconds=seconds, microseconds=999_999 if seconds else 0)) == said


def test_the_report_as_the_command_prints_it_says_whether_it_is_ok() -> None:
    clean = EffectsReport(checked_at="2026-12-03T09:00:00+00:00", effects=3)
    assert clean.as_dict() == {**clean.as_dict(), "ok": True, "effects": 3, "violations": []}

    wrong = EffectsReport(checked_at="2026-12-03T09:00:00+00:00", violations=[Violation(5, "order-7", "too much")])
    data = wrong.as_dict()
    assert data["ok"] is False
    assert data["violations"] == [{"invariant": 5, "subject": "order-7", "message": "too much"}]
    assert data["checked_at"] == "2026-12-03T09:00:00+00:00"
