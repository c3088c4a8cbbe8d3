"""The Stripe adapter against the sandbox: every row of docs/architecture.md section 6 maps to one outcome.

| receiver answer                                   | adapter result                  |
|---------------------------------------------------|---------------------------------|
| created, succeeded / pending / failed / canceled  | ProviderRefund with that status |
| validation error proving nothing was executed     | DefinitiveError                 |
| error that an earlier attempt may explain         | AmbiguousError                  |
| key reused with different parameters              | IdempotencyMismatchError        |
| key in use, 429, 5xx, timeout, dropped connection | AmbiguousError                  |
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from actions.providers.base import (
    AmbiguousError,
    ConfigurationError,
    CreateRefund,
    DefinitiveError,
    IdempotencyMismatchError,
    LookupFailed,
    NotFoundError,
    ProviderError,
    RefundStatus,
)
from actions.providers.stripe_adapter import (
    StripeProvider,
)
from tests.providers.sandbox_client import API_KEY, SandboxClient, wait_for

pytestmark = pytest.mark.processes

ACTION = "refund:order-4821:request-3"


def _request(action_id: str = ACTION, **overrides: Any) -> CreateRefund:
    fields: dict[str, Any] = {
        "idempotency_key": action_id,
        "charge": "ch_1",
        "amount_minor": 1000,
        "currency": "eur",
        "metadata": {"action_id": action_id},
        "reason": "requested_by_customer",
    }
    fields.update(overrides)
    return CreateRefund(**fields)


@pytest.fixture
def charge(sandbox: SandboxClient) -> dict[str, Any]:
    return sandbox.seed_charge("ch_1", 5000, "eur")


def _assert_ambiguous_not_definitive(error: ProviderError) -> None:
    assert isinstance(error, AmbiguousError)
    assert not isinstance(error, (DefinitiveError, IdempotencyMismatchError))


# -- section 6 rows against the sandbox -------------------------------------------------------


def test_a_created_refund_that_succeeded_is_returned_with_its_evidence(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    refund = provider.create_refund(_request())
    assert refund.status is RefundStatus.SUCCEEDED
    assert (refund.charge, refund.amount_minor, refund.currency) == ("ch_1", 1000, "eur")
    assert refund.metadata == {"action_id": ACTION}
    assert refund.raw["id"] == refund.id
    [stored] = sandbox.ledger()
    assert stored["id"] == refund.id
    assert stored["sandbox"]["idempotency_key"] == ACTION
    assert stored["reason"] == "requested_by_customer"


def test_a_created_refund_that_is_pending_is_returned_as_pending(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    sandbox.fault(mode="pending", settle_after_seconds=60)
    refund = provider.create_refund(_request())
    assert refund.status is RefundStatus.PENDING
    sandbox.advance_clock(61)
    assert provider.get_refund(refund.id).status is RefundStatus.SUCCEEDED


@pytest.mark.parametrize("status", ["failed", "canceled"])
def test_a_created_refund_that_failed_or_was_canceled_is_returned_not_raised(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any, status: str
) -> None:
    sandbox.fault(mode="created_with_status", status=status)
    refund = provider.create_refund(_request())
    assert refund.status == RefundStatus(status)
    assert refund.status.is_final


def test_a_validation_error_is_definitive_and_nothing_was_stored(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    sandbox.fault(mode="reject_invalid")
    with pytest.raises(DefinitiveError) as caught:
        provider.create_refund(_request())
    assert caught.value.http_status == 400
    assert caught.value.raw is not None
    assert sandbox.ledger() == []


def test_a_currency_mismatch_is_definitive_and_nothing_is_refunded(
    provider: StripeProvider, sandbox: SandboxClient
) -> None:
    sandbox.seed_charge("ch_jpy", 5000, "jpy")
    with pytest.raises(DefinitiveError) as caught:
        provider.create_refund(_request(charge="ch_jpy", currency="eur"))
    assert caught.value.code == "currency_mismatch"
    assert caught.value.http_status == 400
    assert sandbox.ledger() == []


def test_a_refund_costs_one_call_with_no_charge_read_before_it(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_charge_read(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the charge was read before the refund")

    monkeypatch.setattr(provider._client.v1.charges, "retrieve", no_charge_read)
    refund = provider.create_refund(_request())
    assert refund.currency == "eur"
    assert len(sandbox.ledger()) == 1


def test_the_optional_charge_read_also_refuses_a_currency_mismatch_before_sending(
    sandbox: SandboxClient,
) -> None:
    sandbox.seed_charge("ch_jpy", 5000, "jpy")
    provider = StripeProvider(api_key=API_KEY, api_base=sandbox.url, timeout_seconds=0.5, verify_charge_currency=True)
    with pytest.raises(DefinitiveError) as caught:
        provider.create_refund(_request(charge="ch_jpy", currency="eur"))
    assert caught.value.code == "currency_mismatch"
    assert caught.value.http_status is None, "refused by the console's own check, before any refund request"
    assert sandbox.ledger() == []


def test_a_refund_on_a_missing_charge_is_definitive(provider: StripeProvider, sandbox: SandboxClient) -> None:
    with pytest.raises(DefinitiveError) as caught:
        provider.create_refund(_request(charge="ch_missing"))
    assert caught.value.code == "resource_missing"


def test_charge_already_refunded_is_ambiguous_because_an_earlier_attempt_may_explain_it(
    provider: StripeProvider, sandbox: SandboxClient
) -> None:
    sandbox.seed_charge("ch_1", 1000)
    provider.create_refund(_request("refund:order-1:first", amount_minor=1000))
    with pytest.raises(AmbiguousError) as caught:
        provider.create_refund(_request("refund:order-1:second", amount_minor=1000))
    _assert_ambiguous_not_definitive(caught.value)
    assert caught.value.code == "charge_already_refunded"


def test_an_amount_above_the_unrefunded_remainder_is_ambiguous(
    provider: StripeProvider, sandbox: SandboxClient
) -> None:
    sandbox.seed_charge("ch_1", 1000)
    provider.create_refund(_request("refund:order-1:first", amount_minor=600))
    with pytest.raises(AmbiguousError) as caught:
        provider.create_refund(_request("refund:order-1:second", amount_minor=600))
    _assert_ambiguous_not_definitive(caught.value)
    assert caught.value.code == "amount_too_large"


def test_a_key_reused_with_different_parameters_is_an_idempotency_mismatch(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    provider.create_refund(_request(amount_minor=1000))
    with pytest.raises(IdempotencyMismatchError) as caught:
        provider.create_refund(_request(amount_minor=1200))
    assert caught.value.http_status == 400
    assert len(sandbox.ledger()) == 1


def test_a_key_in_use_by_a_concurrent_request_is_ambiguous(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    sandbox.fault(mode="slow", sleep_seconds=1.0)
    slow_provider = StripeProvider(api_key=API_KEY, api_base=sandbox.url, timeout_seconds=5)
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(slow_provider.create_refund(_request())))
    thread.start()
    wait_for(lambda: sandbox.faults()["fired"].get("create:slow") == 1, what="the slow request")
    with pytest.raises(AmbiguousError) as caught:
        provider.create_refund(_request())
    thread.join()
    assert caught.value.code == "idempotency_key_in_use"
    assert caught.value.http_status == 409
    assert results[0].status is RefundStatus.SUCCEEDED
    assert len(sandbox.ledger()) == 1


def test_a_rate_limit_is_ambiguous_and_not_retried_by_the_library(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    sandbox.fault(mode="rate_limit")
    with pytest.raises(AmbiguousError) as caught:
        provider.create_refund(_request())
    assert (caught.value.code, caught.value.http_status) == ("rate_limit", 429)
    assert sandbox.ledger() == []


def test_a_500_before_commit_is_ambiguous_and_not_retried_by_the_library(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    # One queued fault: a library retry would succeed and hide the error.
    sandbox.fault(mode="fail_before_commit", times=1)
    with pytest.raises(AmbiguousError) as caught:
        provider.create_refund(_request())
    assert caught.value.http_status == 500
    assert sandbox.ledger() == []


def test_a_500_after_commit_is_ambiguous_and_a_resend_with_the_key_replays_the_refund(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    sandbox.fault(mode="commit_then_500")
    with pytest.raises(AmbiguousError):
        provider.create_refund(_request())
    [stored] = sandbox.ledger()
    assert provider.create_refund(_request()).id == stored["id"]
    assert len(sandbox.ledger()) == 1


def test_a_timeout_is_ambiguous_and_the_timeout_is_the_adapters(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    sandbox.fault(mode="commit_then_timeout", sleep_seconds=2.0)
    started = time.monotonic()
    with pytest.raises(AmbiguousError) as caught:
        provider.create_refund(_request())
    assert time.monotonic() - started < 1.5  # 0.5 s timeout, not the library's 80 s
    assert caught.value.code == "connection_error"
    assert len(sandbox.ledger()) == 1


def test_a_dropped_connection_is_ambiguous(provider: StripeProvider, sandbox: SandboxClient, charge: Any) -> None:
    sandbox.fault(mode="commit_then_drop")
    with pytest.raises(AmbiguousError) as caught:
        provider.create_refund(_request())
    assert caught.value.code == "connection_error"
    [stored] = sandbox.ledger()
    assert provider.find_refunds(charge="ch_1", action_id=ACTION)[0].id == stored["id"]


def test_a_rejected_api_key_is_a_configuration_error_not_a_definitive_failure(
    sandbox: SandboxClient, charge: Any
) -> None:
    provider = StripeProvider(api_key="sk_live_wrong", api_base=sandbox.url, timeout_seconds=2)
    with pytest.raises(ConfigurationError) as caught:
        provider.create_refund(_request())
    _assert_ambiguous_not_definitive(caught.value)
    assert caught.value.http_status == 401
    with pytest.raises(LookupFailed):
        provider.get_refund("re_1")


def test_a_failed_optional_charge_read_before_creating_is_ambiguous_and_sends_nothing(
    sandbox: SandboxClient, charge: Any
) -> None:
    provider = StripeProvider(api_key=API_KEY, api_base=sandbox.url, timeout_seconds=0.5, verify_charge_currency=True)
    sandbox.fault(mode="fail_before_commit", applies_to="lookup")
    with pytest.raises(AmbiguousError) as caught:
        provider.create_refund(_request())
    _assert_ambiguous_not_definitive(caught.value)
    assert sandbox.ledger() == []
    assert provider.create_refund(_request()).status is RefundStatus.SUCCEEDED


# -- lookups -----------------------------------------------------------------------------------


def test_get_refund_finds_a_refund_by_id_or_says_authoritatively_that_none_exists(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    created = provider.create_refund(_request())
    assert provider.get_refund(created.id) == created
    with pytest.raises(NotFoundError) as caught:
        provider.get_refund("re_does_not_exist")
    assert caught.value.http_status == 404


def test_a_lookup_that_fails_is_inconclusive_not_a_not_found(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    created = provider.create_refund(_request())
    sandbox.fault(mode="fail_before_commit", applies_to="lookup", times=2)
    with pytest.raises(LookupFailed):
        provider.get_refund(created.id)
    with pytest.raises(LookupFailed):
        provider.find_refunds(charge="ch_1", action_id=ACTION)
    sandbox.fault(mode="rate_limit", applies_to="lookup")
    with pytest.raises(LookupFailed):
        provider.get_refund(created.id)


def test_find_refunds_filters_on_the_action_id_and_follows_pagination(sandbox: SandboxClient, charge: Any) -> None:
    provider = StripeProvider(api_key=API_KEY, api_base=sandbox.url, timeout_seconds=2, page_size=2)
    for n in range(4):
        provider.create_refund(_request(f"refund:order-1:r{n}", amount_minor=100))
    planted = sandbox.plant_refund(charge="ch_1", amount=100, metadata={"action_id": ACTION})
    provider.create_refund(_request(amount_minor=100))

    mine = provider.find_refunds(charge="ch_1", action_id=ACTION)
    assert [r.id for r in mine][1] == planted["id"]
    assert len(mine) == 2  # the duplicate is reported, not hidden
    everything = provider.find_refunds(charge="ch_1")
    assert len(everything) == 6
    assert len({r.id for r in everything}) == 6


def test_find_refunds_misses_a_refund_until_the_visibility_delay_has_passed(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    sandbox.configure(lookup_visibility_delay_seconds=10)
    created = provider.create_refund(_request())
    assert provider.find_refunds(charge="ch_1", action_id=ACTION) == []
    assert provider.get_refund(created.id).id == created.id
    sandbox.advance_clock(11)
    assert [r.id for r in provider.find_refunds(charge="ch_1", action_id=ACTION)] == [created.id]


def test_find_refunds_on_a_missing_charge_is_an_authoritative_not_found(
    provider: StripeProvider, sandbox: SandboxClient
) -> None:
    with pytest.raises(NotFoundError):
        provider.find_refunds(charge="ch_missing")


def test_iter_ledger_lists_every_refund_on_every_charge(sandbox: SandboxClient) -> None:
    provider = StripeProvider(api_key=API_KEY, api_base=sandbox.url, timeout_seconds=2, page_size=3)
    sandbox.seed_charge("ch_1", 5000)
    sandbox.seed_charge("ch_2", 5000, "usd")
    created = [provider.create_refund(_request(f"refund:a:{n}", amount_minor=100)).id for n in range(4)]
    created += [
        provider.create_refund(_request(f"refund:b:{n}", charge="ch_2", currency="usd", amount_minor=100)).id
        for n in range(3)
    ]
    assert [r.id for r in provider.iter_ledger()] == created[::-1]


def test_a_resend_after_key_retention_creates_a_duplicate_which_the_ledger_shows(
    provider: StripeProvider, sandbox: SandboxClient, charge: Any
) -> None:
    """Why section 7 allows a retry past retention only after an authoritative not-found."""
    sandbox.configure(key_retention_seconds=3600)
    first = provider.create_refund(_request())
    sandbox.advance_clock(3601)
    second = provider.create_refund(_request())
    assert second.id != first.id
    assert [r.action_id for r in provider.iter_ledger()] == [ACTION, ACTION]


def test_the_ledger_lists_one_span_of_creation_times_and_pages_inside_it(
    sandbox: SandboxClient, charge: Any
) -> None:
    """The audit's windows: created[gte] and created[lt] bound the list, and starting_after
    pages inside the bounds without leaving them."""
    provider = StripeProvider(api_key=API_KEY, api_base=sandbox.url, timeout_seconds=2, page_size=2)
    created_at: dict[str, int] = {}
    for hour in range(3):
        for _ in range(3):
            refund = sandbox.plant_refund(charge="ch_1", amount=100, metadata={"action_id": f"refund:h{hour}"})
            created_at[refund["id"]] = refund["created"]
        sandbox.advance_clock(3600)
    second_hour = sorted(created_at.values())[3]

    window = list(provider.iter_ledger(created_from=second_hour, created_before=second_hour + 3600))

    assert sorted(r.id for r in window) == sorted(i for i, at in created_at.items() if at == second_hour)
    assert {r.metadata["action_id"] for r in window} == {"refund:h1"}
    assert len(list(provider.iter_ledger(created_before=second_hour))) == 3
    assert len(list(provider.iter_ledger(created_from=second_hour))) == 6
    assert len(list(provider.iter_ledger())) == 9


def test_the_sandbox_refuses_a_created_filter_it_does_not_know(sandbox: SandboxClient, charge: Any) -> None:
    response = sandbox.get("/v1/refunds", **{"created[after]": "1"})
    assert response.status_code == 400
    assert "created[after]" in response.json()["error"]["message"]
