"""Step-up for high-value approvals: a second factor confirmed within the last few minutes.

A stolen password alone must not approve a large refund. Approving more than the currency's
``STEP_UP_THRESHOLDS`` amount needs a TOTP code (django-otp) confirmed within
``STEP_UP_MAX_AGE_SECONDS``. The confirmation time lives in the person's session, so that a
code typed on one device does not unlock another session of the same account.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django_otp import devices_for_user

# Session key: when this session last confirmed a second factor (epoch seconds).
STEP_UP_SESSION_KEY = "console_step_up_at"


def step_up_threshold(*, currency: str) -> Decimal | None:
    return settings.STEP_UP_THRESHOLDS.get(currency)


def step_up_needed(*, amount: Decimal, currency: str) -> bool:
    threshold = step_up_threshold(currency=currency)
    return threshold is not None and amount > threshold


def step_up_refusal(
    *, user: Any, amount: Decimal, currency: str, verified_at: float | None, now: float
) -> str | None:
    """Why ``user`` may not approve ``amount currency`` now without a fresh second factor, or None.

    ``verified_at`` is when the deciding session last confirmed a code (``step_up_verified_at``
    reads it from a request); ``now`` is epoch seconds.
    """
    if not step_up_needed(amount=amount, currency=currency):
        return None
    threshold = step_up_threshold(currency=currency)
    has_device = any(True for _ in devices_for_user(user, confirmed=True))
    if not has_device:
        return (
            f"Approving more than {threshold} {currency} needs a second factor, and this account has none: set up an "
            "authenticator app on your account page first."
        )
    if verified_at is None or now - verified_at > settings.STEP_UP_MAX_AGE_SECONDS:
        minutes = max(1, settings.STEP_UP_MAX_AGE_SECONDS // 60)
        return (
            f"Approving more than {threshold} {currency} needs a code from your authenticator app, confirmed within "
            f"the last {minutes} minutes."
        )
    return None


def step_up_verified_at(request: HttpRequest) -> float | None:
    value = request.session.get(STEP_UP_SESSION_KEY)
    return float(value) if value is not None else None
