"""Every row of the receiver-answer table (docs/architecture.md section 6), produced by a real sandbox fault.

Each test proposes an auto-approved refund, lets the sandbox answer in one way, and calls the
dispatcher in this process (no worker: the answer, not the process, is under test; the fault
point tests kill real workers). What the console records is checked against what the sandbox
actually stored, because a state is only right if it matches the effect:

| receiver answer                                            | state        |
|------------------------------------------------------------|--------------|
| created, status succeeded                                  | SUCCEEDED    |
| created, status pending                                    | SETTLING     |
| created, status failed or canceled                         | FAILED_FINAL |
| validation error (nothing executed, nothing will be)       | FAILED_FINAL |
| an error an earlier attempt may explain (already refunded) | UNKNOWN      |
| idempotency key reused with different parameters           | NEEDS_REVIEW |
| key in use, rate limited, 5xx, timeout, dropped connection | UNKNOWN      |
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import requests

from actions.engine.dispatch import execution_dispatch
from actions.engine.reconcile import reconcile_action
from actions.kinds.refund.contract import provider_from_settings
from actions.kinds.refund.proposal import action_propose_refund
from actions.models import Action, ActionStatus, Attempt, AttemptKind, Order, Remedy
from actions.providers.money import to_minor_units
from actions.services import Actor
from tests.approvals.test_reservation import assert_order_money_adds_up
from tests.factories import make_order, make_request
from tests.providers.sandbox_client import SandboxClient

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.django_db(transaction=True)]

S = ActionStatus
AMOUNT = Decimal("20.00")


@pytest.fixture(autouse=True)
def fast_settings(settings: Any, live_sandbox: SandboxClient) -> Iterator[None]:
    """A one-second provider timeout keeps the timeout row quick; cheap password hashing keeps
    the finance persona cheap."""
    settings.PROVIDER_TIMEOUT_SECONDS = 1
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    provider_from_settings.cache_clear()
    yield
    provider_from_settings.cache_clear()


@pytest.fixture(autouse=True)
def published(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The dispatcher is called by the test itself; nothing goes to the broker."""
    calls: list[int] = []
    monkeypatch.setattr("actions.foundation.publish.dispatch_enqueue", calls.append)
    return calls


@pytest.fixture
def authorized(live_sandbox: SandboxClient, agent_actor: Actor) -> Callable[..., Action]:
    """An auto-approved refund of 20.00 EUR on a fresh 100.00 EUR order whose charge the sandbox has."""

    def _authorized(*, captured: str = "100.00", charge_currency: str = "eur") -> Action:
        order = make_order(captured=captured)
        live_sandbox.seed_charge(order.charge_reference, to_minor_units(Decimal(captured), "EUR"), charge_currency)
        request = make_request(order)
        result = action_propose_refund(
            order_number=order.number,
            request_number=request.number,
            amount=str(AMOUNT),
            currency="EUR",
            reason_code="damaged",
            proposer=agent_actor,
        )
        assert result.action.status == S.AUTHORIZED
        return result.action

    return _authorized


def refunds_for(sandbox: SandboxClient, action: Action) -> list[dict[str, Any]]:
    return [r for r in sandbox.ledger() if r["metadata"].get("action_id") == action.action_id]


def order_of(action: Action) -> Order:
    assert action.order_id is not None, "a refund always targets an order"
    return Order.objects.get(pk=action.order_id)


def money_of(action: Action) -> tuple[Decimal, Decimal]:
    order = order_of(action)
    return order.refunded_amount, order.reserved_amount


def submission_error(action: Action) -> dict[str, Any]:
    """The error recorded on the action's one submission attempt."""
    [attempt] = Attempt.objects.filter(action=action, kind=AttemptKind.SUBMIT)
    assert attempt.error is not None, f"no error recorded: {attempt.response}"
    return attempt.error


# --- created --------------------------------------------------------------------------------


def test_a_refund_created_as_succeeded_is_recorded_as_succeeded_with_its_reference(
    live_sandbox: SandboxClient, authorized: Callable[..., Action]
) -> None:
    """Invariant 2: a SUCCEEDED action has exactly one effect, and its reference is recorded."""
    action = authorized()

    assert execution_dispatch(action_pk=action.pk) == S.SUCCEEDED

    action.refresh_from_db()
    [refund] = refunds_for(live_sandbox, action)
    assert (action.status, action.provider_reference) == (S.SUCCEEDED, refund["id"])
    assert refund["amount"] == 2000
    assert money_of(action) == (AMOUNT, 0)
    assert_order_money_adds_up(order_of(action))


def test_a_refund_created_as_pending_is_settling_and_keeps_its_reservation(
    live_sandbox: SandboxClient, authorized: Callable[..., Action]
) -> None:
    """Invariant 5: SETTLING holds the reservation until the receiver's final status."""
    action = authorized()
    live_sandbox.fault(mode="pending", settle_after_seconds=3600)

    assert execution_dispatch(action_pk=action.pk) == S.SETTLING

    action.refresh_from_db()
    [refund] = refunds_for(live_sandbox, action)
    assert (refund["status"], action.provider_reference) == ("pending", refund["id"])
    assert action.next_reconcile_at is not None, "the settlement poller must come back to it"
    assert money_of(action) == (0, AMOUNT)
    assert_order_money_adds_up(order_of(action))


@pytest.mark.parametrize("status", ["failed", "canceled"])
def test_a_refund_created_as_failed_or_canceled_is_failed_final_with_a_remedy_and_no_reservation(
    live_sandbox: SandboxClient, authorized: Callable[..., Action], finance: Any, status: str
) -> None:
    """Invariant 5: FAILED_FINAL releases the reservation; the customer still gets a remedy."""
    action = authorized()
    live_sandbox.fault(mode="created_with_status", status=status)

    assert execution_dispatch(action_pk=action.pk) == S.FAILED_FINAL

    action.refresh_from_db()
    [refund] = refunds_for(live_sandbox, action)
    assert (refund["status"], action.provider_reference) == (status, refund["id"])
    assert money_of(action) == (0, 0)
    [remedy] = Remedy.objects.filter(action=action)
    assert (remedy.amount, remedy.currency, remedy.owner) == (AMOUNT, "EUR", finance)
    assert_order_money_adds_up(order_of(action))


# --- refused ----------------------------------------------------------------------------------


def test_a_refund_in_another_currency_than_the_charge_is_failed_final_and_nothing_is_refunded(
    live_sandbox: SandboxClient, authorized: Callable[..., Action], finance: Any
) -> None:
    """Invariant 1: the order says EUR but the charge was made in USD. No charge is read before
    the refund; the refund carries its currency and the receiver refuses the mismatch, which
    proves nothing was executed: FAILED_FINAL, a remedy, and no money moved."""
    action = authorized(charge_currency="usd")

    assert execution_dispatch(action_pk=action.pk) == S.FAILED_FINAL

    assert live_sandbox.ledger() == []
    error = submission_error(action)
    assert (error["code"], error["http_status"]) == ("currency_mismatch", 400)
    assert money_of(action) == (0, 0)
    assert Remedy.objects.get(action=action).owner == finance
    assert_order_money_adds_up(order_of(action))



def test_a_validation_error_is_failed_final_with_a_remedy_and_nothing_at_the_receiver(
    live_sandbox: SandboxClient, authorized: Callable[..., Action], finance: Any
) -> None:
    """Invariant 1: a refusal that proves nothing was executed may be final; nothing was paid."""
    action = authorized()
    live_sandbox.fault(mode="reject_invalid")

    assert execution_dispatch(action_pk=action.pk) == S.FAILED_FINAL

    assert live_sandbox.ledger() == []
    assert submission_error(action)["http_status"] == 400
    assert money_of(action) == (0, 0)
    assert Remedy.objects.get(action=action).owner == finance
    assert_order_money_adds_up(order_of(action))


def test_an_already_refunded_charge_is_unknown_because_an_earlier_attempt_may_have_done_it(
    live_sandbox: SandboxClient, authorized: Callable[..., Action]
) -> None:
    """Invariant 1: an answer an earlier attempt could explain is never taken as a failure
    (FAILED_FINAL would release the money and open a remedy: the customer could be paid twice)."""
    action = authorized()
    charge = action.payload["charge"]
    live_sandbox.plant_refund(charge=charge, amount=10000)

    assert execution_dispatch(action_pk=action.pk) == S.UNKNOWN

    assert submission_error(action)["code"] == "charge_already_refunded"
    assert len(live_sandbox.ledger()) == 1, "only the planted refund"
    assert money_of(action) == (0, AMOUNT)
    assert not Remedy.objects.filter(action=action).exists()
    assert_order_money_adds_up(order_of(action))


def test_a_key_reused_with_different_parameters_needs_review_by_a_named_person_at_once(
    live_sandbox: SandboxClient, authorized: Callable[..., Action], finance: Any
) -> None:
    """Invariants 1 and 8: the key was spent on another payload (a bug); a named person in
    finance owns it, and the reservation is kept until they resolve it."""
    action = authorized()
    first = live_sandbox.post_refund(
        key=action.idempotency_key, charge=action.payload["charge"], amount=999, metadata={"note": "other payload"}
    )
    assert first.status_code == 200

    assert execution_dispatch(action_pk=action.pk) == S.NEEDS_REVIEW

    action.refresh_from_db()
    assert action.owner == finance
    assert action.due_at is not None
    assert action.events.last().transition == "escalate"  # type: ignore[union-attr]
    assert [r["amount"] for r in live_sandbox.ledger()] == [999], "no refund for the console's payload"
    assert money_of(action) == (0, AMOUNT)
    assert_order_money_adds_up(order_of(action))


# --- ambiguous --------------------------------------------------------------------------------


def _key_in_use(sandbox: SandboxClient, action: Action) -> None:
    # An earlier request with the same key and the same parameters (the console's, currency
    # included) is still running at the sandbox (it committed and then hangs), so the dispatcher's request gets a 409.
    sandbox.fault(mode="commit_then_timeout", sleep_seconds=3)
    with pytest.raises(requests.Timeout):
        sandbox.post_refund(
            key=action.idempotency_key,
            timeout=0.3,
            charge=action.payload["charge"],
            amount=to_minor_units(action.amount, action.currency),
            currency=action.currency.lower(),
            metadata={"action_id": action.action_id},
        )


AMBIGUOUS = {
    # name: (set-up, expected error code on the attempt, refunds the sandbox stored)
    "key in use (409)": (_key_in_use, "idempotency_key_in_use", 1),
    "rate limited (429)": (lambda s, a: s.fault(mode="rate_limit"), "rate_limit", 0),
    "500 before commit": (lambda s, a: s.fault(mode="fail_before_commit"), "api_error", 0),
    "500 after commit": (lambda s, a: s.fault(mode="commit_then_500"), "api_error", 1),
    "timeout after commit": (
        lambda s, a: s.fault(mode="commit_then_timeout", sleep_seconds=1.5),
        "connection_error",
        1,
    ),
    "connection dropped after commit": (lambda s, a: s.fault(mode="commit_then_drop"), "connection_error", 1),
}


@pytest.mark.parametrize("case", list(AMBIGUOUS))
def test_an_ambiguous_answer_is_unknown_keeps_the_reservation_and_reconciles_to_one_refund(
    live_sandbox: SandboxClient, authorized: Callable[..., Action], case: str
) -> None:
    """Invariants 1, 2, 5 and 7: an answer that proves nothing is UNKNOWN with the money still
    reserved; reconciliation then asks the receiver first and ends SUCCEEDED with exactly one
    refund, whether the first request took effect or not."""
    set_up, code, stored = AMBIGUOUS[case]
    action = authorized()
    set_up(live_sandbox, action)

    assert execution_dispatch(action_pk=action.pk) == S.UNKNOWN

    action.refresh_from_db()
    assert submission_error(action)["code"] == code
    assert len(refunds_for(live_sandbox, action)) == stored
    assert money_of(action) == (0, AMOUNT)
    assert not Remedy.objects.filter(action=action).exists()
    assert action.next_reconcile_at is not None

    assert action.next_reconcile_at is not None
    reconcile_action(action_pk=action.pk, now=action.next_reconcile_at + timedelta(seconds=1))

    action.refresh_from_db()
    [refund] = refunds_for(live_sandbox, action)
    assert (action.status, action.provider_reference) == (S.SUCCEEDED, refund["id"])
    assert money_of(action) == (AMOUNT, 0)
    assert_order_money_adds_up(order_of(action))


def test_an_already_refunded_charge_that_reconciliation_cannot_explain_goes_to_a_named_person(
    live_sandbox: SandboxClient, authorized: Callable[..., Action], finance: Any, settings: Any
) -> None:
    """Invariants 7 and 8: someone else refunded the whole charge, so the receiver has no refund
    for this action and refuses every resend the same way. After the escalation policy's limit
    the action must go to a named person in finance, not stay UNKNOWN."""
    action = authorized()
    live_sandbox.plant_refund(charge=action.payload["charge"], amount=10000)
    assert execution_dispatch(action_pk=action.pk) == S.UNKNOWN

    for _ in range(settings.RECONCILE_MAX_FAILURES + 2):
        action.refresh_from_db()
        if action.status != S.UNKNOWN:
            break
        assert action.next_reconcile_at is not None
        reconcile_action(action_pk=action.pk, now=action.next_reconcile_at + timedelta(seconds=1))

    action.refresh_from_db()
    assert (action.status, action.owner) == (S.NEEDS_REVIEW, finance)
    assert len(live_sandbox.ledger()) == 1, "only the planted refund"
    assert money_of(action) == (0, AMOUNT)
