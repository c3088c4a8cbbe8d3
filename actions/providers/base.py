"""The contract between the console and a payment provider (the receiver of a refund).

Plain Python with no Django import, so workers, tests and the sandbox can all use it.

The error classes are the heart of the contract. Each one tells the caller what it may conclude
about the outside world, and the console maps them to states in one place (docs/architecture.md section 6):

- ``DefinitiveError``: the receiver authoritatively refused; nothing was executed and nothing will
  be. Safe to record as FAILED_FINAL.
- ``AmbiguousError``: the request may or may not have taken effect. Never retried blindly; the
  action goes to UNKNOWN and reconciliation asks the receiver.
- ``IdempotencyMismatchError``: the key was already used with different parameters. That means the
  payload changed under a stable key, which is a bug, so the action goes to NEEDS_REVIEW.
- ``NotFoundError``: a lookup authoritatively found nothing.
- ``LookupFailed``: a lookup could not tell (network, 5xx, rate limit). It subclasses
  ``AmbiguousError`` because it carries the same meaning ("the receiver's state is not known"),
  but it is raised only by the lookup methods, so reconciliation can catch it narrowly and stay in
  UNKNOWN without ever confusing it with the outcome of a create.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "IDEMPOTENCY_KEY_MAX_LENGTH",
    "REFUND_REASONS",
    "AmbiguousError",
    "ConfigurationError",
    "CreateRefund",
    "DefinitiveError",
    "IdempotencyMismatchError",
    "LookupFailed",
    "NotFoundError",
    "Provider",
    "ProviderError",
    "ProviderGuarantees",
    "ProviderRefund",
    "RefundStatus",
    "retry_after_seconds",
    "validate_idempotency_key",
]

# Stripe rejects longer Idempotency-Key headers; docs/architecture.md section 3 checks keys against it.
IDEMPOTENCY_KEY_MAX_LENGTH = 255

# Letters, digits and ``: _ . -``: enough for ids like ``refund:order-4821:request-3``, and safe in
# an HTTP header, a URL, a log line and a metadata value without any escaping.
_IDEMPOTENCY_KEY_CHARSET = re.compile(r"[A-Za-z0-9:_.\-]+")

# The only values Stripe accepts for a refund's ``reason``. A free-text reason belongs in metadata.
REFUND_REASONS: frozenset[str] = frozenset({"duplicate", "fraudulent", "requested_by_customer"})

# Stripe's metadata limits; checking them here turns a remote rejection into a local ValueError.
_METADATA_MAX_KEYS = 50
_METADATA_KEY_MAX_LENGTH = 40
_METADATA_VALUE_MAX_LENGTH = 500

_CURRENCY = re.compile(r"[a-z]{3}")


def validate_idempotency_key(key: str) -> None:
    """Raise ``ValueError`` naming the problem unless ``key`` is acceptable to every receiver."""
    if not isinstance(key, str):
        raise ValueError(f"idempotency key must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError("idempotency key must not be empty")
    if len(key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise ValueError(f"idempotency key is {len(key)} characters long; the limit is {IDEMPOTENCY_KEY_MAX_LENGTH}")
    if not _IDEMPOTENCY_KEY_CHARSET.fullmatch(key):
        bad = sorted({c for c in key if not _IDEMPOTENCY_KEY_CHARSET.fullmatch(c)})
        raise ValueError(f"idempotency key contains characters outside [A-Za-z0-9:_.-]: {''.join(bad)!r}")


@dataclass(frozen=True)
class ProviderGuarantees:
    """What a receiver promises, which decides what reconciliation may conclude (section 7)."""

    # The receiver executes a request at most once per key and replays the stored answer.
    honours_idempotency_keys: bool
    # How long the receiver remembers a key. Past it, a resend with the same key can execute
    # again, so only an authoritative not-found allows a retry. None: no keys, or kept forever
    # (read together with honours_idempotency_keys).
    key_retention: timedelta | None
    # The receiver can be asked whether an effect exists (by id, or by our action id).
    supports_lookup: bool
    # A lookup that finds nothing proves nothing exists (once the visibility delay has passed).
    lookup_authoritative: bool
    # How long after creation an effect may still be missing from list/search results.
    lookup_visibility_delay: timedelta


@dataclass(frozen=True)
class CreateRefund:
    """One refund request, exactly as it goes to the receiver, validated on construction.

    Validation here raises ``ValueError`` (a bug in the caller) before anything leaves the process,
    so a malformed request can never reach the receiver and come back as an ambiguous answer.
    """

    idempotency_key: str
    charge: str
    amount_minor: int
    currency: str  # lower-case ISO 4217, as Stripe writes it
    metadata: dict[str, str]  # must contain "action_id"
    reason: str | None = None

    def __post_init__(self) -> None:
        validate_idempotency_key(self.idempotency_key)
        if not isinstance(self.charge, str) or not self.charge:
            raise ValueError("charge must be a non-empty string")
        if isinstance(self.amount_minor, bool) or not isinstance(self.amount_minor, int):
            raise ValueError(f"amount_minor must be an int, not {type(self.amount_minor).__name__}")
        if self.amount_minor <= 0:
            raise ValueError(f"amount_minor must be positive, got {self.amount_minor}")
        if not isinstance(self.currency, str) or not _CURRENCY.fullmatch(self.currency):
            raise ValueError(f"currency must be a lower-case three-letter ISO code, got {self.currency!r}")
        if self.reason is not None and self.reason not in REFUND_REASONS:
            raise ValueError(f"reason must be one of {sorted(REFUND_REASONS)} or None, got {self.reason!r}")
        _validate_metadata(self.metadata)
        # A private copy, so the caller mutating its dict cannot change a request in flight.
        object.__setattr__(self, "metadata", dict(self.metadata))

    @property
    def action_id(self) -> str:
        return self.metadata["action_id"]


def _validate_metadata(metadata: dict[str, str]) -> None:
    if not isinstance(metadata, dict):
        raise ValueError(f"metadata must be a dict, not {type(metadata).__name__}")
    if not metadata.get("action_id"):
        # Reconciliation finds an effect by the action id in the receiver's metadata; a refund
        # without it could never be matched to its action.
        raise ValueError('metadata must contain a non-empty "action_id"')
    if len(metadata) > _METADATA_MAX_KEYS:
        raise ValueError(f"metadata has {len(metadata)} keys; the limit is {_METADATA_MAX_KEYS}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"metadata keys and values must be strings: {key!r}={value!r}")
        if not key or len(key) > _METADATA_KEY_MAX_LENGTH:
            raise ValueError(f"metadata key {key!r} must be 1 to {_METADATA_KEY_MAX_LENGTH} characters")
        if len(value) > _METADATA_VALUE_MAX_LENGTH:
            raise ValueError(f"metadata value for {key!r} is longer than {_METADATA_VALUE_MAX_LENGTH}")


class RefundStatus(StrEnum):
    """Stripe's refund statuses. Only succeeded, failed and canceled are final."""

    SUCCEEDED = "succeeded"
    PENDING = "pending"
    FAILED = "failed"
    CANCELED = "canceled"
    REQUIRES_ACTION = "requires_action"

    @property
    def is_final(self) -> bool:
        return self in (RefundStatus.SUCCEEDED, RefundStatus.FAILED, RefundStatus.CANCELED)


@dataclass(frozen=True)
class ProviderRefund:
    """A refund as the receiver reports it. ``raw`` is the receiver's JSON, kept as evidence."""

    id: str
    charge: str
    amount_minor: int
    currency: str
    status: RefundStatus
    metadata: dict[str, str]
    created: int  # seconds since the epoch, as the receiver stamped it
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def action_id(self) -> str | None:
        return self.metadata.get("action_id")


class ProviderError(Exception):
    """Base of every error a provider raises. ``raw`` is the receiver's error JSON, if any."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        http_status: int | None = None,
        raw: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.http_status = http_status
        self.raw = raw
        # Seconds the receiver asked us to wait before calling again (its Retry-After header).
        self.retry_after = retry_after

    def __str__(self) -> str:
        parts = [self.message]
        if self.code:
            parts.append(f"code={self.code}")
        if self.http_status is not None:
            parts.append(f"http_status={self.http_status}")
        return " ".join(parts) if len(parts) == 1 else f"{parts[0]} ({', '.join(parts[1:])})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(message={self.message!r}, code={self.code!r}, http_status={self.http_status!r})"


class DefinitiveError(ProviderError):
    """The receiver authoritatively refused: nothing was executed and nothing will be."""


class AmbiguousError(ProviderError):
    """The request may or may not have taken effect. Reconcile; never retry blindly."""


class ConfigurationError(AmbiguousError):
    """The receiver refused our credentials or permissions (HTTP 401/403).

    Stripe checks credentials before executing anything, so nothing happened. It is still not a
    DefinitiveError: FAILED_FINAL would release the reservation and send the customer to a remedy
    (store credit) although the refund would succeed once someone fixes the key. As an ambiguous
    error the action waits in UNKNOWN, reconciliation fails the same way, and escalation hands it
    to a person. The subclass lets the console say why.
    """


class IdempotencyMismatchError(ProviderError):
    """The idempotency key was already used with different parameters (a bug: NEEDS_REVIEW)."""


class NotFoundError(ProviderError):
    """A lookup authoritatively found nothing (for example HTTP 404 ``resource_missing``)."""


class LookupFailed(AmbiguousError):
    """A lookup could not tell what exists (network, 5xx, 429): stay UNKNOWN and back off."""


@runtime_checkable
class Provider(Protocol):
    """A payment provider that can create and look up refunds."""

    name: str
    guarantees: ProviderGuarantees

    def create_refund(self, req: CreateRefund) -> ProviderRefund:
        """Create (or, with the same key within retention, replay) one refund.

        Raises DefinitiveError, AmbiguousError, IdempotencyMismatchError. A refund that was
        created with status failed or canceled is returned, not raised: it is the receiver's
        record of the effect.
        """
        ...

    def get_refund(self, refund_id: str) -> ProviderRefund:
        """Fetch one refund by the receiver's id. Raises NotFoundError or LookupFailed."""
        ...

    def find_refunds(self, *, charge: str, action_id: str | None = None) -> list[ProviderRefund]:
        """Every visible refund on ``charge``, optionally only those for ``action_id``.

        Results may miss refunds younger than ``guarantees.lookup_visibility_delay``. Raises
        NotFoundError if the charge does not exist, LookupFailed if the answer is unknown.
        """
        ...

    def iter_ledger(
        self, *, created_from: int | None = None, created_before: int | None = None
    ) -> Iterator[ProviderRefund]:
        """The refunds the receiver created from ``created_from`` up to, not including,
        ``created_before`` (seconds since the epoch; None: no bound), newest first, for audits.
        Raises LookupFailed."""
        ...


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header's delay in seconds, or None. Only the delay-seconds form is read
    (what Stripe and Xero send); an HTTP date or garbage is ignored rather than trusted."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    # Bounded: a hostile or broken header must not park an action for a day.
    return min(max(seconds, 0.0), 3600.0) if seconds == seconds else None
