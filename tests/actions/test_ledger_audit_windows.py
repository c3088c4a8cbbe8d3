"""The ledger audit reads the receiver one window of creation times at a time, from a cursor
per kind, and stores each finding once (docs/architecture.md section 7).

The receiver here is the refund kind's own adapter over a provider that records the bounds it
is asked for: what the audit sends is what Stripe's ``created[gte]``/``created[lt]`` get.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from actions.engine.ledger import ledger_audit_run
from actions.kinds.refund.contract import RefundReceiver
from actions.models import (
    Action,
    Discrepancy,
    DiscrepancyKind,
    LedgerAuditCursor,
    LedgerAuditRun,
)
from actions.providers.base import ProviderGuarantees, ProviderRefund
from actions.services import Actor
from tests.actions.test_corrections import provider_refund, succeeded_refund

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

K = DiscrepancyKind
DAY = timedelta(days=1)


@pytest.fixture(autouse=True)
def only_refunds(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the refund kind has a ledger here: the accounting system is not part of these tests.
    settings.ACCOUNTING_API_BASE = ""
    settings.MAIL_SANDBOX_URL = ""
    settings.AUTO_APPROVAL_ENABLED = False
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", lambda pk: None)


@pytest.fixture
def first_day(settings: Any) -> datetime:
    """Where the first audit starts: three whole days ago, on the hour, so windows are days."""
    start = timezone.now().replace(minute=0, second=0, microsecond=0) - 3 * DAY
    settings.LEDGER_AUDIT_START = start.isoformat()
    settings.LEDGER_AUDIT_WINDOW_SECONDS = int(DAY.total_seconds())
    return start


@dataclass
class RecordingProvider:
    """A payment provider whose list honours the created bounds and remembers each one asked."""

    refunds: list[ProviderRefund]
    reads: list[tuple[int | None, int | None]] = field(default_factory=list)
    # The read (counted from 1) on which the process dies, as a worker killed mid-audit.
    dies_on_read: int | None = None
    # Each read waits here first: two audits that have both read before either stores.
    barrier: threading.Barrier | None = None
    guarantees: ProviderGuarantees = field(
        default_factory=lambda: ProviderGuarantees(
            honours_idempotency_keys=True,
            key_retention=None,
            supports_lookup=True,
            lookup_authoritative=True,
            lookup_visibility_delay=timedelta(0),
        )
    )

    def iter_ledger(
        self, *, created_from: int | None = None, created_before: int | None = None
    ) -> Iterator[ProviderRefund]:
        self.reads.append((created_from, created_before))
        if len(self.reads) == self.dies_on_read:
            raise RuntimeError("the worker died mid-audit")
        if self.barrier is not None and len(self.reads) == 1:
            self.barrier.wait(timeout=30)
        return iter(
            [
                refund
                for refund in self.refunds
                if (created_from is None or refund.created >= created_from)
                and (created_before is None or refund.created < created_before)
            ]
        )

    def find_refunds(self, *, charge: str, action_id: str | None = None) -> list[ProviderRefund]:
        return [r for r in self.refunds if r.charge == charge and action_id in (None, r.action_id)]


def refund_at(action: Action, reference: str, created: datetime) -> ProviderRefund:
    return dataclasses.replace(provider_refund(action, reference), created=int(created.timestamp()))


def stray_refund(reference: str, created: datetime) -> ProviderRefund:
    """A refund naming an action the console never had."""
    metadata = {"action_id": f"refund:order-unknown:{reference}"}
    return ProviderRefund(
        id=reference,
        charge="ch_unknown",
        amount_minor=500,
        currency="eur",
        status="succeeded",  # type: ignore[arg-type]
        metadata=metadata,
        created=int(created.timestamp()),
        raw={"id": reference, "object": "refund", "metadata": metadata},
    )


def succeeded_at(proposer: Actor, approver: Any, when: datetime, reference: str) -> Action:
    action = succeeded_refund(proposer, approver, reference=reference)
    Action.objects.filter(pk=action.pk).update(status_changed_at=when)
    return Action.objects.get(pk=action.pk)


def audit(provider: RecordingProvider, **kwargs: Any) -> LedgerAuditRun:
    return ledger_audit_run(receivers={"refund": RefundReceiver(provider)}, **kwargs)  # type: ignore[arg-type]


def epoch(moment: datetime) -> int:
    return int(moment.timestamp())


def findings() -> set[tuple[str, str | None, str]]:
    return {
        (d.kind, d.action.action_id if d.action else None, d.provider_reference)
        for d in Discrepancy.objects.select_related("action")
    }


def test_the_receiver_is_asked_one_window_at_a_time_and_the_next_run_resumes_at_the_cursor(
    first_day: datetime,
) -> None:
    provider = RecordingProvider([stray_refund("re_old", first_day - 30 * DAY)])
    now = timezone.now()

    run = audit(provider, now=now)

    # The first window also takes everything older than the start, so nothing is skipped.
    assert provider.reads == [
        (None, epoch(first_day + DAY)),
        (epoch(first_day + DAY), epoch(first_day + 2 * DAY)),
        (epoch(first_day + 2 * DAY), epoch(first_day + 3 * DAY)),
        (epoch(first_day + 3 * DAY), epoch(now) + 1),
    ]
    assert findings() == {(K.EFFECT_WITHOUT_ACTION, None, "re_old")}
    assert run.effects_seen == 1 and run.finished_at is not None
    # The cursor stops short of the receiver's visibility delay and the sweep interval: the
    # last seconds may not all be listed yet, and are read again next time.
    cursor = LedgerAuditCursor.objects.get(kind="refund").audited_until
    assert now - timedelta(seconds=11) <= cursor <= now - timedelta(seconds=10)

    provider.reads.clear()
    audit(provider)

    # From the cursor, less the overlap read again for what was recorded late.
    behind = epoch(cursor - timedelta(seconds=settings.LEDGER_AUDIT_OVERLAP_SECONDS))
    assert provider.reads[0][0] == behind
    assert all(start is not None and start >= behind for start, _ in provider.reads)


def test_an_audit_that_dies_mid_way_loses_nothing_and_stores_nothing_twice(first_day: datetime, settings: Any) -> None:
    settings.LEDGER_AUDIT_OVERLAP_SECONDS = 0  # the windows as cut, without the overlap read again
    provider = RecordingProvider(
        [stray_refund("re_first_day", first_day + DAY / 2), stray_refund("re_second_day", first_day + DAY * 1.5)],
        dies_on_read=2,
    )

    with pytest.raises(RuntimeError, match="died mid-audit"):
        audit(provider)

    # The first window's finding was stored with the cursor's move past it, together.
    assert findings() == {(K.EFFECT_WITHOUT_ACTION, None, "re_first_day")}
    assert LedgerAuditCursor.objects.get(kind="refund").audited_until == first_day + DAY

    provider.dies_on_read = None
    provider.reads.clear()
    run = audit(provider)

    assert provider.reads[0] == (epoch(first_day + DAY), epoch(first_day + 2 * DAY))
    assert findings() == {
        (K.EFFECT_WITHOUT_ACTION, None, "re_first_day"),
        (K.EFFECT_WITHOUT_ACTION, None, "re_second_day"),
    }
    assert Discrepancy.objects.count() == 2
    assert run.discrepancies_new == 1


def test_what_was_recorded_behind_the_cursor_is_still_audited_by_the_next_run(
    first_day: datetime, agent_actor: Actor, manager: Any
) -> None:
    """A success whose transaction committed after a run had read its window (or that a host
    whose clock runs behind stamped early) lies behind that run's cursor: the next run reads the
    overlap again and finds what it hides."""
    provider = RecordingProvider([])
    audit(provider)
    cursor = LedgerAuditCursor.objects.get(kind="refund").audited_until

    late = succeeded_at(agent_actor, manager, cursor - timedelta(minutes=2), "re_late_a")
    provider.refunds += [
        refund_at(late, "re_late_a", cursor - timedelta(minutes=3)),
        refund_at(late, "re_late_b", cursor - timedelta(minutes=3)),
    ]
    run = audit(provider)

    assert findings() == {(K.DUPLICATE_EFFECT, late.action_id, "re_late_a")}
    assert run.discrepancies_new == 1
    # Read again by the run after, it is the same finding, stored once.
    assert audit(provider).discrepancies_new == 0
    assert Discrepancy.objects.count() == 1


def test_a_finding_is_stored_once_however_often_it_is_found(
    first_day: datetime, agent_actor: Actor, manager: Any
) -> None:
    twice = succeeded_at(agent_actor, manager, first_day + DAY / 2, "re_paid")
    provider = RecordingProvider(
        [
            refund_at(twice, "re_paid", first_day + DAY / 2),
            refund_at(twice, "re_again", first_day + DAY / 2 + timedelta(minutes=5)),
            stray_refund("re_stray", first_day + DAY / 2),
        ]
    )
    first = audit(provider)
    # A second audit over the same history, as if the cursor had been lost.
    LedgerAuditCursor.objects.all().delete()
    second = audit(provider)

    stored = {(K.DUPLICATE_EFFECT, twice, "re_again"), (K.EFFECT_WITHOUT_ACTION, None, "re_stray")}
    assert findings() == {(kind, action.action_id if action else None, ref) for kind, action, ref in stored}
    assert (first.discrepancies_found, first.discrepancies_new) == (2, 2)
    assert (second.discrepancies_found, second.discrepancies_new) == (2, 0)
    for kind, action, reference in stored:
        with pytest.raises(IntegrityError), transaction.atomic():
            Discrepancy.objects.create(kind=kind, action=action, provider_reference=reference)


def test_two_audits_at_once_store_each_finding_once(first_day: datetime) -> None:
    barrier = threading.Barrier(2)
    runs: list[LedgerAuditRun] = []
    errors: list[BaseException] = []

    def one_audit() -> None:
        try:
            provider = RecordingProvider([stray_refund("re_stray", first_day + DAY / 2)], barrier=barrier)
            runs.append(audit(provider))
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=one_audit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert [run.discrepancies_found for run in runs] == [1, 1]
    assert sorted(run.discrepancies_new for run in runs) == [0, 1]
    assert Discrepancy.objects.filter(provider_reference="re_stray").count() == 1


def test_an_effect_across_a_window_edge_from_its_action_is_no_finding(
    first_day: datetime, agent_actor: Actor, manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One action id per query, as if each window named more actions than a statement can take.
    monkeypatch.setattr("actions.engine.ledger.ACTION_IDS_PER_QUERY", 1)
    edge = first_day + DAY
    # Recorded a second before the edge; the receiver's clock, a little ahead, stamped it after.
    skewed = succeeded_at(agent_actor, manager, edge - timedelta(seconds=1), "re_skewed")
    # Created on the first day, settled (and so SUCCEEDED) on the second.
    settled = succeeded_at(agent_actor, manager, edge + timedelta(hours=6), "re_settled")
    # Paid on the first day, paid again on the second: one duplicate, whichever window saw it.
    twice = succeeded_at(agent_actor, manager, first_day + timedelta(hours=2), "re_twice_1")
    # And one the receiver really has no trace of: still found.
    missing = succeeded_at(agent_actor, manager, edge + timedelta(hours=1), "re_missing")
    provider = RecordingProvider(
        [
            refund_at(skewed, "re_skewed", edge + timedelta(seconds=2)),
            refund_at(settled, "re_settled", first_day + timedelta(hours=20)),
            refund_at(twice, "re_twice_1", first_day + timedelta(hours=2)),
            refund_at(twice, "re_twice_2", edge + timedelta(hours=3)),
        ]
    )

    audit(provider)

    assert findings() == {
        (K.DUPLICATE_EFFECT, twice.action_id, "re_twice_1"),
        (K.SUCCEEDED_WITHOUT_EFFECT, missing.action_id, "re_missing"),
    }


def test_a_success_younger_than_the_visibility_delay_waits_for_a_later_run(
    first_day: datetime, agent_actor: Actor, manager: Any
) -> None:
    recent = succeeded_at(agent_actor, manager, timezone.now() - timedelta(seconds=2), "re_not_listed_yet")
    provider = RecordingProvider([])

    assert audit(provider).discrepancies_found == 0
    later = audit(provider, now=timezone.now() + timedelta(hours=1))

    assert later.discrepancies_found == 1
    assert findings() == {(K.SUCCEEDED_WITHOUT_EFFECT, recent.action_id, "re_not_listed_yet")}


@pytest.mark.django_db
def test_the_migration_keeps_one_row_per_finding_the_one_a_person_worked_on(
    agent_actor: Actor, manager: Any
) -> None:
    """The data step before the unique key: duplicates stored by earlier audits are removed."""
    action = succeeded_refund(agent_actor, manager, reference="re_paid")
    # As before the migration: no unique key. The test's transaction is rolled back at its end,
    # and PostgreSQL's DDL with it, so the constraints are back for the next test.
    with connection.schema_editor() as editor:
        for constraint in Discrepancy._meta.constraints:
            editor.remove_constraint(Discrepancy, constraint)
    first = Discrepancy.objects.create(kind=K.DUPLICATE_EFFECT, action=action, provider_reference="re_again")
    worked = Discrepancy.objects.create(
        kind=K.DUPLICATE_EFFECT, action=action, provider_reference="re_again", note="Asked the bank."
    )
    orphans = [Discrepancy.objects.create(kind=K.EFFECT_WITHOUT_ACTION, provider_reference="re_x") for _ in range(3)]
    other = Discrepancy.objects.create(kind=K.AMOUNT_MISMATCH, action=action, provider_reference="re_again")

    migration = importlib.import_module("actions.migrations.0027_ledger_audit_windows")
    migration.discrepancies_deduplicate(apps, None)

    assert set(Discrepancy.objects.values_list("pk", flat=True)) == {worked.pk, orphans[0].pk, other.pk}
    assert first.pk < worked.pk


def test_the_migration_rekeys_an_earlier_duplicate_to_its_first_reference(agent_actor: Actor, manager: Any) -> None:
    """A duplicate stored under another copy's reference before the rule is re-keyed, so the
    next audit finds it on record instead of storing it again; where both keys exist, the row a
    person worked on stays."""
    one = succeeded_refund(agent_actor, manager, reference="re_b1")
    two = succeeded_refund(agent_actor, manager, reference="re_d1")
    # Stored under its second copy's reference: re-keyed to the first.
    alone = Discrepancy.objects.create(
        kind=K.DUPLICATE_EFFECT, action=one, provider_reference="re_b2", details={"effects": ["re_b1", "re_b2"]}
    )
    # Stored twice, once under each key; the one finance wrote a note on is kept.
    worked = Discrepancy.objects.create(
        kind=K.DUPLICATE_EFFECT,
        action=two,
        provider_reference="re_d2",
        details={"effects": ["re_d1", "re_d2"]},
        note="Asked the bank.",
    )
    fresh = Discrepancy.objects.create(
        kind=K.DUPLICATE_EFFECT, action=two, provider_reference="re_d1", details={"effects": ["re_d1", "re_d2"]}
    )

    migration = importlib.import_module("actions.migrations.0029_duplicates_keyed_by_their_first_reference")
    migration.duplicates_rekey(apps, None)

    assert Discrepancy.objects.get(pk=alone.pk).provider_reference == "re_b1"
    assert not Discrepancy.objects.filter(pk=fresh.pk).exists()
    kept = Discrepancy.objects.get(pk=worked.pk)
    assert (kept.provider_reference, kept.note) == ("re_d1", "Asked the bank.")
