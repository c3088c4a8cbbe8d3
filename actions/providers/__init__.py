"""Payment providers: the contract (``base``), money conversion, Stripe, and a sandbox.

Plain Python with no Django import. ``stripe_adapter`` is not imported here so that the sandbox,
which needs only the standard library, does not pull in the stripe package.
"""

from __future__ import annotations

from actions.providers.base import (
    AmbiguousError,
    ConfigurationError,
    CreateRefund,
    DefinitiveError,
    IdempotencyMismatchError,
    LookupFailed,
    NotFoundError,
    Provider,
    ProviderError,
    ProviderGuarantees,
    ProviderRefund,
    RefundStatus,
    validate_idempotency_key,
)
from actions.providers.money import currency_exponent, from_minor_units, to_minor_units

__all__ = [
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
    "currency_exponent",
    "from_minor_units",
    "to_minor_units",
    "validate_idempotency_key",
]
