"""The provider contract: key validation, request validation and the error taxonomy."""

from __future__ import annotations

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
    validate_idempotency_key,
)


def _request(**overrides: Any) -> CreateRefund:
    fields: dict[str, Any] = {
        "idempotency_key": "refund:order-4821:request-3",
        "charge": "ch_1",
        "amount_minor": 1050,
        "currency": "eur",
        "metadata": {"action_id": "refund:order-4821:request-3"},
        "reason": "requested_by_customer",
    }
    fields.update(overrides)
    return CreateRefund(**fields)


def test_it_accepts_a_key_of_exactly_255_characters() -> None:
    validate_idempotency_key("k" * 255)


def test_it_rejects_a_key_of_256_characters_naming_the_limit() -> None:
    with pytest.raises(ValueError, match=r"256 characters.*limit is 255"):
        validate_idempotency_key("k" * 256)


def test_it_accepts_the_action_id_shape_from_the_design() -> None:
    validate_idempotency_key("refund:order-4821:request-3")
    validate_idempotency_key("a.b_c-D:9")


def test_it_rejects_an_empty_key() -> None:
    with pytest.raises(ValueError, match="empty"):
        validate_idempotency_key("")


@pytest.mark.parametrize("key", ["has space", "slash/inside", "émoji", "new\nline", "a;b"])
def test_it_rejects_keys_with_unsafe_characters_and_names_them(key: str) -> None:
    with pytest.raises(ValueError, match="characters outside"):
        validate_idempotency_key(key)


def test_a_refund_request_validates_its_key_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="limit is 255"):
        _request(idempotency_key="k" * 256)


def test_a_refund_request_needs_an_action_id_in_metadata() -> None:
    with pytest.raises(ValueError, match="action_id"):
        _request(metadata={"order": "4821"})


@pytest.mark.parametrize("amount", [0, -1, True, 10.5])
def test_a_refund_request_needs_a_positive_integer_amount(amount: Any) -> None:
    with pytest.raises(ValueError, match="amount_minor"):
        _request(amount_minor=amount)


@pytest.mark.parametrize("currency", ["EUR", "eu", "euro", ""])
def test_a_refund_request_needs_a_lower_case_currency_like_stripe(currency: str) -> None:
    with pytest.raises(ValueError, match="currency"):
        _request(currency=currency)


def test_a_refund_request_only_takes_stripes_reasons() -> None:
    assert _request(reason=None).reason is None
    with pytest.raises(ValueError, match="reason"):
        _request(reason="damaged in transit")


def test_a_refund_request_enforces_stripes_metadata_limits() -> None:
    with pytest.raises(ValueError, match="longer than 500"):
        _request(metadata={"action_id": "a", "note": "x" * 501})
    with pytest.raises(ValueError, match="1 to 40"):
        _request(metadata={"action_id": "a", "k" * 41: "v"})


def test_a_refund_request_keeps_its_own_copy_of_the_metadata() -> None:
    metadata = {"action_id": "refund:1"}
    request = _request(metadata=metadata)
    metadata["action_id"] = "refund:2"
    assert request.action_id == "refund:1"


def test_lookup_failures_are_ambiguous_but_distinguishable_from_create_errors() -> None:
    assert issubclass(LookupFailed, AmbiguousError)
    assert issubclass(ConfigurationError, AmbiguousError)
    for cls in (DefinitiveError, IdempotencyMismatchError, NotFoundError):
        assert not issubclass(cls, AmbiguousError)
        assert issubclass(cls, ProviderError)
    assert not issubclass(AmbiguousError, DefinitiveError)


def test_a_provider_error_carries_the_receivers_answer() -> None:
    error = DefinitiveError("No such charge", code="resource_missing", http_status=400, raw={"error": {}})
    assert (error.message, error.code, error.http_status, error.raw) == (
        "No such charge",
        "resource_missing",
        400,
        {"error": {}},
    )
    assert "resource_missing" in str(error)
    assert "400" in str(error)


def test_only_succeeded_failed_and_canceled_are_final() -> None:
    assert {s for s in RefundStatus if s.is_final} == {
        RefundStatus.SUCCEEDED,
        RefundStatus.FAILED,
        RefundStatus.CANCELED,
    }
