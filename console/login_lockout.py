"""The login lockout: a username from one address, plus a higher ceiling per address.

django-axes keys its lockout on ``AXES_LOCKOUT_PARAMETERS``; here that is the username and the
address together, so that an attacker guessing a colleague's password locks out only that
username from the attacker's address, never the colleague who logs in from the same office
(keyed on either one alone, the colleague was locked out too).

Spraying guesses across many usernames from one address is still stopped, by a separate and
higher ceiling: ``LOGIN_ADDRESS_FAILURE_LIMIT`` failures from the address within the cool-off
lock out every login from it. Axes can key on several combinations at once, but it weighs them
all against one limit (the highest count of any combination), and the address's count is
always at least the pair's; so the address's own, higher limit is this handler's one addition.
"""

from __future__ import annotations

from typing import Any

from axes.attempts import get_cool_off_threshold
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Sum
from django.http import HttpRequest


def address_failures(request: HttpRequest) -> int:
    """Failed logins from the request's address within the cool-off, across every username."""
    address = getattr(request, "axes_ip_address", None)
    if not address:
        return 0
    total = AccessAttempt.objects.filter(
        ip_address=address, attempt_time__gte=get_cool_off_threshold(request)
    ).aggregate(total=Sum("failures_since_start"))["total"]
    return int(total or 0)


class LoginLockoutHandler(AxesDatabaseHandler):
    """Axes' database handler, with the per-address ceiling on top of its per-pair count."""

    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        """The failures of this username from this address, or, once the address has reached
        its own ceiling, at least the failure limit: both the check before a login and the
        lockout after a failure compare this number with the one limit."""
        failures = int(super().get_failures(request, credentials))
        if address_failures(request) >= settings.LOGIN_ADDRESS_FAILURE_LIMIT:
            return max(failures, int(get_failure_limit(request, credentials)))
        return failures
