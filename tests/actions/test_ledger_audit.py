"""The ledger audit: "has it already happened twice?" (docs/architecture.md section 7).

The audit reads every refund at the receiver (the live sandbox) and compares it with the
console's actions. The discrepancies are planted the way they would arise: a second refund for
an action stored straight into the sandbox's ledger, a refund naming no action the console knows,
a refund whose amount differs from its action's, and a SUCCEEDED action whose refund the
receiver does not have.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.ledger import ledger_audit_run
from actions.engine.record import submission_record
from actions.kinds.refund.contract import RefundReceiver, answer_from_refund, provider_from_settings
from actions.models import Action, ActionStatus, Discrepancy, DiscrepancyKind, DiscrepancyStatus, LedgerAuditRun
from actions.providers.base import ProviderRefund, RefundStatus
from actions.services import Actor
from tests.actions.test_reconciliation import (
    AMOUNT_MINOR,
    PROVIDER_TIMEOUT_SECONDS,
    authorized_refund,
    closed_port_url,
    dispatch_with_fault,
    refunds_at_receiver,
)
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus
K = DiscrepancyKind


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    return dispatched


@pytest.fixture
def sandbox(live_sandbox: SandboxClient, settings: Any) -> SandboxClient:
    settings.PROVIDER_TIMEOUT_SECONDS = PROVIDER_TIMEOUT_SECONDS
    provider_from_settings.cache_clear()
    return live_sandbox


@pytest.fixture
def receiver_down(settings: Any) -> Iterator[None]:
    settings.PROVIDER_API_BASE = closed_port_url()
    settings.PROVIDER_TIMEOUT_SECONDS = PROVIDER_TIMEOUT_SECONDS
    provider_from_settings.cache_clear()
    yield
    provider_from_settings.cache_clear()


def audit_later() -> LedgerAuditRun:
    """An audit an hour from now, past the grace a just-SUCCEEDED action gets for visibility."""
    return ledger_audit_run(
        receivers={"refund": RefundReceiver(provider_from_settings())}, now=timezone.now() + timedelta(hours=1)
    )


def succeeded_without_a_receiver_record(proposer: Actor, sandbox: SandboxClient) -> Action:
    """A worker recorded a success whose refund the receiver has no trace of."""
    action = authorized_refund(proposer)
    sandbox.seed_charge(action.payload["charge"], 10000, "eur")
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED
    assert claim.attempt is not None and claim.lease_token is not None
    raw = {"id": "re_never_made", "object": "refund", "amount": AMOUNT_MINOR, "currency": "eur", "status": "succeeded"}
    refund = ProviderRefund(
        id="re_never_made",
        charge=action.payload["charge"],
        amount_minor=AMOUNT_MINOR,
        currency="eur",
        status=RefundStatus.SUCCEEDED,
        metadata={"action_id": action.action_id},
        created=0,
        raw=raw,
    )
    submission_record(
        action_pk=action.pk,
        attempt_pk=claim.attempt.pk,
        lease_token=claim.lease_token,
        answer=answer_from_refund(refund),
    )
    action.refresh_from_db()
    assert action.status == S.SUCCEEDED
    return action


def discrepancies() -> set[tuple[str, str | None, str]]:
    return {
        (d.kind, d.action.action_id if d.action else None, d.provider_reference)
        for d in Discrepancy.objects.select_related("action")
    }


def audit_command() -> str:
    """``manage.py audit_ledger`` in this process; returns what it printed."""
    out = StringIO()
    call_command("audit_ledger", stdout=out)
    return out.getvalue()


def test_the_audit_finds_nothing_when_the_ledger_matches_the_console(
    sandbox: SandboxClient, agent_actor: Actor
) -> None:
    """Invariants 1 and 2 hold: one effect per SUCCEEDED action; a failed refund is a record, not an
    effect, and a pending one belongs to its SETTLING action."""
    succeeded = dispatch_with_fault(sandbox, agent_actor)
    failed = dispatch_with_fault(sandbox, agent_actor, mode="created_with_status", status="failed")
    pending = dispatch_with_fault(sandbox, agent_actor, mode="pending", settle_after_seconds=3600)
    assert [succeeded.status, failed.status, pending.status] == [S.SUCCEEDED, S.FAILED_FINAL, S.SETTLING]

    run = audit_later()

    assert run.ok, run.error
    assert (run.effects_seen, run.discrepancies_found, run.discrepancies_new) == (3, 0, 0)
    assert not Discrepancy.objects.exists()
    out = audit_command()
    assert "agree" in out


def test_the_audit_records_each_kind_of_discrepancy_once(
    sandbox: SandboxClient, agent_actor: Actor, settings: Any
) -> None:
    """Invariants 1 and 2: a duplicate, an effect with no action, an amount that differs and a
    SUCCEEDED action with no effect are each stored once for finance, not again on the next runs,
    and the command fails on them."""
    # A SUCCEEDED action gets the lookup delay plus one sweep interval before a missing effect
    # counts: ten minutes here, so the command run at the end (at the real time) leaves it out.
    settings.SWEEP_INTERVAL_SECONDS = 600
    twice = dispatch_with_fault(sandbox, agent_actor)
    assert twice.status == S.SUCCEEDED
    [first] = refunds_at_receiver(sandbox, twice)
    charge = twice.payload["charge"]
    second = sandbox.plant_refund(charge=charge, amount=AMOUNT_MINOR, metadata={"action_id": twice.action_id})
    stray = sandbox.plant_refund(charge=charge, amount=500, metadata={"action_id": "refund:order-none:request-1"})
    differs = dispatch_with_fault(sandbox, agent_actor, mode="fail_before_commit")
    assert differs.status == S.UNKNOWN
    wrong_amount = sandbox.plant_refund(
        charge=differs.payload["charge"], amount=AMOUNT_MINOR - 500, metadata={"action_id": differs.action_id}
    )
    lost = succeeded_without_a_receiver_record(agent_actor, sandbox)

    run = audit_later()

    assert not run.error
    assert (run.discrepancies_found, run.discrepancies_new) == (4, 4)
    found = discrepancies()
    duplicate = Discrepancy.objects.get(kind=K.DUPLICATE_EFFECT)
    assert duplicate.action == twice
    assert sorted(duplicate.details["effects"]) == sorted([first["id"], second["id"]])
    assert found == {
        (K.DUPLICATE_EFFECT, twice.action_id, duplicate.provider_reference),
        (K.EFFECT_WITHOUT_ACTION, None, stray["id"]),
        (K.AMOUNT_MISMATCH, differs.action_id, wrong_amount["id"]),
        (K.SUCCEEDED_WITHOUT_EFFECT, lost.action_id, "re_never_made"),
    }
    mismatch = Discrepancy.objects.get(kind=K.AMOUNT_MISMATCH)
    assert mismatch.details["expected"]["amount_minor"] == AMOUNT_MINOR
    assert mismatch.details["found"]["amount_minor"] == AMOUNT_MINOR - 500

    again = audit_later()

    assert (again.discrepancies_found, again.discrepancies_new) == (4, 0)
    assert discrepancies() == found
    # Cron and CI see the findings as a failure (exit status 1), not as a line in a log: every
    # open discrepancy, whichever run found it (this one reads only what is new since the last).
    with pytest.raises(CommandError, match=r"4 open discrepancies between the receivers. ledgers and the console"):
        audit_command()
    assert discrepancies() == found
    assert Discrepancy.objects.count() == 4
    # Once finance has explained each of them, the ledgers agree again.
    Discrepancy.objects.update(status=DiscrepancyStatus.EXPLAINED)
    assert "ledgers and the console agree" in audit_command()


def test_the_audit_command_fails_when_it_cannot_read_the_receivers_ledger(receiver_down: None) -> None:
    """Invariants 1 and 2: an audit that could not look is not a clean audit."""
    with pytest.raises(CommandError, match="Could not read the receiver's ledger"):
        audit_command()

    run = LedgerAuditRun.objects.get()
    assert run.error and not run.ok
