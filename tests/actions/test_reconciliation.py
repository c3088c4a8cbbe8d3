"""Reconciliation of UNKNOWN actions with the receiver (docs/architecture.md section 7).

An action reaches UNKNOWN the way it does in production: proposed, approved by the
auto-approval policy, then dispatched in this process against the live sandbox with a fault
injected at the receiver (commit then time out, commit then 500, fail before commit). Each
reconciliation pass is then driven by hand with ``reconcile_action(now=...)``; the sandbox's
clock is moved forward with the console's ``now`` wherever the receiver's own time matters (key
retention, visibility, settlement). The sandbox's ledger is the witness of what really happened.

The helpers at the top are shared by the other reconciliation test modules.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from actions.engine.claim import ClaimOutcome, submission_begin
from actions.engine.dispatch import execution_dispatch
from actions.engine.reconcile import reconcile_action, reconcile_due
from actions.engine.record import submission_record
from actions.kinds.base import Answer, Outcome
from actions.kinds.refund.contract import RefundReceiver, provider_from_settings
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionEvent, ActionStatus, Attempt, AttemptKind, Order
from actions.providers.base import (
    AmbiguousError,
    CreateRefund,
    NotFoundError,
    Provider,
    ProviderError,
    ProviderGuarantees,
    ProviderRefund,
    RefundStatus,
)
from actions.providers.stripe_adapter import StripeProvider
from actions.services import Actor
from tests.approvals.test_reservation import assert_order_money_adds_up
from tests.factories import make_order, make_request
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

S = ActionStatus

# At or below the EUR auto-approval threshold, so a proposal is authorised in its own commit.
AMOUNT = Decimal("20.00")
AMOUNT_MINOR = 2000
CHARGE_MINOR = 10000
# Short enough to keep the timeout tests quick, long enough for a loaded machine's sandbox.
PROVIDER_TIMEOUT_SECONDS = 1.0
TIMEOUT_FAULT_SLEEP_SECONDS = 2.0


# --- helpers shared with the other reconciliation modules -----------------------------------


def authorized_refund(proposer: Actor, *, captured: str = "100.00") -> Action:
    """A fresh order with one refund request, proposed and authorised by the auto-approval policy."""
    order = make_order(captured=captured)
    request = make_request(order)
    action = action_propose_refund(
        order_number=order.number,
        request_number=request.number,
        amount=str(AMOUNT),
        currency="EUR",
        reason_code="damaged",
        proposer=proposer,
    ).action
    assert action.status == S.AUTHORIZED, action.rejection_reasons
    return action


def dispatch_with_fault(sandbox: SandboxClient, proposer: Actor, **fault: Any) -> Action:
    """Authorise a refund, seed its charge at the sandbox, queue ``fault`` for it and dispatch it here."""
    action = authorized_refund(proposer)
    sandbox.seed_charge(action.payload["charge"], CHARGE_MINOR, "eur")
    if fault:
        sandbox.fault(action_id=action.action_id, **fault)
    execution_dispatch(action_pk=action.pk)
    return Action.objects.get(pk=action.pk)


def unknown_without_receiver(proposer: Actor) -> Action:
    """AUTHORIZED -> SUBMITTING -> UNKNOWN as after a timeout, without calling any receiver."""
    action = authorized_refund(proposer)
    claim = submission_begin(action_pk=action.pk)
    assert claim.outcome == ClaimOutcome.CLAIMED
    assert claim.attempt is not None and claim.lease_token is not None
    submission_record(
        action_pk=action.pk,
        attempt_pk=claim.attempt.pk,
        lease_token=claim.lease_token,
        answer=Answer(Outcome.UNKNOWN, error=AmbiguousError("read timed out", code="connection_error")),
    )
    action = Action.objects.get(pk=action.pk)
    assert action.status == S.UNKNOWN
    return action


def unknown_and_due(proposer: Actor) -> Action:
    """UNKNOWN after a timeout, as ``unknown_without_receiver``, with its reconciliation due now."""
    action = unknown_without_receiver(proposer)
    Action.objects.filter(pk=action.pk).update(next_reconcile_at=timezone.now() - timedelta(seconds=1))
    action.refresh_from_db()
    return action


def refunds_at_receiver(sandbox: SandboxClient, action: Action) -> list[dict[str, Any]]:
    """Every refund the sandbox stored for the action, visible or not."""
    return [refund for refund in sandbox.ledger() if refund["metadata"].get("action_id") == action.action_id]


def submit_attempts(action: Action) -> list[Attempt]:
    return list(Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT).order_by("pk"))


def lookup_attempts(action: Action) -> list[Attempt]:
    return list(Attempt.objects.filter(action=action, kind=AttemptKind.LOOKUP).order_by("pk"))


def transitions(action: Action) -> list[str]:
    """The action's audit trail, in the order it was written."""
    return list(ActionEvent.objects.filter(action=action).order_by("pk").values_list("transition", flat=True))


def order_money(action: Action) -> tuple[Decimal, Decimal]:
    """(refunded, reserved) of the action's order, as stored."""
    order = Order.objects.get(actions=action)
    assert_order_money_adds_up(order)
    return order.refunded_amount, order.reserved_amount


def align_receiver_clock(sandbox: SandboxClient, now: datetime) -> None:
    """Move the sandbox's clock forward to the console's ``now`` (it only goes forward)."""
    ahead = now.timestamp() - float(sandbox.control("GET", "clock")["now"])
    if ahead > 0:
        sandbox.advance_clock(ahead)


def sandbox_provider(
    sandbox: SandboxClient,
    *,
    key_retention: timedelta = timedelta(hours=24),
    lookup_visibility_delay: timedelta = timedelta(seconds=2),
    api_base: str | None = None,
) -> StripeProvider:
    """The production Stripe adapter, pointed at the sandbox, with the guarantees a test needs."""
    return StripeProvider(
        api_key=settings.PROVIDER_API_KEY,
        api_base=api_base or sandbox.url,
        timeout_seconds=PROVIDER_TIMEOUT_SECONDS,
        key_retention=key_retention,
        lookup_visibility_delay=lookup_visibility_delay,
    )


def closed_port_url() -> str:
    """The address of a local port nothing listens on: every request is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def guarantees(
    *,
    keys: bool,
    lookup: bool,
    authoritative: bool,
    key_retention: timedelta | None = None,
    visibility: timedelta = timedelta(0),
) -> ProviderGuarantees:
    return ProviderGuarantees(
        honours_idempotency_keys=keys,
        key_retention=key_retention,
        supports_lookup=lookup,
        lookup_authoritative=authoritative,
        lookup_visibility_delay=visibility,
    )


NO_LOOKUP_NO_KEYS = guarantees(keys=False, lookup=False, authoritative=False)


@dataclass
class FakeReceiver:
    """An in-memory receiver implementing the Provider protocol, recording every call made to it."""

    guarantees: ProviderGuarantees
    name: str = "fake"
    refunds: list[ProviderRefund] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    # Raised by create_refund instead of answering, e.g. a timeout.
    create_error: ProviderError | None = None

    def create_refund(self, req: CreateRefund) -> ProviderRefund:
        self.calls.append("create_refund")
        if self.create_error is not None:
            raise self.create_error
        refund_id = f"re_fake_{len(self.refunds) + 1}"
        raw = {
            "id": refund_id,
            "object": "refund",
            "charge": req.charge,
            "amount": req.amount_minor,
            "currency": req.currency,
            "status": "succeeded",
            "metadata": dict(req.metadata),
        }
        refund = ProviderRefund(
            id=refund_id,
            charge=req.charge,
            amount_minor=req.amount_minor,
            currency=req.currency,
            status=RefundStatus.SUCCEEDED,
            metadata=dict(req.metadata),
            created=int(time.time()),
            raw=raw,
        )
        self.refunds.append(refund)
        return refund

    def get_refund(self, refund_id: str) -> ProviderRefund:
        self.calls.append("get_refund")
        for refund in self.refunds:
            if refund.id == refund_id:
                return refund
        raise NotFoundError(f"no refund {refund_id}", code="resource_missing", http_status=404)

    def find_refunds(self, *, charge: str, action_id: str | None = None) -> list[ProviderRefund]:
        self.calls.append("find_refunds")
        return [r for r in self.refunds if r.charge == charge and action_id in (None, r.action_id)]

    def iter_ledger(
        self, *, created_from: int | None = None, created_before: int | None = None
    ) -> Iterator[ProviderRefund]:
        self.calls.append("iter_ledger")
        return iter(list(self.refunds))


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_broker(dispatched: list[int]) -> list[int]:
    """Approval publishes its dispatch on commit; here the test dispatches in this process instead."""
    return dispatched


@pytest.fixture
def sandbox(live_sandbox: SandboxClient, settings: Any) -> SandboxClient:
    """The live sandbox, with the console's configured provider on a short timeout."""
    settings.PROVIDER_TIMEOUT_SECONDS = PROVIDER_TIMEOUT_SECONDS
    provider_from_settings.cache_clear()
    return live_sandbox


@pytest.fixture
def unreachable_configured_provider(settings: Any) -> Iterator[str]:
    """Point the console's configured provider at a closed port, and forget it afterwards."""
    settings.PROVIDER_API_BASE = closed_port_url()
    settings.PROVIDER_TIMEOUT_SECONDS = PROVIDER_TIMEOUT_SECONDS
    provider_from_settings.cache_clear()
    yield settings.PROVIDER_API_BASE
    provider_from_settings.cache_clear()


# --- found ------------------------------------------------------------------------------------


def test_a_refund_committed_before_a_timeout_is_found_and_recorded_once(
    sandbox: SandboxClient, agent_actor: Actor
) -> None:
    """Invariants 1, 2, 5 and 7: the receiver committed, the answer timed out; reconciliation finds
    the refund by the action id, records SUCCEEDED with its reference, books the money and sends
    nothing again."""
    action = dispatch_with_fault(
        sandbox, agent_actor, mode="commit_then_timeout", sleep_seconds=TIMEOUT_FAULT_SLEEP_SECONDS
    )
    assert action.status == S.UNKNOWN
    [attempt] = submit_attempts(action)
    assert attempt.error is not None and attempt.error["type"] == "AmbiguousError"
    assert order_money(action) == (Decimal("0.00"), AMOUNT)

    result = reconcile_action(
        action_pk=action.pk, receiver=RefundReceiver(provider_from_settings()), now=action.next_reconcile_at
    )

    assert result == S.SUCCEEDED
    action.refresh_from_db()
    [refund] = refunds_at_receiver(sandbox, action)
    assert action.status == S.SUCCEEDED
    assert action.provider_reference == refund["id"]
    assert order_money(action) == (AMOUNT, Decimal("0.00"))
    assert len(submit_attempts(action)) == 1, "nothing may be re-sent once the receiver has the refund"
    assert [a.outcome for a in lookup_attempts(action)] == ["found"]
    assert transitions(action)[-2:] == ["mark_unknown", "reconcile_found"]


def test_past_key_retention_the_first_refund_is_found_before_anything_is_sent_again(
    sandbox: SandboxClient, agent_actor: Actor
) -> None:
    """Invariants 1 and 7: the receiver has forgotten the key (a resend would execute again), yet
    there is no duplicate, because the lookup by action id comes before any retry."""
    action = dispatch_with_fault(
        sandbox, agent_actor, mode="commit_then_timeout", sleep_seconds=TIMEOUT_FAULT_SLEEP_SECONDS
    )
    assert action.status == S.UNKNOWN and action.first_attempt_at is not None
    provider = sandbox_provider(sandbox, key_retention=timedelta(hours=24))
    now = action.first_attempt_at + timedelta(hours=25)
    align_receiver_clock(sandbox, now)

    result = reconcile_action(action_pk=action.pk, receiver=RefundReceiver(provider), now=now)

    assert result == S.SUCCEEDED
    action.refresh_from_db()
    [refund] = refunds_at_receiver(sandbox, action)
    assert action.provider_reference == refund["id"]
    assert len(submit_attempts(action)) == 1
    assert "retry" not in transitions(action)
    assert order_money(action) == (AMOUNT, Decimal("0.00"))


# --- not found --------------------------------------------------------------------------------


def test_an_authoritative_not_found_past_key_retention_allows_one_retry_with_the_same_key(
    sandbox: SandboxClient, agent_actor: Actor
) -> None:
    """Invariants 1, 3 and 7: nothing was committed and the receiver has forgotten the key; its
    authoritative not-found (the sandbox lists a refund as soon as it exists) allows one retry under
    a new lease with the same key, and that retry makes the one and only refund."""
    sandbox.configure(key_retention_seconds=1, lookup_visibility_delay_seconds=0)
    action = dispatch_with_fault(sandbox, agent_actor, mode="fail_before_commit")
    assert action.status == S.UNKNOWN
    assert refunds_at_receiver(sandbox, action) == []
    provider = sandbox_provider(sandbox, key_retention=timedelta(seconds=1), lookup_visibility_delay=timedelta(0))
    assert action.next_reconcile_at is not None
    now = action.next_reconcile_at
    align_receiver_clock(sandbox, now)

    result = reconcile_action(action_pk=action.pk, receiver=RefundReceiver(provider), now=now)

    assert result == S.SUCCEEDED
    action.refresh_from_db()
    [refund] = refunds_at_receiver(sandbox, action)
    assert action.provider_reference == refund["id"]
    assert refund["sandbox"]["idempotency_key"] == action.idempotency_key
    first, retry = submit_attempts(action)
    assert first.idempotency_key == retry.idempotency_key == action.action_id
    assert first.lease_token != retry.lease_token, "a retry takes a new lease"
    assert first.error is not None and first.response is None
    assert retry.response is not None and retry.response["id"] == refund["id"]
    assert [a.outcome for a in lookup_attempts(action)] == ["not_found"]
    assert transitions(action)[-3:] == ["mark_unknown", "retry", "record_success"]
    assert action.attempt_count == 2
    assert order_money(action) == (AMOUNT, Decimal("0.00"))


def test_the_visibility_delay_is_judged_as_of_the_pass_not_as_of_the_wall_clock(agent_actor: Actor) -> None:
    """Invariant 7: a pass decides as of the time its lookup was made. Here that is well past the
    receiver's visibility delay, so its authoritative not-found allows the retry; judging by the
    moment the answer happens to be recorded instead would make the decision depend on timing."""
    action = unknown_without_receiver(agent_actor)
    visibility = timedelta(seconds=5)
    receiver = FakeReceiver(
        guarantees=guarantees(
            keys=True, lookup=True, authoritative=True, key_retention=timedelta(seconds=1), visibility=visibility
        )
    )
    assert action.next_reconcile_at is not None and action.last_attempt_at is not None
    now = max(action.next_reconcile_at, action.last_attempt_at + visibility + timedelta(seconds=1))

    result = reconcile_action(action_pk=action.pk, receiver=RefundReceiver(receiver), now=now)

    assert receiver.calls == ["find_refunds", "create_refund"]
    assert result == S.SUCCEEDED


def test_inside_key_retention_a_not_found_is_resent_with_the_same_key_without_waiting(
    sandbox: SandboxClient, agent_actor: Actor
) -> None:
    """Invariants 1 and 7: inside the receiver's key retention a resend with the same key is
    replayed or executed once, so it need not wait for the lookup to catch up."""
    action = dispatch_with_fault(sandbox, agent_actor, mode="fail_before_commit")
    provider = sandbox_provider(sandbox, key_retention=timedelta(hours=24), lookup_visibility_delay=timedelta(hours=1))

    result = reconcile_action(action_pk=action.pk, receiver=RefundReceiver(provider), now=action.next_reconcile_at)

    assert result == S.SUCCEEDED
    assert len(refunds_at_receiver(sandbox, action)) == 1
    assert [a.idempotency_key for a in submit_attempts(action)] == [action.idempotency_key] * 2


def test_no_retry_while_the_receivers_lookup_may_still_be_catching_up(
    sandbox: SandboxClient, agent_actor: Actor
) -> None:
    """Invariants 1 and 7: the refund exists but is not listed yet, and the receiver has forgotten
    the key; a not-found younger than the visibility delay proves nothing, so the action stays
    UNKNOWN and nothing is re-sent."""
    visibility = timedelta(minutes=10)
    sandbox.configure(lookup_visibility_delay_seconds=visibility.total_seconds(), key_retention_seconds=1)
    action = dispatch_with_fault(sandbox, agent_actor, mode="commit_then_500")
    assert action.status == S.UNKNOWN
    provider = sandbox_provider(sandbox, key_retention=timedelta(seconds=1), lookup_visibility_delay=visibility)
    assert action.next_reconcile_at is not None and action.last_attempt_at is not None
    now = action.next_reconcile_at
    assert now < action.last_attempt_at + visibility
    align_receiver_clock(sandbox, now)
    [hidden] = refunds_at_receiver(sandbox, action)
    assert not hidden["sandbox"]["visible"]

    result = reconcile_action(action_pk=action.pk, receiver=RefundReceiver(provider), now=now)

    assert result == "too_early"
    action.refresh_from_db()
    assert action.status == S.UNKNOWN
    assert action.lease_token is None, "the reconciler's lease is given back"
    assert action.next_reconcile_at is not None, "polling goes on"
    assert len(submit_attempts(action)) == 1
    assert len(refunds_at_receiver(sandbox, action)) == 1
    assert [a.outcome for a in lookup_attempts(action)] == ["not_found"]
    assert "retry" not in transitions(action)
    assert order_money(action) == (Decimal("0.00"), AMOUNT)


# --- inconclusive and escalation ------------------------------------------------------------


def test_a_receiver_unreachable_beyond_the_policy_goes_to_a_named_person_and_polling_stops(
    sandbox: SandboxClient, agent_actor: Actor, finance: Any, settings: Any
) -> None:
    """Invariants 7 and 8: failed lookups keep the action UNKNOWN until the policy's limit, then it
    goes to NEEDS_REVIEW with a named owner and a due time, and no sweep asks again."""
    settings.RECONCILE_MAX_FAILURES = 3
    action = dispatch_with_fault(sandbox, agent_actor, mode="commit_then_500")
    assert action.status == S.UNKNOWN
    unreachable = sandbox_provider(sandbox, api_base=closed_port_url())

    results = []
    for _ in range(settings.RECONCILE_MAX_FAILURES):
        action.refresh_from_db()
        assert action.next_reconcile_at is not None
        now = action.next_reconcile_at
        results.append(reconcile_action(action_pk=action.pk, receiver=RefundReceiver(unreachable), now=now))

    assert results == ["inconclusive", "inconclusive", S.NEEDS_REVIEW]
    action.refresh_from_db()
    assert action.status == S.NEEDS_REVIEW
    assert action.owner == finance
    assert action.due_at is not None
    assert action.next_reconcile_at is None
    assert action.reconcile_failures == settings.RECONCILE_MAX_FAILURES
    assert (action.lease_token, action.lease_expires_at) == (None, None), "the reconciler's lease is given up"
    assert [a.outcome for a in lookup_attempts(action)] == ["inconclusive"] * 3
    escalation = ActionEvent.objects.get(action=action, transition="escalate")
    assert escalation.evidence["owner"] == finance.get_username()
    assert "3 reconciliation attempts" in escalation.reason

    later = now + timedelta(days=365)
    assert action.pk not in reconcile_due(now=later)
    assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(unreachable), now=later) == "not_due"
    assert len(lookup_attempts(action)) == 3, "nobody asks the receiver after escalation"
    assert order_money(action) == (Decimal("0.00"), AMOUNT), "the reservation is held through review"


def test_a_receiver_with_no_lookup_and_no_keys_escalates_on_the_first_pass(agent_actor: Actor, finance: Any) -> None:
    """Invariants 1, 7 and 8: nothing can prove what such a receiver did, so the first pass hands
    the action to a person without asking the receiver or sending anything again."""
    action = unknown_without_receiver(agent_actor)
    receiver = FakeReceiver(guarantees=NO_LOOKUP_NO_KEYS)
    assert isinstance(receiver, Provider)
    assert action.next_reconcile_at is not None
    early = action.next_reconcile_at - timedelta(seconds=1)
    assert action.pk not in reconcile_due(now=early)
    assert reconcile_action(action_pk=action.pk, receiver=RefundReceiver(receiver), now=early) == "not_due", (
        "the backoff holds"
    )
    assert action.pk in reconcile_due(now=action.next_reconcile_at)

    result = reconcile_action(action_pk=action.pk, receiver=RefundReceiver(receiver), now=action.next_reconcile_at)

    assert result == S.NEEDS_REVIEW
    assert receiver.calls == []
    action.refresh_from_db()
    assert action.owner == finance
    assert action.due_at is not None
    assert action.next_reconcile_at is None
    assert action.reconcile_failures == 0, "escalated at once, not after the failure policy"
    assert [a.outcome for a in lookup_attempts(action)] == ["no_lookup"]
    assert transitions(action)[-2:] == ["mark_unknown", "escalate"]


def test_a_timeout_from_a_receiver_with_no_lookup_and_no_keys_goes_straight_to_a_person(
    agent_actor: Actor, finance: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariants 7 and 8 (docs/architecture.md section 4, SUBMITTING -> NEEDS_REVIEW): when such a receiver's
    answer is lost, no reconciliation can ever tell what happened, so the action goes to a named
    person at once instead of waiting in UNKNOWN for a reconciler that can only give up."""
    receiver = FakeReceiver(
        guarantees=NO_LOOKUP_NO_KEYS, create_error=AmbiguousError("read timed out", code="connection_error")
    )
    monkeypatch.setattr("actions.kinds.refund.contract.provider_from_settings", lambda: receiver)
    action = authorized_refund(agent_actor)

    execution_dispatch(action_pk=action.pk)

    action.refresh_from_db()
    assert receiver.calls == ["create_refund"]
    assert action.status == S.NEEDS_REVIEW
    assert action.owner == finance
    assert action.next_reconcile_at is None
    assert transitions(action)[-2:] == ["begin_submission", "escalate"]
    assert order_money(action) == (Decimal("0.00"), AMOUNT), "the reservation is held through review"


def test_a_not_found_from_a_lookup_that_is_not_authoritative_ends_with_a_person(
    agent_actor: Actor, finance: Any, settings: Any
) -> None:
    """Invariants 7 and 8: past key retention, a receiver whose lookups are not authoritative can
    never allow a retry, so the action may not poll in UNKNOWN for ever: within the escalation
    policy it reaches a named person, and nothing is re-sent."""
    settings.RECONCILE_MAX_FAILURES = 3
    action = unknown_without_receiver(agent_actor)
    receiver = FakeReceiver(
        guarantees=guarantees(keys=True, lookup=True, authoritative=False, key_retention=timedelta(seconds=1))
    )

    for _ in range(settings.RECONCILE_MAX_FAILURES):
        action.refresh_from_db()
        if action.status != S.UNKNOWN:
            break
        assert action.next_reconcile_at is not None
        reconcile_action(action_pk=action.pk, receiver=RefundReceiver(receiver), now=action.next_reconcile_at)

    action.refresh_from_db()
    assert action.status == S.NEEDS_REVIEW
    assert action.owner == finance
    assert "create_refund" not in receiver.calls


def test_a_retry_goes_to_the_receiver_that_was_asked(agent_actor: Actor, unreachable_configured_provider: str) -> None:
    """Invariants 1 and 2: the evidence for a retry comes from one receiver, so the retry must go
    to that same receiver, not to whichever one the settings name."""
    action = unknown_without_receiver(agent_actor)
    receiver = FakeReceiver(
        guarantees=guarantees(keys=True, lookup=True, authoritative=True, key_retention=timedelta(hours=24))
    )

    result = reconcile_action(action_pk=action.pk, receiver=RefundReceiver(receiver), now=action.next_reconcile_at)

    assert receiver.calls == ["find_refunds", "create_refund"]
    assert result == S.SUCCEEDED
    action.refresh_from_db()
    assert action.provider_reference == receiver.refunds[0].id
