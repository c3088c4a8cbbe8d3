"""What a receiver's answer means for an action: the one place where answers map to states.

DESIGN.md section 6:

| receiver answer                                                  | state        |
|------------------------------------------------------------------|--------------|
| created, status succeeded                                        | SUCCEEDED    |
| created, status pending (or requires_action)                     | SETTLING     |
| created, status failed or canceled                               | FAILED_FINAL |
| validation error proving nothing was and nothing will be executed | FAILED_FINAL |
| an error that may mean an earlier attempt already succeeded      | UNKNOWN      |
| idempotency key reused with different parameters                 | NEEDS_REVIEW |
| key in use, rate limited, 5xx, timeout, connection dropped       | UNKNOWN      |
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from actions.providers.base import (
    AmbiguousError,
    DefinitiveError,
    IdempotencyMismatchError,
    NotFoundError,
    ProviderError,
    ProviderRefund,
    RefundStatus,
)


class Outcome(enum.Enum):
    SUCCEEDED = "succeeded"
    PENDING = "pending"
    FAILED_FINAL = "failed_final"
    UNKNOWN = "unknown"
    NEEDS_REVIEW = "needs_review"


@dataclass(frozen=True)
class Answer:
    """A receiver's answer to one call, with what the console concludes from it."""

    outcome: Outcome
    refund: ProviderRefund | None = None
    error: ProviderError | None = None

    @property
    def provider_reference(self) -> str:
        return self.refund.id if self.refund is not None else ""

    def response_json(self) -> dict[str, Any] | None:
        return dict(self.refund.raw) if self.refund is not None else None

    def error_json(self) -> dict[str, Any] | None:
        if self.error is None:
            return None
        return {
            "type": type(self.error).__name__,
            "code": self.error.code,
            "http_status": self.error.http_status,
            "message": self.error.message,
            "raw": self.error.raw,
        }

    def summary(self) -> str:
        if self.refund is not None:
            return f"refund {self.refund.id} {self.refund.status}"
        assert self.error is not None
        return f"{type(self.error).__name__}: {self.error}"


def outcome_of_refund_status(status: RefundStatus) -> Outcome:
    if status == RefundStatus.SUCCEEDED:
        return Outcome.SUCCEEDED
    if status in (RefundStatus.FAILED, RefundStatus.CANCELED):
        return Outcome.FAILED_FINAL
    # pending and requires_action: the receiver has it; its final status comes later.
    return Outcome.PENDING


def answer_from_refund(refund: ProviderRefund) -> Answer:
    return Answer(outcome=outcome_of_refund_status(refund.status), refund=refund)


def answer_from_submission_error(error: ProviderError) -> Answer:
    """Classify an error raised by create_refund."""
    if isinstance(error, IdempotencyMismatchError):
        return Answer(outcome=Outcome.NEEDS_REVIEW, error=error)
    if isinstance(error, AmbiguousError):
        return Answer(outcome=Outcome.UNKNOWN, error=error)
    if isinstance(error, DefinitiveError | NotFoundError):
        return Answer(outcome=Outcome.FAILED_FINAL, error=error)
    # An error type this table does not know proves nothing: treat it as ambiguous.
    return Answer(outcome=Outcome.UNKNOWN, error=error)
