"""The Stripe adapter's error mapping, parsing and declared guarantees, without a sandbox."""

from __future__ import annotations

from datetime import timedelta

import pytest
import stripe

from actions.providers.base import (
    AmbiguousError,
    CreateRefund,
    DefinitiveError,
    IdempotencyMismatchError,
    LookupFailed,
    NotFoundError,
    Provider,
    ProviderError,
    ProviderGuarantees,
    RefundStatus,
)
from actions.providers.stripe_adapter import (
    StripeProvider,
    map_create_error,
    map_lookup_error,
    refund_from_stripe_json,
)
from tests.providers.sandbox_client import API_KEY

ACTION = "refund:order-4821:request-3"


def _request() -> CreateRefund:
    return CreateRefund(
        idempotency_key=ACTION,
        charge="ch_1",
        amount_minor=1000,
        currency="eur",
        metadata={"action_id": ACTION},
    )


def _assert_ambiguous_not_definitive(error: ProviderError) -> None:
    assert isinstance(error, AmbiguousError)
    assert not isinstance(error, (DefinitiveError, IdempotencyMismatchError))


def test_it_declares_stripes_guarantees() -> None:
    provider = StripeProvider(
        api_key=API_KEY,
        api_base="http://127.0.0.1:9",
        key_retention=timedelta(hours=24),
        lookup_visibility_delay=timedelta(seconds=7),
    )
    assert isinstance(provider, Provider)
    assert provider.name == "stripe"
    assert provider.guarantees == ProviderGuarantees(
        honours_idempotency_keys=True,
        key_retention=timedelta(hours=24),
        supports_lookup=True,
        lookup_authoritative=True,
        lookup_visibility_delay=timedelta(seconds=7),
    )


def test_it_requires_an_explicit_api_base_and_key() -> None:
    with pytest.raises(ValueError, match="api_base"):
        StripeProvider(api_key=API_KEY, api_base="")
    with pytest.raises(ValueError, match="api_key"):
        StripeProvider(api_key="", api_base="http://127.0.0.1:9")


def test_a_refused_connection_is_ambiguous() -> None:
    # Port 9 (discard) is closed on a test machine: the connection is refused outright.
    provider = StripeProvider(api_key=API_KEY, api_base="http://127.0.0.1:9", timeout_seconds=1)
    with pytest.raises(AmbiguousError):
        provider.create_refund(_request())
    with pytest.raises(LookupFailed):
        provider.get_refund("re_1")


def test_it_parses_a_stripe_refund_object() -> None:
    refund = refund_from_stripe_json(
        {
            "id": "re_1",
            "object": "refund",
            "amount": 1050,
            "charge": {"id": "ch_1", "object": "charge"},
            "created": 1700000000,
            "currency": "EUR",
            "metadata": {"action_id": ACTION},
            "status": "requires_action",
        }
    )
    assert (refund.id, refund.charge, refund.amount_minor, refund.currency) == (
        "re_1",
        "ch_1",
        1050,
        "eur",
    )
    assert refund.status is RefundStatus.REQUIRES_ACTION
    assert refund.action_id == ACTION
    assert refund.raw["object"] == "refund"


def test_it_refuses_to_guess_an_unknown_refund_status() -> None:
    with pytest.raises(ValueError):
        refund_from_stripe_json(
            {
                "id": "re_1",
                "amount": 1,
                "charge": "ch_1",
                "created": 1,
                "currency": "eur",
                "status": "reversed",
            }
        )


def _invalid(message: str, code: str | None, status: int = 400) -> stripe.InvalidRequestError:
    body = {"error": {"type": "invalid_request_error", "message": message, "code": code}}
    return stripe.InvalidRequestError(message, "amount", code, None, status, body)


def test_it_treats_stripes_unrefunded_amount_message_as_ambiguous_even_without_a_code() -> None:
    error = map_create_error(
        _invalid("Refund amount ($20.00) is greater than unrefunded amount on charge ($10.00)", None)
    )
    _assert_ambiguous_not_definitive(error)


def test_it_treats_other_validation_errors_as_definitive() -> None:
    error = map_create_error(_invalid("Invalid positive integer", "parameter_invalid_integer"))
    assert isinstance(error, DefinitiveError)
    assert (error.code, error.http_status) == ("parameter_invalid_integer", 400)


def test_it_treats_an_unknown_kind_of_stripe_error_as_ambiguous() -> None:
    card = stripe.CardError("declined", None, "card_declined", None, 402, None)
    _assert_ambiguous_not_definitive(map_create_error(card))
    _assert_ambiguous_not_definitive(map_create_error(stripe.APIError("boom", None, 502)))


def test_only_resource_missing_is_an_authoritative_not_found() -> None:
    not_found = map_lookup_error(_invalid("No such refund", "resource_missing", 404))
    assert isinstance(not_found, NotFoundError)
    assert isinstance(map_lookup_error(_invalid("Invalid limit", "parameter_invalid")), LookupFailed)
    assert isinstance(map_lookup_error(stripe.APIError("boom", None, 500)), LookupFailed)
