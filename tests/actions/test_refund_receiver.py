"""The refund kind's receiver and its words (``actions.kinds.refund``).

The payment provider behind the engine's vocabulary: what a refund request carries, how each
answer and each lookup is read, the ledger, the contract the engine decides from, and what the
kind tells a decider about an order. The engine's tests drive these through an in-memory
receiver that replaces ``RefundReceiver`` whole, so its own reading of the provider had few
direct tests in the mutation subset. The provider here is a stub that records what it was asked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from actions.kinds import kind_for
from actions.kinds.base import Effect, LedgerUnavailable, LookupVerdict, Outcome, StepClass
from actions.kinds.refund.contract import (
    RefundReceiver,
    configured_guarantees,
    effect_from_refund,
    provider_from_settings,
    refund_action_id,
    refund_contract,
    refund_request_for,
)
from actions.models import Action, ActionKind, ActionStatus
from actions.providers.base import (
    CreateRefund,
    DefinitiveError,
    LookupFailed,
    NotFoundError,
    ProviderError,
    ProviderGuarantees,
    ProviderRefund,
    RefundStatus,
)
from actions.providers.stripe_adapter import StripeProvider
from actions.services import Actor
from tests.actions.test_reconciliation import authorized_refund
from tests.approvals.test_reservation import order_of

pytestmark = pytest.mark.django_db
S = ActionStatus

GUARANTEES = ProviderGuarantees(
    honours_idempotency_keys=True,
    key_retention=timedelta(hours=3),
    supports_lookup=True,
    lookup_authoritative=True,
    lookup_visibility_delay=timedelta(seconds=7),
)


def provider_refund(
    action_id: str, *, status: RefundStatus = RefundStatus.SUCCEEDED, id: str = "re_1"
) -> ProviderRefund:
    return ProviderRefund(
        id=id,
        charge="ch_1",
        amount_minor=2000,
        currency="eur",
        status=status,
        metadata={"action_id": action_id},
        created=1_700_000_000,
        raw={"id": id, "object": "refund"},
    )


@dataclass
class StubProvider:
    """Answers with what the test set, and records each call with its arguments."""

    name: str = "stub"
    guarantees: ProviderGuarantees = GUARANTEES
    answer: ProviderRefund | ProviderError | None = None
    found: list[ProviderRefund] | ProviderError = field(default_factory=list)
    ledger: list[ProviderRefund | ProviderError] = field(default_factory=list)
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def create_refund(self, req: CreateRefund) -> ProviderRefund:
        self.calls.append(("create_refund", req))
        assert self.answer is not None
        if isinstance(self.answer, ProviderError):
            raise self.answer
        return self.answer

    def get_refund(self, refund_id: str) -> ProviderRefund:
        self.calls.append(("get_refund", refund_id))
        if isinstance(self.found, ProviderError):
            raise self.found
        return self.found[0]

    def find_refunds(self, *, charge: str, action_id: str | None = None) -> list[ProviderRefund]:
        self.calls.append(("find_refunds", (charge, action_id)))
        if isinstance(self.found, ProviderError):
            raise self.found
        return self.found

    def iter_ledger(
        self, *, created_from: int | None = None, created_before: int | None = None
    ) -> Iterator[ProviderRefund]:
        for entry in self.ledger:
            if isinstance(entry, ProviderError):
                raise entry
            yield entry


@pytest.fixture
def action(agent_actor: Actor) -> Action:
    return authorized_refund(agent_actor)


def stored_as(action: Action, status: str, reference: str) -> Action:
    """The action read back in ``status`` with ``reference`` (the status field is protected)."""
    Action.objects.filter(pk=action.pk).update(status=status, provider_reference=reference)
    return Action.objects.get(pk=action.pk)


# --- the request and the answer ----------------------------------------------------------------


def test_a_refund_request_carries_the_actions_key_charge_amount_in_minor_units_and_id(action: Action) -> None:
    request = refund_request_for(action)
    assert request == CreateRefund(
        idempotency_key=action.idempotency_key,
        charge=action.payload["charge"],
        amount_minor=2000,
        currency="eur",
        metadata={"action_id": action.action_id},
    )


def test_the_providers_refund_becomes_an_effect_in_the_engines_words() -> None:
    effect = effect_from_refund(provider_refund("refund:order-1:request-1", status=RefundStatus.PENDING))
    assert effect == Effect(
        reference="re_1",
        status="pending",
        outcome=Outcome.PENDING,
        amount_minor=2000,
        currency="EUR",
        action_id="refund:order-1:request-1",
        raw={"id": "re_1", "object": "refund"},
    )
    assert effect.raw == {"id": "re_1", "object": "refund"}


def test_a_sent_refund_is_read_as_the_providers_answer_or_its_error(action: Action) -> None:
    provider = StubProvider(answer=provider_refund(action.action_id, status=RefundStatus.FAILED))
    answer = RefundReceiver(provider).send(action)
    assert (answer.outcome, answer.effect and answer.effect.reference) == (Outcome.FAILED_FINAL, "re_1")
    assert provider.calls == [("create_refund", refund_request_for(action))]

    refused = DefinitiveError("charge has been fully refunded", code="charge_already_refunded")
    answer = RefundReceiver(StubProvider(answer=refused)).send(action)
    assert (answer.outcome, answer.error, answer.effect) == (Outcome.FAILED_FINAL, refused, None)


# --- the lookup --------------------------------------------------------------------------------


def test_a_settling_refund_is_looked_up_by_its_reference(action: Action) -> None:
    action = stored_as(action, S.SETTLING, "re_9")
    provider = StubProvider(found=[provider_refund(action.action_id, id="re_9")])
    lookup = RefundReceiver(provider).lookup(action)
    assert provider.calls == [("get_refund", "re_9")]
    assert lookup.verdict == LookupVerdict.FOUND
    assert [effect.reference for effect in lookup.effects] == ["re_9"]


@pytest.mark.parametrize(("status", "reference"), [(S.UNKNOWN, "re_9"), (S.SETTLING, ""), (S.UNKNOWN, "")])
def test_any_other_refund_is_searched_for_by_its_charge_and_action_id(
    action: Action, status: str, reference: str
) -> None:
    action = stored_as(action, status, reference)
    provider = StubProvider(found=[])
    assert RefundReceiver(provider).lookup(action).verdict == LookupVerdict.NOT_FOUND
    assert provider.calls == [("find_refunds", (action.payload["charge"], action.action_id))]

    provider = StubProvider(found=[provider_refund(action.action_id, id="re_a"), provider_refund(action.action_id)])
    lookup = RefundReceiver(provider).lookup(action)
    assert lookup.verdict == LookupVerdict.DUPLICATE and len(lookup.effects) == 2


def test_a_missing_charge_is_inconclusive_but_proves_the_target_missing(action: Action) -> None:
    missing = NotFoundError("No such charge: 'ch_gone'", code="resource_missing", http_status=404)
    lookup = RefundReceiver(StubProvider(found=missing)).lookup(action)
    assert (lookup.verdict, lookup.error, lookup.target_missing) == (LookupVerdict.INCONCLUSIVE, missing, True)


def test_a_lookup_that_fails_is_inconclusive_and_keeps_its_error(action: Action) -> None:
    failed = LookupFailed("bad gateway", http_status=502)
    lookup = RefundReceiver(StubProvider(found=failed)).lookup(action)
    assert (lookup.verdict, lookup.error, lookup.target_missing) == (LookupVerdict.INCONCLUSIVE, failed, False)


def test_the_ledger_yields_every_refund_and_an_unreadable_ledger_says_why() -> None:
    refunds = [provider_refund("a", id="re_a"), provider_refund("b", id="re_b")]
    assert [e.reference for e in RefundReceiver(StubProvider(ledger=list(refunds))).ledger()] == ["re_a", "re_b"]

    broken = StubProvider(ledger=[refunds[0], LookupFailed("service unavailable", http_status=503)])
    read: list[str] = []
    with pytest.raises(LedgerUnavailable, match=r"service unavailable \(http_status=503\)"):
        for effect in RefundReceiver(broken).ledger():
            read.append(effect.reference)
    assert read == ["re_a"]


# --- the contract ------------------------------------------------------------------------------


def test_the_contract_is_the_providers_guarantees_in_the_engines_words() -> None:
    guarantees = ProviderGuarantees(
        honours_idempotency_keys=False,
        key_retention=timedelta(minutes=9),
        supports_lookup=True,
        lookup_authoritative=False,
        lookup_visibility_delay=timedelta(seconds=4),
    )
    contract = refund_contract(guarantees)
    assert (contract.receiver, contract.honours_keys, contract.key_retention) == (
        "provider",
        False,
        timedelta(minutes=9),
    )
    assert (contract.supports_lookup, contract.lookup_authoritative) == (True, False)
    assert contract.lookup_visibility_delay == timedelta(seconds=4)
    assert (contract.can_settle_later, contract.step_class) == (True, StepClass.IRREVERSIBLE)
    assert contract.correction_path == (
        "A failed refund opens a remedy (store credit, transfer, cheque); a duplicate refund "
        "is recovered by a compensating action that finance records."
    )


def test_the_configured_guarantees_come_from_settings_alone(settings: Any) -> None:
    settings.PROVIDER_KEY_RETENTION_SECONDS, settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS = 3600, 9
    assert configured_guarantees() == ProviderGuarantees(
        honours_idempotency_keys=True,
        key_retention=timedelta(hours=1),
        supports_lookup=True,
        lookup_authoritative=True,
        lookup_visibility_delay=timedelta(seconds=9),
    )
    assert kind_for(ActionKind.REFUND).contract() == refund_contract(configured_guarantees())


def test_the_provider_is_built_once_from_settings(settings: Any) -> None:
    settings.PROVIDER_API_KEY, settings.PROVIDER_API_BASE = "sk_test_pinned", "http://127.0.0.1:1/api/"
    settings.PROVIDER_TIMEOUT_SECONDS, settings.PROVIDER_KEY_RETENTION_SECONDS = 3.5, 600
    settings.PROVIDER_LOOKUP_VISIBILITY_DELAY_SECONDS, settings.PROVIDER_VERIFY_CHARGE_CURRENCY = 2, True
    provider_from_settings.cache_clear()
    try:
        provider = provider_from_settings()
        assert isinstance(provider, StripeProvider)
        assert (provider.api_base, provider.timeout_seconds, provider.verify_charge_currency) == (
            "http://127.0.0.1:1/api",
            3.5,
            True,
        )
        assert provider.guarantees.key_retention == timedelta(minutes=10)
        assert provider.guarantees.lookup_visibility_delay == timedelta(seconds=2)
        assert provider_from_settings() is provider
        receiver = kind_for(ActionKind.REFUND).receiver()
        assert isinstance(receiver, RefundReceiver) and receiver.provider is provider
    finally:
        provider_from_settings.cache_clear()


# --- what the kind tells people and deciders ---------------------------------------------------


def test_the_action_id_names_the_order_and_the_request() -> None:
    assert refund_action_id(order_number="4821", request_number=3) == "refund:order-4821:request-3"


def test_the_request_and_lookup_shown_to_finance_are_what_goes_to_the_provider(action: Action) -> None:
    kind = kind_for(ActionKind.REFUND)
    assert kind.request_body(action) == {
        "charge": action.payload["charge"],
        "amount": action.payload["amount"],
        "currency": "EUR",
        "idempotency_key": action.idempotency_key,
        "metadata": {"action_id": action.action_id},
    }
    action.provider_reference = "re_5"
    assert kind.lookup_request(action) == {
        "charge": action.payload["charge"],
        "action_id": action.action_id,
        "refund_id": "re_5",
        "for_status": S.AUTHORIZED,
    }
    assert kind.expected_amount_minor(action) == 2000
    assert kind.target_label(action) == f"order {action.payload['order']}"
    action.payload = {}
    assert kind.target_label(action) == "order -"


def test_a_refund_of_exactly_the_refundable_balance_may_be_approved_one_cent_more_may_not(action: Action) -> None:
    kind = kind_for(ActionKind.REFUND)
    order = order_of(action)
    action.order = order
    assert kind.target_version(action) == order.version
    order.captured_amount = action.amount  # nothing refunded or reserved: exactly the balance
    assert kind.approval_refusal(action) is None
    assert kind.auto_approval_refusal(action) is None
    assert kind.target_balance(action) == (f"order {order.number}'s refundable balance", action.amount)

    order.captured_amount = action.amount - Decimal("0.01")
    assert kind.approval_refusal(action) == (
        "over_refundable_balance",
        f"Order {order.number} has only 19.99 EUR left to refund.",
    )
    assert kind.auto_approval_refusal(action) == "the order no longer covers it"
    assert kind.target_balance(action) == (f"order {order.number}'s refundable balance", Decimal("19.99"))


def test_a_refund_with_no_order_loaded_is_refused_by_the_policy_but_not_by_the_approval_check(action: Action) -> None:
    kind = kind_for(ActionKind.REFUND)
    detached = Action(kind=action.kind, amount=action.amount, currency=action.currency, order=None)
    assert kind.auto_approval_refusal(detached) == "the order no longer covers it"
    assert kind.approval_refusal(detached) is None
