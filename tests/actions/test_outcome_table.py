"""The outcome table (docs/architecture.md section 6), row by row, without a database.

``actions/outcomes.py`` is the one place where a receiver's answer becomes a state. Every other
test reaches it through a dispatch or a reconciliation pass and so only sees the rows its scenario
happens to produce; these tests pin every row, and the evidence an attempt keeps of each answer.
"""

from __future__ import annotations

import pytest

from actions.kinds.base import Answer, Outcome
from actions.kinds.refund.contract import answer_from_refund, answer_from_submission_error, outcome_of_refund_status
from actions.providers.base import (
    AmbiguousError,
    ConfigurationError,
    DefinitiveError,
    IdempotencyMismatchError,
    LookupFailed,
    NotFoundError,
    ProviderError,
    ProviderRefund,
    RefundStatus,
)


def refund(status: RefundStatus, refund_id: str = "re_123") -> ProviderRefund:
    return ProviderRefund(
        id=refund_id,
        charge="ch_1",
        amount_minor=2000,
        currency="eur",
        status=status,
        metadata={"action_id": "act_1"},
        created=1_700_000_000,
        raw={"id": refund_id, "status": str(status), "amount": 2000},
    )


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (RefundStatus.SUCCEEDED, Outcome.SUCCEEDED),
        (RefundStatus.PENDING, Outcome.PENDING),
        (RefundStatus.REQUIRES_ACTION, Outcome.PENDING),
        (RefundStatus.FAILED, Outcome.FAILED_FINAL),
        (RefundStatus.CANCELED, Outcome.FAILED_FINAL),
    ],
)
def test_a_created_refund_maps_to_the_state_its_status_proves(status: RefundStatus, outcome: Outcome) -> None:
    """Invariant 2: only a succeeded refund is SUCCEEDED; failed or canceled is final; pending and
    requires_action wait in SETTLING. Every status of the receiver has its row."""
    assert set(RefundStatus) == {
        RefundStatus.SUCCEEDED,
        RefundStatus.PENDING,
        RefundStatus.REQUIRES_ACTION,
        RefundStatus.FAILED,
        RefundStatus.CANCELED,
    }, "a new receiver status needs its row in the table"
    assert outcome_of_refund_status(status) == outcome
    answer = answer_from_refund(refund(status))
    assert answer.outcome == outcome
    assert answer.effect is not None and answer.effect.status == status
    assert answer.error is None


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        # The key was reused with different parameters: a bug, a person must look.
        (
            IdempotencyMismatchError("keys for idempotent requests can only be used with the same parameters"),
            Outcome.NEEDS_REVIEW,
        ),
        # May or may not have happened: reconcile, never retry blindly.
        (AmbiguousError("read timed out", code="timeout"), Outcome.UNKNOWN),
        (ConfigurationError("invalid API key", http_status=401), Outcome.UNKNOWN),
        (LookupFailed("502 from the receiver", http_status=502), Outcome.UNKNOWN),
        # Proves nothing was executed and nothing will be.
        (DefinitiveError("amount exceeds the charge", code="amount_too_large", http_status=400), Outcome.FAILED_FINAL),
        (NotFoundError("no such charge", code="resource_missing", http_status=404), Outcome.FAILED_FINAL),
        # An error the table does not know proves nothing.
        (ProviderError("something new"), Outcome.UNKNOWN),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else value.name,
)
def test_a_submission_error_maps_to_the_state_it_proves(error: ProviderError, outcome: Outcome) -> None:
    """Invariants 1 and 7: an error that may hide an executed refund is UNKNOWN (never FAILED_FINAL,
    which would release the reservation and open a remedy beside a refund that happened); a
    reused key with other parameters is NEEDS_REVIEW at once."""
    answer = answer_from_submission_error(error)
    assert answer.outcome == outcome
    assert answer.error is error
    assert answer.effect is None


def test_an_answer_with_a_refund_keeps_the_receivers_record_as_evidence() -> None:
    answer = answer_from_refund(refund(RefundStatus.SUCCEEDED, "re_77"))
    assert answer.reference == "re_77"
    assert answer.response_json() == {"id": "re_77", "status": "succeeded", "amount": 2000}
    assert answer.error_json() is None
    assert answer.summary() == "re_77 succeeded"


def test_the_stored_response_is_a_copy_not_the_receivers_own_dict() -> None:
    original = refund(RefundStatus.PENDING)
    stored = answer_from_refund(original).response_json()
    assert stored is not None
    stored["status"] = "tampered"
    assert original.raw["status"] == "pending"


def test_an_answer_with_an_error_keeps_the_error_as_evidence() -> None:
    error = DefinitiveError(
        "amount exceeds the charge", code="amount_too_large", http_status=400, raw={"error": {"type": "invalid"}}
    )
    answer = answer_from_submission_error(error)
    assert answer.reference == ""
    assert answer.response_json() is None
    assert answer.error_json() == {
        "type": "DefinitiveError",
        "code": "amount_too_large",
        "http_status": 400,
        "message": "amount exceeds the charge",
        "raw": {"error": {"type": "invalid"}},
    }
    assert answer.summary() == "DefinitiveError: amount exceeds the charge (code=amount_too_large, http_status=400)"


def test_an_answer_without_a_refund_or_an_error_cannot_be_summarised() -> None:
    with pytest.raises(AssertionError):
        Answer(Outcome.UNKNOWN).summary()
